/**
 * The order-body Lua filter (envoy/order-body-lua.ts) and the per-route config that enables it.
 */
import { errorJsonPrefix, errorJsonWithId } from '../../authz/src/common/errors.ts';
import { ORDER_PAYLOAD_AT_METADATA_KEY, ORDER_PAYLOAD_METADATA_KEY } from '../../authz/src/common/contract.ts';
import { orderBodyLua } from '../order-body-lua.ts';
import { typedConfig, type TypedConfig, type TypedExtension } from './common.ts';
import { FILTER, ORDER_BODY_LUA, TYPE_URL } from './names.ts';

/**
 * What a client gets when the order-body filter cannot produce the payload (never expected): this
 * prefix, then the request's id as every error body carries it (orderBodyFailure).
 */
export const ORDER_BODY_FAILURE_PREFIX = errorJsonPrefix('service_unavailable', 'order body could not be decoded; the order was not sent');

/** The whole failure body for a request whose x-request-id is `requestId`. */
export function orderBodyFailure(requestId: string | undefined): string {
  return errorJsonWithId(ORDER_BODY_FAILURE_PREFIX, requestId);
}

/** Disabled in the chain; the orders route enables it by naming its source (orderBodyPerRoute). */
export function orderBodyFilter(): TypedExtension {
  return {
    name: FILTER.lua,
    disabled: true,
    typed_config: typedConfig(TYPE_URL.lua, {
      source_codes: { [ORDER_BODY_LUA]: { inline_string: orderBodyLua(FILTER.extAuthz, ORDER_PAYLOAD_METADATA_KEY, ORDER_PAYLOAD_AT_METADATA_KEY, ORDER_BODY_FAILURE_PREFIX) } },
      // The script rewrites headers after ext_authz allowed the route; it must not be re-chosen.
      clear_route_cache: false,
    }),
  };
}

export function orderBodyPerRoute(): TypedConfig {
  return typedConfig(TYPE_URL.luaPerRoute, { name: ORDER_BODY_LUA });
}
