/**
 * The Envoy renderer: structural facts of the rendered bootstrap for each config variant, the
 * real Envoy 1.40 accepting every variant (`envoy --mode validate`), and a live Envoy proving
 * the behaviour the config exists for (JSON local replies, per-IP limits, no order retries).
 *
 *   scripts/node --test envoy/test/render.test.ts
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import http from 'node:http';
import http2 from 'node:http2';
import { connect } from 'node:net';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { parse } from 'yaml';
import { loadConfig, type Config, type Env } from '../../authz/src/common/config.ts';
import { ALLOW, denialBody, deny, geoDenial, type Decision } from '../../authz/src/authz/decision.ts';
import { ERROR_MESSAGE, ERROR_STATUS } from '../../authz/src/common/errors.ts';
import { CONTEXT_EXTENSION, HEADER_PHASE } from '../../authz/src/common/contract.ts';
import type { AuthzInput } from '../../authz/src/authz/codec/request.ts';
import { orderAllow, parseOrder } from '../../authz/src/authz/stages/order.ts';
import { ORDER_UPSTREAM_HEADERS } from '../order-body-lua.ts';
import { createGrpcServer, type AuthzGrpcServer } from '../../authz/src/authz/grpc-server.ts';
import { envoyBinary, REPO_ROOT, validateBootstrap } from '../envoy-bin.ts';
import { main as renderCli, BOOTSTRAP_FILE, SDS_FILE } from '../render-cli.ts';
import {
  AUTHZ_HEADERS, BAD_REQUEST_CODE, CLIENT_CERT_SECRET, CLIENT_IP_HEADER, CLIENT_PORT_HEADER, CLUSTER, FILTER, LISTENER, ORDER_BODY_FAILURE_PREFIX, orderBodyFailure, ORDER_BODY_LUA, ROUTE,
  REQUEST_ID_FORMAT, XFF_POLICY, canonicalIp, duration, renderEnvoy, xffMessage, type JsonObject, type RenderOptions,
  FIRST_REQUEST_TIMEOUT_MS, MAX_DOWNSTREAM_CONNECTIONS, TYPE_URL,
} from '../render.ts';
import {
  at, certPaths, clusterNamed, hcmOf, perFilter, httpFilters, listenerNamed, makeCerts, request, routeNamed, routesOf, startBackendStub, startEnvoy,
  startMarketStub, tempDir, type BackendMode, type LiveEnvoy, type TestCerts, type Upstream,
} from './helpers.ts';
import { FIXED_HEAP_MONITOR } from '../render/bootstrap.ts';
import { LOCAL_RATE_LIMIT_DESCRIPTOR_CAP } from '../render/budget.ts';
import { ENVOY_NON_HEAP_MB } from '../../authz/src/common/config.ts';

const work = tempDir('edge-envoy-test-');
after(() => work.cleanup());
const certs: TestCerts = certPaths(work.dir);
before(() => { makeCerts(work.dir); });

interface Variant {
  readonly env: Env;
  readonly opts?: Partial<RenderOptions>;
}

const backendEnv = (url: string, san?: string): Env => ({
  ORDER_BACKEND_URL: url,
  ORDER_BACKEND_CA_FILE: certs.caFile,
  EDGE_CLIENT_CERT_FILE: certs.clientCert,
  EDGE_CLIENT_KEY_FILE: certs.clientKey,
  ...(san === undefined ? {} : { ORDER_BACKEND_SAN: san }),
});

const VARIANTS: Record<string, Variant> = {
  'defaults (no order backend)': { env: {} },
  'XFF_NUM_TRUSTED_HOPS=1': { env: { XFF_NUM_TRUSTED_HOPS: '1' } },
  'backend by DNS name with DNS SAN': { env: backendEnv('https://orders.internal.example:9443', 'orders.internal.example') },
  'backend by IP with IP SAN': { env: backendEnv('https://10.20.30.40:9443') },
  'backend by IPv6 literal with IPv6 SAN': { env: backendEnv('https://[::1]:9443', '0:0:0:0:0:0:0:1') },
  'backend by IP with DNS SAN': { env: backendEnv('https://10.20.30.40', 'orders.internal.example') },
  'custom limits and timeouts': {
    env: {
      ...backendEnv('https://orders.internal.example:9443'),
      RPS_PER_IP: '5', RATE_BURST: '7', INGEST_MAX_BYTES: '4096', ORDER_MAX_BYTES: '2048',
      ORDER_BACKEND_TIMEOUT_MS: '2500', ORDER_BACKEND_MAX_CONN_SECS: '60', EDGE_PORT: '18443', ENVOY_ADMIN_PORT: '19999',
      AUTHZ_TIMEOUT_MS: '750',
    },
    opts: { accessLogPath: join(work.dir, 'custom-access.log'), nodeId: 'edge-7' },
  },
  'allowedHeaders=all': { env: {}, opts: { allowedHeaders: 'all' } },
  'INGEST_PORT (ingest on a listener of its own), body timeout and memory limit set': {
    env: {
      ...backendEnv('https://orders.internal.example:9443'),
      INGEST_PORT: '18082', INGEST_BIND_ADDRESS: '0.0.0.0', REQUEST_BODY_TIMEOUT_MS: '3000', ENVOY_MEMORY_LIMIT_MB: '256',
    },
  },
};

function renderVariant(v: Variant, dir: string): { config: Config; opts: RenderOptions; bootstrap: JsonObject; sds: JsonObject | undefined; file: string } {
  const config = loadConfig(v.env);
  const opts: RenderOptions = { sdsPath: join(dir, 'sds.yaml'), ...v.opts };
  const r = renderEnvoy(config, opts);
  const file = join(dir, 'envoy.yaml');
  writeFileSync(file, r.bootstrap);
  if (r.sds !== undefined) writeFileSync(opts.sdsPath, r.sds);
  return {
    config, opts, file,
    bootstrap: parse(r.bootstrap) as JsonObject,
    sds: r.sds === undefined ? undefined : parse(r.sds) as JsonObject,
  };
}

/** Every key named `key` anywhere in `obj`. */
function findKeys(obj: unknown, key: string, out: unknown[] = []): unknown[] {
  if (Array.isArray(obj)) for (const v of obj) findKeys(v, key, out);
  else if (obj !== null && typeof obj === 'object') {
    for (const [k, v] of Object.entries(obj)) {
      if (k === key) out.push(v);
      findKeys(v, key, out);
    }
  }
  return out;
}

type Obj = Record<string, unknown>;

/** The names of the bootstrap's listeners, in order. */
function listenerNames(bootstrap: JsonObject): string[] {
  return (at(bootstrap, 'static_resources.listeners') as Obj[]).map((l) => String(l['name']));
}

// ─── Structure, for every variant ──────────────────────────────────────────────────────────

for (const [name, variant] of Object.entries(VARIANTS)) {
  describe(`rendered bootstrap – ${name}`, () => {
    let r: ReturnType<typeof renderVariant>;
    before(() => {
      const dir = join(work.dir, name.replace(/[^a-z0-9]+/gi, '-'));
      spawnSync('mkdir', ['-p', dir]);
      r = renderVariant(variant, dir);
    });

    test('real Envoy 1.40 accepts it (envoy --mode validate exits 0, no deprecated fields)', () => {
      const v = validateBootstrap(r.file);
      assert.equal(v.exitCode, 0, v.output);
      assert.doesNotMatch(v.output, /deprecated/i);
    });

    const filterNamed = (name: string): Obj => {
      const f = httpFilters(r.bootstrap).find((x) => x['name'] === name);
      assert.ok(f !== undefined, name);
      return f;
    };

    test('filter order: header_mutation → rate limit → XFF guard (trusted hops only) → header phase → ext_authz → order-body Lua → router, on every listener', () => {
      const guard = r.config.xffNumTrustedHops > 0 ? [FILTER.xffGuard] : [];
      for (const l of listenerNames(r.bootstrap)) {
        assert.deepEqual(httpFilters(r.bootstrap, l).map((f) => f['name']),
          [FILTER.headerMutation, FILTER.rateLimit, ...guard, FILTER.headerPhase, FILTER.extAuthz, FILTER.lua, FILTER.router], l);
      }
    });

    test('listener: a connection that sends no request line within FIRST_REQUEST_TIMEOUT_MS is closed (http_inspector, no continue on timeout); connections capped, admin exempt', () => {
      const l = at(r.bootstrap, 'static_resources.listeners[0]') as Obj;
      assert.deepEqual(l['listener_filters'], [{ name: FILTER.httpInspector, typed_config: { '@type': TYPE_URL.httpInspector } }]);
      assert.equal(l['listener_filters_timeout'], duration(FIRST_REQUEST_TIMEOUT_MS));
      assert.equal(l['continue_on_listener_filters_timeout'], false, 'a timed-out connection is closed, not handed to the HCM');
      assert.equal(l['stat_prefix'], 'edge', 'listener.edge.* whatever the port');
      assert.ok(FIRST_REQUEST_TIMEOUT_MS >= 5_000 && FIRST_REQUEST_TIMEOUT_MS <= 15_000, 'seconds, not the 300-s idle timeout');
      // Kept-alive clients between requests keep the connection idle timeout.
      assert.equal(at(hcmOf(r.bootstrap), 'common_http_protocol_options.idle_timeout'), '300s');
      assert.deepEqual(at(r.bootstrap, 'overload_manager.resource_monitors[0].typed_config.max_active_downstream_connections'), MAX_DOWNSTREAM_CONNECTIONS);
      assert.equal(at(r.bootstrap, 'admin.ignore_global_conn_limit'), true);
    });

    test('rate limit: one bucket per client address (IPv4 and IPv4-mapped alike, IPv6 per /64) with RATE_BURST / RPS_PER_IP, and one per IPv6 /48 with PREFIX_BURST / RPS_PER_PREFIX, enforced on 100%', () => {
      const rl = filterNamed(FILTER.rateLimit)['typed_config'] as Obj;
      assert.deepEqual(at(rl, 'descriptors[0].entries'), [{ key: 'client', value: 'v4' }, { key: 'client_ip' }]);
      assert.deepEqual(at(rl, 'descriptors[1].entries'), [{ key: 'client', value: 'v6' }, { key: 'masked_remote_address' }]);
      assert.deepEqual(at(rl, 'descriptors[2].entries'), [{ key: 'prefix', value: 'v6' }, { key: 'masked_remote_address' }]);
      for (const i of [0, 1]) {
        assert.deepEqual(at(rl, `descriptors[${i}].token_bucket`),
          { max_tokens: r.config.rateBurst, tokens_per_fill: r.config.rpsPerIp, fill_interval: '1s' });
      }
      assert.deepEqual(at(rl, 'descriptors[2].token_bucket'), { max_tokens: r.config.prefixBurst, tokens_per_fill: r.config.rpsPerPrefix, fill_interval: '1s' });
      assert.deepEqual([r.config.prefixBurst, r.config.rpsPerPrefix], [5 * r.config.rateBurst, 5 * r.config.rpsPerIp]);
      const actions = (rl['rate_limits'] as { actions: Obj[] }[]).map((x) => x.actions);
      assert.deepEqual(actions[0]![1], { request_headers: { header_name: CLIENT_IP_HEADER, descriptor_key: 'client_ip' } });
      assert.deepEqual(actions[1]![1], { masked_remote_address: { v4_prefix_mask_len: 32, v6_prefix_mask_len: 64 } });
      assert.deepEqual(actions[2]![1], { masked_remote_address: { v4_prefix_mask_len: 32, v6_prefix_mask_len: 48 } });
      // One client descriptor per request (the same header test, expected false then true) and,
      // for IPv6 only, the prefix's.
      assert.deepEqual(actions.map((a) => at(a[0], 'header_value_match.expect_match')), [false, true, true]);
      assert.deepEqual(at(actions[0]![0], 'header_value_match.headers'), [{ name: CLIENT_IP_HEADER, string_match: { contains: ':' } }]);
      assert.deepEqual(at(actions[0]![0], 'header_value_match.headers'), at(actions[1]![0], 'header_value_match.headers'));
      assert.deepEqual(at(actions[0]![0], 'header_value_match.headers'), at(actions[2]![0], 'header_value_match.headers'));
      assert.equal(rl['always_consume_default_token_bucket'], false);
      // The budget's cap (envoy/render/budget.ts; envoy/test/budget.test.ts checks it adds up).
      assert.equal(rl['max_dynamic_descriptors'], LOCAL_RATE_LIMIT_DESCRIPTOR_CAP);
      for (const k of ['filter_enabled', 'filter_enforced']) {
        assert.deepEqual(at(rl, `${k}.default_value`), { numerator: 100, denominator: 'HUNDRED' });
      }
      assert.equal(rl['enable_x_ratelimit_headers'], 'DRAFT_VERSION_03');
      assert.equal(rl['token_bucket'], undefined, 'no shared default bucket');
    });

    test('client address: use_remote_address with XFF_NUM_TRUSTED_HOPS; x-edge-client-ip always overwritten, a mapped address as its IPv4', () => {
      const hcm = hcmOf(r.bootstrap);
      assert.equal(hcm['use_remote_address'], true);
      assert.equal(hcm['xff_num_trusted_hops'], r.config.xffNumTrustedHops);
      assert.equal(hcm['skip_xff_append'], true, 'filters see X-Forwarded-For as the client sent it');
      assert.deepEqual(hcm['scheme_header_transformation'], { scheme_to_overwrite: 'http' });
      const muts = at(filterNamed(FILTER.headerMutation), 'typed_config.mutations.request_mutations') as Obj[];
      const writes = muts.filter((m) => m['append'] !== undefined).map((m) => at(m, 'append.header') as Obj);
      assert.deepEqual(writes[0], { key: CLIENT_IP_HEADER, value: '%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%' });
      assert.deepEqual(writes.at(-1)!['key'], CLIENT_IP_HEADER);
      assert.match(String(writes.at(-1)!['value']), /^%CEL\(.*startsWith\('::ffff:'\).*substring\(7\).*\)%$/);
      const port = writes.find((w) => w['key'] === CLIENT_PORT_HEADER);
      if (r.config.xffNumTrustedHops > 0) {
        assert.deepEqual(port, { key: CLIENT_PORT_HEADER, value: '%DOWNSTREAM_REMOTE_PORT%' });
        // A zone id in the trusted entry: address and port become the TCP peer's (scratch headers, removed at once).
        const hops = r.config.xffNumTrustedHops;
        const zone = writes.filter((w) => String(w['value']).includes(`.contains('\\x25')`));
        assert.deepEqual(zone.map((w) => w['key']), [CLIENT_IP_HEADER, CLIENT_PORT_HEADER]);
        for (const w of zone) {
          assert.match(String(w['value']), new RegExp(`>= ${hops} && .*\\[size\\(.*\\) - ${hops}\\]`), 'the entry hops from the right');
          assert.doesNotMatch(String(w['value']).slice(1, -1), /%/, 'no bare % inside the command');
        }
        const scratch = writes.filter((w) => String(w['key']).startsWith('x-edge-tcp-peer')).map((w) => [w['key'], w['value']]);
        assert.deepEqual(scratch, [['x-edge-tcp-peer', '%DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT%'], ['x-edge-tcp-peer-port', '%DOWNSTREAM_DIRECT_REMOTE_PORT%']]);
        const removes = muts.filter((m) => typeof m['remove'] === 'string').map((m) => m['remove']);
        assert.ok(removes.includes('x-edge-tcp-peer') && removes.includes('x-edge-tcp-peer-port'));
        const lastScratch = muts.findLastIndex((m) => JSON.stringify(m).includes("request.headers['x-edge-tcp-peer"));
        assert.ok(muts.findIndex((m) => m['remove'] === 'x-edge-tcp-peer-port') > lastScratch, 'removed after their last use');
      } else {
        assert.equal(port, undefined);
        assert.ok(!JSON.stringify(muts).includes('x-edge-tcp-peer'));
      }
      for (const m of muts.filter((x) => x['append'] !== undefined)) assert.equal(at(m, 'append.append_action'), 'OVERWRITE_IF_EXISTS_OR_ADD');
      assert.ok(muts.some((m) => JSON.stringify(m) === JSON.stringify({ remove_on_match: { key_matcher: { prefix: 'x-envoy-' } } })));
      assert.ok(muts.some((m) => JSON.stringify(m) === JSON.stringify({ remove: 'expect' })), 'a client expectation never reaches an upstream');
      // Upstreams: exactly the decided address as X-Forwarded-For; the port marker never leaves Envoy.
      const vhost = at(hcm, 'route_config.virtual_hosts[0]') as Obj;
      assert.deepEqual(vhost['request_headers_to_add'], [{ header: { key: 'x-forwarded-for', value: `%REQ(${CLIENT_IP_HEADER})%` }, append_action: 'OVERWRITE_IF_EXISTS_OR_ADD' }]);
      assert.deepEqual(vhost['request_headers_to_remove'], [CLIENT_PORT_HEADER]);
    });

    if (variant.env['XFF_NUM_TRUSTED_HOPS'] !== undefined) {
      test('XFF guard: a request that sent X-Forwarded-For but got the peer\'s port (a zone id gets it too) is denied and mapped to 400 bad_request', () => {
        const rbac = filterNamed(FILTER.xffGuard)['typed_config'] as Obj;
        assert.equal(at(rbac, 'rules.action'), 'DENY');
        const principals = at(rbac, `rules.policies.${XFF_POLICY}.principals`) as Obj[];
        assert.deepEqual(principals, [{ and_ids: { ids: [
          { header: { name: 'x-forwarded-for', present_match: true } },
          { not_id: { header: { name: CLIENT_PORT_HEADER, string_match: { exact: '0' } } } },
        ] } }]);
        const first = (hcmOf(r.bootstrap)['local_reply_config'] as { mappers: Obj[] }).mappers[0]!;
        assert.match(JSON.stringify(first['filter']), new RegExp(`rbac_access_denied_matched_policy\\[${XFF_POLICY}\\]`));
        assert.equal(first['status_code'], 400);
        assert.deepEqual(at(first, 'body_format_override.json_format'), { error: BAD_REQUEST_CODE, message: xffMessage(r.config.xffNumTrustedHops), requestId: REQUEST_ID_FORMAT });
      });
    }

    test('HCM hardening: request ids, path normalization, escaped slashes rejected, timeouts', () => {
      const hcm = hcmOf(r.bootstrap);
      assert.equal(hcm['generate_request_id'], true);
      assert.equal(hcm['normalize_path'], true);
      assert.equal(hcm['merge_slashes'], true);
      assert.equal(hcm['path_with_escaped_slashes_action'], 'REJECT_REQUEST');
      // Empty cidr_ranges would mean "RFC1918 + loopback are internal" (trusted x-request-id, x-envoy-*).
      assert.deepEqual(hcm['internal_address_config'], { unix_sockets: false, cidr_ranges: [{ address_prefix: '0.0.0.0', prefix_len: 32 }] });
      for (const k of ['request_headers_timeout', 'stream_idle_timeout', 'request_timeout']) assert.match(String(hcm[k]), /^\d+s$/, k);
      // The body timeout: the whole request, body included, within REQUEST_BODY_TIMEOUT_MS, on every listener.
      for (const l of listenerNames(r.bootstrap)) assert.equal(hcmOf(r.bootstrap, l)['request_timeout'], duration(r.config.requestBodyTimeoutMs), l);
      assert.equal(r.config.requestBodyTimeoutMs, Number(variant.env['REQUEST_BODY_TIMEOUT_MS'] ?? 5000));
      assert.match(String(at(hcm, 'common_http_protocol_options.idle_timeout')), /^\d+s$/);
      assert.equal(hcm['codec_type'], 'AUTO');
      assert.deepEqual(at(r.bootstrap, 'admin.address.socket_address'), { address: '127.0.0.1', port_value: r.config.envoyAdminPort });
      assert.deepEqual(at(r.bootstrap, 'static_resources.listeners[0].address.socket_address'), { address: '0.0.0.0', port_value: r.config.edgePort });
    });

    test('ext_authz: gRPC to the authz cluster, fail closed with 503, raw body bytes, explicit timeout', () => {
      const az = filterNamed(FILTER.extAuthz)['typed_config'] as Obj;
      assert.equal(at(az, 'grpc_service.envoy_grpc.cluster_name'), CLUSTER.authz);
      assert.equal(at(az, 'grpc_service.timeout'), duration(r.config.authzTimeoutMs));
      assert.equal(r.config.authzTimeoutMs, Number(variant.env['AUTHZ_TIMEOUT_MS'] ?? 1000), 'AUTHZ_TIMEOUT_MS, default 1000');
      assert.equal(az['transport_api_version'], 'V3');
      assert.equal(az['failure_mode_allow'], false);
      assert.deepEqual(az['status_on_error'], { code: 'ServiceUnavailable' });
      assert.equal(at(az, 'with_request_body.pack_as_bytes'), true);
      assert.equal(at(az, 'with_request_body.allow_partial_message'), false);
    });

    test('ext_authz allowed_headers follows the allowedHeaders option', () => {
      const az = filterNamed(FILTER.extAuthz)['typed_config'] as Obj;
      if ((r.opts.allowedHeaders ?? 'minimal') === 'all') {
        assert.equal(az['allowed_headers'], undefined);
      } else {
        assert.deepEqual((at(az, 'allowed_headers.patterns') as Obj[]).map((p) => p['exact']), [...AUTHZ_HEADERS]);
      }
    });

    test('ingest route: exact POST path to market, a header phase without the body first, then authz gets up to INGEST_MAX_BYTES of raw body', () => {
      const where = r.config.ingestPort === undefined ? LISTENER.edge : LISTENER.ingest;
      const ingest = routeNamed(r.bootstrap, ROUTE.ingest, where);
      assert.deepEqual(ingest['match'], { path: '/internal/ingest/market', headers: [{ name: ':method', string_match: { exact: 'POST' } }] });
      assert.equal(at(ingest, 'route.cluster'), CLUSTER.market);
      assert.deepEqual(at(perFilter(ingest, FILTER.extAuthz), 'check_settings'), {
        with_request_body: { max_request_bytes: r.config.ingestMaxBytes, allow_partial_message: false, pack_as_bytes: true },
        context_extensions: { route: 'ingest' },
      }, 'the body phase never takes the global bucket');
      assert.deepEqual(at(perFilter(ingest, FILTER.headerPhase), 'check_settings'),
        { disable_request_body_buffering: true, context_extensions: { route: 'ingest', [CONTEXT_EXTENSION.phase]: HEADER_PHASE } });
      const phase = filterNamed(FILTER.headerPhase);
      assert.equal(phase['disabled'], true, 'off everywhere but the routes that enable it');
      assert.equal((phase['typed_config'] as Obj)['with_request_body'], undefined, 'never waits for a body');
      assert.equal(at(phase, 'typed_config.stat_prefix'), 'header_phase');
      assert.equal(at(phase, 'typed_config.failure_mode_allow'), false);
      assert.deepEqual(at(phase, 'typed_config.status_on_error'), { code: 'ServiceUnavailable' });
    });

    test('header phase: on the ingest and orders routes only (geo before any body is buffered), never where Envoy answers itself', () => {
      const withPhase = listenerNames(r.bootstrap).flatMap((l) => routesOf(r.bootstrap, l).filter((x) => findKeys(x, FILTER.headerPhase).length > 0).map((x) => x['name']));
      assert.deepEqual(withPhase.sort(), [ROUTE.ingest, r.config.orderBackend === undefined ? ROUTE.ordersNoBackend : ROUTE.orders].sort());
      const orders = routeNamed(r.bootstrap, r.config.orderBackend === undefined ? ROUTE.ordersNoBackend : ROUTE.orders);
      assert.deepEqual(at(perFilter(orders, FILTER.headerPhase), 'check_settings'),
        { disable_request_body_buffering: true, context_extensions: { route: 'order', [CONTEXT_EXTENSION.phase]: HEADER_PHASE } });
      assert.deepEqual(at(perFilter(orders, FILTER.extAuthz), 'check_settings.context_extensions'), { route: 'order' });
    });

    test('ingest listener: with INGEST_PORT on INGEST_BIND_ADDRESS the ingest routes only, the rest 404; the public listener answers the ingest path 404 without buffering a body', () => {
      const names = listenerNames(r.bootstrap);
      if (r.config.ingestPort === undefined) {
        assert.deepEqual(names, [LISTENER.edge]);
        return;
      }
      assert.deepEqual(names, [LISTENER.edge, LISTENER.ingest]);
      assert.deepEqual(at(listenerNamed(r.bootstrap, LISTENER.ingest), 'address.socket_address'), { address: r.config.ingestBindAddress, port_value: r.config.ingestPort });
      assert.equal(at(listenerNamed(r.bootstrap, LISTENER.ingest), 'per_connection_buffer_limit_bytes'), 32_768);
      const hcm = hcmOf(r.bootstrap, LISTENER.ingest);
      assert.equal(hcm['stat_prefix'], LISTENER.ingest, 'its own stats: http.ingest.…');
      assert.deepEqual(hcm['local_reply_config'], hcmOf(r.bootstrap)['local_reply_config'], 'the same JSON replies');
      assert.deepEqual(hcm['http_filters'], hcmOf(r.bootstrap)['http_filters'], 'the same rules: rate limit, geo, HMAC, nonce, Ed25519');
      const ingestRoutes = routesOf(r.bootstrap, LISTENER.ingest);
      assert.deepEqual(ingestRoutes.map((x) => x['name']), [ROUTE.ingestTooLarge, ROUTE.ingest, ROUTE.ingestMethod, ROUTE.ingestListenerNotFound]);
      const rest = ingestRoutes.at(-1)!;
      assert.deepEqual([rest['match'], rest['direct_response']], [{ prefix: '/' }, { status: 404 }]);
      // The public listener: no ingest route; the ingest path falls to the /internal 404, whose
      // Check (geo) never buffers a body.
      const publicNames = routesOf(r.bootstrap).map((x) => x['name']);
      for (const n of [ROUTE.ingest, ROUTE.ingestMethod, ROUTE.ingestTooLarge]) assert.ok(!publicNames.includes(n), publicNames.join(', '));
      const internal = routeNamed(r.bootstrap, ROUTE.internal);
      assert.equal(publicNames[0], ROUTE.internal, 'the first route, so it takes the ingest path');
      assert.deepEqual(internal['direct_response'], { status: 404 });
      assert.deepEqual(at(perFilter(internal, FILTER.extAuthz), 'check_settings.disable_request_body_buffering'), true);
      assert.deepEqual(findKeys(internal, FILTER.headerPhase), []);
    });

    test('body routes: the stream holds up to the route\'s body limit from the route match; a declared body over it is 413 before any body is read', () => {
      const where = r.config.ingestPort === undefined ? LISTENER.edge : LISTENER.ingest;
      const orders = r.config.orderBackend === undefined ? ROUTE.ordersNoBackend : ROUTE.orders;
      for (const [name, tooLarge, listener, path, limit] of [
        [ROUTE.ingest, ROUTE.ingestTooLarge, where, '/internal/ingest/market', r.config.ingestMaxBytes],
        [orders, ROUTE.ordersTooLarge, LISTENER.edge, '/v1/orders', r.config.orderMaxBytes],
      ] as const) {
        assert.equal(routeNamed(r.bootstrap, name, listener)['request_body_buffer_limit'], limit, name);
        const big = routeNamed(r.bootstrap, tooLarge, listener);
        assert.deepEqual(big['match'], { path, headers: [
          { name: ':method', string_match: { exact: 'POST' } },
          { name: 'content-length', range_match: { start: limit + 1, end: '9223372036854775807' } },
        ] });
        assert.deepEqual(big['direct_response'], { status: 413 });
        assert.equal(at(perFilter(big, FILTER.extAuthz), 'check_settings.disable_request_body_buffering'), true, 'geo only, no body');
        const names = routesOf(r.bootstrap, listener).map((x) => x['name']);
        assert.equal(names.indexOf(tooLarge) + 1, names.indexOf(name), `${tooLarge} right before ${name}`);
      }
    });

    test('overload manager: the connection cap, and memory actions against a heap bound of ENVOY_MEMORY_LIMIT_MB minus what is not heap', () => {
      const om = at(r.bootstrap, 'overload_manager') as Obj;
      const monitors = om['resource_monitors'] as Obj[];
      assert.deepEqual(monitors.map((m) => m['name']), ['envoy.resource_monitors.global_downstream_max_connections', FIXED_HEAP_MONITOR]);
      const limitMb = Number(variant.env['ENVOY_MEMORY_LIMIT_MB'] ?? 1024);
      assert.equal(r.config.envoyMemoryLimitMb, limitMb);
      assert.equal(at(monitors[1], 'typed_config.max_heap_size_bytes'), (limitMb - ENVOY_NON_HEAP_MB) * 1_048_576);
      assert.equal(at(monitors[1], 'typed_config.@type'), 'type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig');
      const actions = Object.fromEntries((om['actions'] as Obj[]).map((a) => [a['name'], (a['triggers'] as Obj[])[0]]));
      assert.deepEqual(actions, {
        'envoy.overload_actions.shrink_heap': { name: FIXED_HEAP_MONITOR, threshold: { value: 0.9 } },
        'envoy.overload_actions.reset_high_memory_stream': { name: FIXED_HEAP_MONITOR, scaled: { scaling_threshold: 0.85, saturation_threshold: 0.95 } },
        'envoy.overload_actions.stop_accepting_requests': { name: FIXED_HEAP_MONITOR, threshold: { value: 0.95 } },
      });
      // reset_high_memory_stream needs buffer accounting; 2^16: a full-size order body and any ingest body are tracked.
      assert.deepEqual(om['buffer_factory_config'], { minimum_account_to_track_power_of_two: 16 });
    });

    test('/v1/orders with any other method: Envoy answers 405 with allow: POST, after the POST route and before the catch-all', () => {
      const names = routesOf(r.bootstrap).map((x) => x['name']);
      const method = routeNamed(r.bootstrap, ROUTE.ordersMethod);
      assert.deepEqual(method['match'], { path: '/v1/orders' }, 'every method; the POST route before it takes POST');
      assert.deepEqual(method['direct_response'], { status: 405 });
      assert.deepEqual(at(method, 'response_headers_to_add'), [{ header: { key: 'allow', value: 'POST' }, append_action: 'OVERWRITE_IF_EXISTS_OR_ADD' }]);
      const post = names.indexOf(r.config.orderBackend === undefined ? ROUTE.ordersNoBackend : ROUTE.orders);
      assert.ok(post >= 0 && post < names.indexOf(ROUTE.ordersMethod) && names.indexOf(ROUTE.ordersMethod) < names.indexOf(ROUTE.read), names.join(', '));
    });

    test('reads: catch-all route last, to market, no body buffering for authz', () => {
      const routes = routesOf(r.bootstrap);
      const last = routes.at(-1)!;
      assert.equal(last['name'], ROUTE.read);
      assert.deepEqual(last['match'], { prefix: '/' });
      assert.equal(at(last, 'route.cluster'), CLUSTER.market);
      assert.equal(at(perFilter(last, FILTER.extAuthz), 'check_settings.disable_request_body_buffering'), true);
    });

    test('every route carries explicit ext_authz check_settings', () => {
      for (const route of listenerNames(r.bootstrap).flatMap((l) => routesOf(r.bootstrap, l))) {
        assert.ok(at(perFilter(route, FILTER.extAuthz), 'check_settings'), String(route['name']));
      }
    });

    test('no retry policy anywhere (orders are sent at most once)', () => {
      assert.deepEqual(findKeys(r.bootstrap, 'retry_policy'), []);
      assert.deepEqual(findKeys(r.bootstrap, 'hedge_policy'), []);
    });

    test('every header an allowed order sets for the backend is on the Lua allow-list (none is stripped)', () => {
      const names = orderAllow({ marketId: '0xa', deadline: 1, size: '1', payload: 'AA==' }).headers.map(([name]) => name);
      assert.ok(names.length > 0);
      for (const name of names) assert.ok((ORDER_UPSTREAM_HEADERS as readonly string[]).includes(name), name);
    });

    test('the order-body Lua filter is disabled in the chain and enabled on the orders route only', () => {
      const lua = filterNamed(FILTER.lua);
      assert.equal(lua['disabled'], true);
      const source = String(at(lua, `typed_config.source_codes.${ORDER_BODY_LUA}.inline_string`));
      assert.ok(source.includes(ORDER_BODY_FAILURE_PREFIX), 'the fail-closed reply is the API error JSON');
      assert.match(source, /pcall\(process, handle\)/, 'a Lua error answers 503 instead of continuing');
      assert.equal(at(lua, 'typed_config.clear_route_cache'), false, 'the header rewrite must not re-choose the allowed route');
      const withLua = routesOf(r.bootstrap).filter((x) => findKeys(x, FILTER.lua).length > 0).map((x) => x['name']);
      assert.deepEqual(withLua, r.config.orderBackend === undefined ? [] : [ROUTE.orders]);
    });

    test('access log is JSON and names no secret-bearing header or body', () => {
      const log = at(hcmOf(r.bootstrap), 'access_log[0].typed_config') as Obj;
      if (r.opts.accessLogPath === undefined) assert.match(String(log['@type']), /StdoutAccessLog$/);
      else assert.equal(log['path'], r.opts.accessLogPath);
      const fmt = JSON.stringify(at(log, 'log_format.json_format'));
      assert.doesNotMatch(fmt, /signature|nonce|timestamp|authorization|cookie|BODY/i);
      // Request headers in the line: these two only (`:N` cuts a value to N characters).
      const reqHeaders = [...fmt.matchAll(/%REQ\(([^)]*)\)(?::\d+)?%/g)].map((m) => m[1]);
      assert.deepEqual(reqHeaders.sort(), [':METHOD', 'X-REQUEST-ID']);
    });

    test('local replies: denials pass through first, then UAEX → 503, every other body is API error JSON', () => {
      const all = hcmOf(r.bootstrap)['local_reply_config'] as { mappers: Obj[]; body_format: Obj };
      // The XFF guard's mapper (trusted hops only) comes first; its own test checks it.
      const lr = { ...all, mappers: all.mappers.filter((m) => !JSON.stringify(m['filter']).includes('rbac_access_denied')) };
      assert.equal(all.mappers.length - lr.mappers.length, r.config.xffNumTrustedHops > 0 ? 1 : 0);
      const first = lr.mappers[0]!;
      assert.match(JSON.stringify(first['filter']), /response\.code_details == 'ext_authz_denied'/);
      assert.equal(at(first, 'body_format_override.text_format_source.inline_string'), '%LOCAL_REPLY_BODY%');
      assert.equal(first['status_code'], undefined, 'a denial keeps its status (451 included)');
      assert.deepEqual(at(lr.mappers[1], 'filter.response_flag_filter.flags'), ['UAEX']);
      assert.equal(lr.mappers[1]!['status_code'], 503);
      for (const m of lr.mappers.slice(1)) {
        const body = at(m, 'body_format_override.json_format') as Obj;
        const code = body['error'] as string;
        const is501 = findKeys(m['filter'], 'default_value')[0] === 501;
        if (code === BAD_REQUEST_CODE && !is501) assert.equal(m['status_code'], undefined, 'Envoy 4xx keep their status');
        else assert.equal(m['status_code'], ERROR_STATUS[code as keyof typeof ERROR_STATUS], `mapper status matches the API error code ${code}`);
        assert.equal(at(m, 'body_format_override.content_type'), 'application/json');
      }
      const byStatus = new Map(lr.mappers.flatMap((m) => {
        const v = findKeys(m['filter'], 'default_value')[0];
        return typeof v === 'number' ? [[v, at(m, 'body_format_override.json_format') as Obj] as const] : [];
      }));
      assert.deepEqual(byStatus.get(429), { error: 'too many requests', message: ERROR_MESSAGE['too many requests'], requestId: REQUEST_ID_FORMAT });
      assert.deepEqual(byStatus.get(413), { error: 'payload_too_large', message: ERROR_MESSAGE.payload_too_large, requestId: REQUEST_ID_FORMAT });
      assert.deepEqual(byStatus.get(404), { error: 'not_found', message: ERROR_MESSAGE.not_found, requestId: REQUEST_ID_FORMAT });
      // Every Envoy-made body, the default included: error, message, requestId (the x-request-id).
      for (const f of [...lr.mappers.slice(1).map((m) => at(m, 'body_format_override.json_format') as Obj), at(lr.body_format, 'json_format') as Obj]) {
        assert.deepEqual(Object.keys(f), ['error', 'message', 'requestId']);
        assert.equal(f['requestId'], '%REQ(X-REQUEST-ID)%');
      }
      assert.equal(at(lr.body_format, 'content_type'), 'application/json');
      // Envoy's 501 for the client's own malformed request (unsupported transfer-encoding) is a
      // 400 bad_request, matched before the 5xx catch-all → 503.
      const dpeAt = lr.mappers.findIndex((m) => findKeys(m['filter'], 'default_value')[0] === 501);
      const catchAllAt = lr.mappers.findIndex((m) => (m['filter'] as Obj)['status_code_filter'] !== undefined && JSON.stringify(m['filter']).includes('"GE"'));
      assert.ok(dpeAt > 0 && catchAllAt > dpeAt, `DPE mapper ${dpeAt} before the 5xx catch-all ${catchAllAt}`);
      assert.equal(lr.mappers[dpeAt]!['status_code'], 400);
      assert.equal((at(lr.mappers[dpeAt], 'body_format_override.json_format') as Obj)['error'], BAD_REQUEST_CODE);
    });

    if (variant.env['ORDER_BACKEND_URL'] === undefined) {
      test('no backend: the orders route still exists and answers 502 itself; no backend cluster, no SDS', () => {
        const orders = routeNamed(r.bootstrap, ROUTE.ordersNoBackend);
        assert.deepEqual(orders['direct_response'], { status: 502 });
        assert.equal(at(orders, 'match.path'), '/v1/orders');
        assert.equal(clusterNamed(r.bootstrap, CLUSTER.orderBackend), undefined);
        assert.equal(r.sds, undefined);
      });
    } else {
      test('orders route: POST /v1/orders → order_backend /orders, ORDER_BACKEND_TIMEOUT_MS, body ≤ ORDER_MAX_BYTES', () => {
        const b = r.config.orderBackend!;
        const orders = routeNamed(r.bootstrap, ROUTE.orders);
        assert.deepEqual(orders['match'], { path: '/v1/orders', headers: [{ name: ':method', string_match: { exact: 'POST' } }] });
        assert.equal(at(orders, 'route.cluster'), CLUSTER.orderBackend);
        assert.equal(at(orders, 'route.prefix_rewrite'), '/orders');
        assert.equal(at(orders, 'route.timeout'), duration(b.timeoutMs));
        assert.equal(at(orders, 'route.host_rewrite_literal'), new URL(b.url).host);
        const idle = Number(String(at(orders, 'route.idle_timeout')).slice(0, -1)) * 1000;
        assert.ok(idle > b.timeoutMs, 'the stream idle timeout never pre-empts the route timeout (504)');
        assert.equal(at(perFilter(orders, FILTER.extAuthz), 'check_settings.with_request_body.max_request_bytes'), r.config.orderMaxBytes);
        // request_timeout (the body timeout) stops once the order went upstream: it never pre-empts the 504.
        assert.equal((orders['route'] as Obj)['max_stream_duration'], undefined);
        assert.equal(at(perFilter(orders, FILTER.lua), 'name'), ORDER_BODY_LUA);
      });

      test('order_backend cluster: pinned CA, exact SAN of the right type, client cert via SDS, bounded connection life', () => {
        const b = r.config.orderBackend!;
        const c = clusterNamed(r.bootstrap, CLUSTER.orderBackend)!;
        const ipHost = /^[0-9.]+$|:/.test(b.host);
        if (ipHost) assert.equal(c['type'], 'STATIC');
        else {
          // LOGICAL DNS (one endpoint for every address), re-resolved every second.
          assert.equal(c['type'], undefined);
          assert.deepEqual(at(c, 'cluster_type.typed_config'), {
            '@type': 'type.googleapis.com/envoy.extensions.clusters.dns.v3.DnsCluster',
            all_addresses_in_single_endpoint: true, dns_lookup_family: 'V4_PREFERRED', dns_refresh_rate: '1s',
          });
        }
        const tls = at(c, 'transport_socket.typed_config') as Obj;
        const ipSan = /^[0-9.]+$|:/.test(b.san);
        assert.equal(tls['sni'], ipSan ? (ipHost ? undefined : b.host) : b.san);
        assert.equal(at(tls, 'common_tls_context.validation_context.trusted_ca.filename'), b.caFile);
        assert.deepEqual(at(tls, 'common_tls_context.validation_context.match_typed_subject_alt_names'),
          [{ san_type: ipSan ? 'IP_ADDRESS' : 'DNS', matcher: { exact: canonicalIp(b.san) } }]);
        assert.deepEqual(at(tls, 'common_tls_context.tls_certificate_sds_secret_configs'), [{
          name: CLIENT_CERT_SECRET, sds_config: { path_config_source: { path: r.opts.sdsPath }, resource_api_version: 'V3' },
        }]);
        const opts = (c['typed_extension_protocol_options'] as Obj)['envoy.extensions.upstreams.http.v3.HttpProtocolOptions'] as Obj;
        assert.equal(at(opts, 'common_http_protocol_options.max_connection_duration'), duration(b.maxConnSecs * 1000));
        assert.match(String(at(opts, 'common_http_protocol_options.idle_timeout')), /s$/);
        assert.match(String(c['connect_timeout']), /s$/);
        assert.deepEqual(at(r.bootstrap, 'node'), { id: r.opts.nodeId ?? 'edge-envoy', cluster: 'edge-trading-proxy' });
      });

      test('SDS file: the client pair by filename, watching their directory (symlink swap and mv rotate)', () => {
        const b = r.config.orderBackend!;
        const secret = at(r.sds, 'resources[0]') as Obj;
        assert.equal(secret['name'], CLIENT_CERT_SECRET);
        assert.deepEqual(secret['tls_certificate'], {
          certificate_chain: { filename: b.clientCertFile },
          private_key: { filename: b.clientKeyFile },
          watched_directory: { path: b.clientCertFile.slice(0, b.clientCertFile.lastIndexOf('/')) },
        });
      });
    }

    test('authz cluster speaks HTTP/2 explicitly', () => {
      const c = clusterNamed(r.bootstrap, CLUSTER.authz)!;
      const opts = (c['typed_extension_protocol_options'] as Obj)['envoy.extensions.upstreams.http.v3.HttpProtocolOptions'] as Obj;
      assert.ok(at(opts, 'explicit_http_config.http2_protocol_options'));
      assert.ok(at(clusterNamed(r.bootstrap, CLUSTER.market), 'typed_extension_protocol_options'));
    });
  });
}

describe('renderer edge cases', () => {
  test('duration: milliseconds to protobuf Duration strings', () => {
    assert.equal(duration(5000), '5s');
    assert.equal(duration(250), '0.25s');
    assert.equal(duration(1), '0.001s');
    assert.throws(() => duration(-1), RangeError);
  });

  test('canonicalIp: IPv6 literals in Envoy\'s compressed form; others unchanged', () => {
    assert.equal(canonicalIp('0:0:0:0:0:0:0:1'), '::1');
    assert.equal(canonicalIp('2001:DB8:0:0::1'), '2001:db8::1');
    assert.equal(canonicalIp('10.0.0.1'), '10.0.0.1');
    assert.equal(canonicalIp('orders.example'), 'orders.example');
  });

  test('a client key outside the certificate directory is reported (only that directory is watched)', () => {
    const config = loadConfig({ ...backendEnv('https://orders.example'), EDGE_CLIENT_KEY_FILE: '/elsewhere/tls.key' });
    const r = renderEnvoy(config, { sdsPath: '/x/sds.yaml' });
    assert.equal(r.warnings.length, 1);
    assert.match(r.warnings[0]!, /rotate the key before the certificate/);
  });

  test('a format-string % in a message cannot become an Envoy command', () => {
    const r = renderEnvoy(loadConfig({}), { sdsPath: '/x/sds.yaml' });
    const bodies = findKeys(parse(r.bootstrap), 'json_format');
    assert.ok(bodies.length > 5);
    assert.doesNotMatch(r.bootstrap, /message: [^\n]*[^%]%[^%A-Z]/);
  });

  test('envoyBinary: ENVOY_BIN overrides, else the project .venv', () => {
    assert.equal(envoyBinary({ ENVOY_BIN: '/opt/envoy' }), '/opt/envoy');
    assert.equal(envoyBinary({ ENVOY_BIN: ' ' }), join(REPO_ROOT, '.venv', 'bin', 'envoy'));
    assert.equal(envoyBinary({}), join(REPO_ROOT, '.venv', 'bin', 'envoy'));
  });

  test('validateBootstrap: a bootstrap naming a missing CA file is rejected', () => {
    const dir = join(work.dir, 'missing-ca');
    spawnSync('mkdir', ['-p', dir]);
    const r = renderVariant({ env: { ...backendEnv('https://orders.example'), ORDER_BACKEND_CA_FILE: join(dir, 'nope.pem') } }, dir);
    const v = validateBootstrap(r.file);
    assert.equal(v.ok, false);
    assert.match(v.output, /nope\.pem/);
  });
});

describe('render-cli', () => {
  test('writes envoy.yaml and the SDS file, and --validate passes', () => {
    const out = join(work.dir, 'cli-out');
    const code = renderCli([out, '--validate', '--allowed-headers', 'all'], backendEnv('https://orders.example:9443'));
    assert.equal(code, 0);
    assert.ok(existsSync(join(out, BOOTSTRAP_FILE)));
    const sdsPath = at(parse(readFileSync(join(out, BOOTSTRAP_FILE), 'utf8')), 'static_resources.clusters[2].transport_socket.typed_config'
      + '.common_tls_context.tls_certificate_sds_secret_configs[0].sds_config.path_config_source.path');
    assert.equal(sdsPath, join(out, SDS_FILE));
    assert.ok(existsSync(join(out, SDS_FILE)));
  });

  test('a bad setting exits 1, bad usage exits 2, a missing certificate fails --validate', () => {
    const out = join(work.dir, 'cli-bad');
    assert.equal(renderCli([out], { RATE_BURST: 'lots' }), 1);
    assert.equal(renderCli([], {}), 2);
    assert.equal(renderCli([out, '--allowed-headers', 'some'], {}), 2);
    assert.equal(renderCli([out, '--validate'], { ...backendEnv('https://orders.example'), EDGE_CLIENT_CERT_FILE: join(out, 'gone.crt') }), 1);
  });
});

// ─── Live: a real Envoy with stub upstreams ────────────────────────────────────────────────

const envoyAvailable = spawnSync(envoyBinary(), ['--version']).status === 0;

describe('live Envoy 1.40 with the rendered config', { skip: envoyAvailable ? false : 'no Envoy binary' }, () => {
  /** What the real order stage allows (minus the market lookup): the payload as metadata. */
  const orderOrAllow = (i: AuthzInput): Decision => {
    // The header phase has no body yet: the order is judged in the body phase.
    if (i.route !== 'order' || i.phase !== undefined) return ALLOW;
    // As the pipeline does: a body Envoy cut at ORDER_MAX_BYTES is over the limit.
    if (i.partialBody === true) return deny('payload_too_large');
    const o = parseOrder(i.body, 32_768, i.bodyExact === true);
    return 'allow' in o ? o : orderAllow(o);
  };
  let decide: (i: AuthzInput) => Decision | Promise<Decision> = orderOrAllow;
  const inputs: AuthzInput[] = [];
  let backendMode: BackendMode = 'ok';
  let authz: AuthzGrpcServer;
  let market: Upstream<import('node:http').Server>;
  let backend: Upstream<import('node:https').Server>;
  let envoy: LiveEnvoy;
  let noBackendEnvoy: LiveEnvoy;
  let ip = 0;
  /** A fresh client address per call (XFF_NUM_TRUSTED_HOPS=1): its own rate-limit bucket. */
  const client = (): Record<string, string> => ({ 'x-forwarded-for': `203.0.113.${++ip}` });
  const J = { 'content-type': 'application/json' };
  const order = (payload: Buffer): string => JSON.stringify({
    marketId: 'm1', deadline: Math.floor(Date.now() / 1000) + 600, size: '1', payload: payload.toString('base64'),
  });

  before(async () => {
    authz = createGrpcServer({
      evaluate: (i) => { inputs.push(i); return decide(i); },
      observe: () => {},
      onError: () => {},
    });
    const grpcPort = await authz.listen('127.0.0.1', 0);
    authz.setServing(true);
    market = await startMarketStub();
    backend = await startBackendStub(certs, () => backendMode);
    const env: Env = {
      EDGE_PORT: '0', ENVOY_ADMIN_PORT: '0', AUTHZ_GRPC_PORT: String(grpcPort), MARKET_PORT: String(market.port),
      XFF_NUM_TRUSTED_HOPS: '1', RPS_PER_IP: '1', RATE_BURST: '3', ORDER_MAX_BYTES: '16384',
      ORDER_BACKEND_TIMEOUT_MS: '500', REQUEST_BODY_TIMEOUT_MS: '1500',
    };
    const start = async (name: string, extra: Env): Promise<LiveEnvoy> => {
      const dir = join(work.dir, name);
      spawnSync('mkdir', ['-p', dir]);
      const r = renderVariant({ env: { AUTHZ_TIMEOUT_MS: '300', ...env, ...extra }, opts: { accessLogPath: join(dir, 'access.log') } }, dir);
      return startEnvoy(r.file, dir);
    };
    envoy = await start('live', { ...backendEnv(`https://127.0.0.1:${backend.port}`, 'orders.test') });
    noBackendEnvoy = await start('live-no-backend', { XFF_NUM_TRUSTED_HOPS: '0' });
  });

  after(async () => {
    await Promise.all([envoy?.stop(), noBackendEnvoy?.stop()]);
    await Promise.all([authz?.close(0), market?.close(), backend?.close()]);
  });

  /** docs/api.md "Errors": error, message, requestId = the x-request-id the client received (null without one). */
  const isContractJson = (res: { status: number; headers: Record<string, unknown>; body: string }, status: number, error: string): void => {
    assert.equal(res.status, status, res.body);
    assert.equal(res.headers['content-type'], 'application/json');
    const body = JSON.parse(res.body) as Obj;
    assert.equal(body['error'], error);
    assert.equal(typeof body['message'], 'string');
    assert.deepEqual(Object.keys(body), ['error', 'message', 'requestId']);
    assert.equal(body['requestId'], res.headers['x-request-id'] ?? null);
  };

  test('per-IP rate limit: burst then 429 "too many requests" JSON; another address is unaffected', async () => {
    const me = client();
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await request(envoy.edgePort, 'GET', '/healthz', me)).status);
    assert.deepEqual(statuses, [200, 200, 200, 429]);
    const limited = await request(envoy.edgePort, 'GET', '/healthz', me);
    isContractJson(limited, 429, 'too many requests');
    assert.equal(limited.headers['x-ratelimit-limit'], '3');
    assert.equal((await request(envoy.edgePort, 'GET', '/healthz', client())).status, 200);
  });

  test('x-edge-client-ip is the XFF-derived address, whatever the client sent', async () => {
    const before = inputs.length;
    await request(envoy.edgePort, 'GET', '/v1/markets', { 'x-forwarded-for': '198.51.100.1, 203.0.113.200', 'x-edge-client-ip': '6.6.6.6' });
    assert.equal(inputs[before]?.clientIp, '203.0.113.200');
    assert.equal(market.seen.at(-1)?.headers['x-edge-client-ip'], '203.0.113.200');
  });

  test('a zone id in the trusted entry (any spelling) → 400 naming X-Forwarded-For, charged to the TCP peer\'s bucket: 429 after RATE_BURST', async () => {
    for (const zone of ['%0', '%25eth0', '%eth0', '%1']) {
      // A fresh client address each: only the TCP peer (127.0.0.1) can be what pays.
      const res = await request(envoy.edgePort, 'GET', '/v1/markets', { 'x-forwarded-for': `203.0.113.${++ip}, 2001:db8:7::${ip}${zone}` });
      if (res.status === 429) break; // the peer's bucket (RATE_BURST 3) is already spent
      isContractJson(res, 400, BAD_REQUEST_CODE);
      assert.match(res.body, /X-Forwarded-For/);
    }
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++) statuses.push((await request(envoy.edgePort, 'GET', '/v1/markets', { 'x-forwarded-for': `2001:db8:7::${++ip}%0` })).status);
    assert.ok(statuses.includes(429), `the peer's bucket runs out: ${statuses.join(',')}`);
    assert.deepEqual(statuses.slice(statuses.indexOf(429)), statuses.slice(statuses.indexOf(429)).map(() => 429), statuses.join(','));
    // The senders' addresses were never charged: one of them, well-formed, is served.
    assert.equal((await request(envoy.edgePort, 'GET', '/v1/markets', { 'x-forwarded-for': `2001:db8:7::${ip}` })).status, 200);
    // The scratch headers the zone check uses never leave Envoy, whatever a client sends.
    const before = inputs.length;
    await request(envoy.edgePort, 'GET', '/v1/markets', { ...client(), 'x-edge-tcp-peer': '6.6.6.6', 'x-edge-tcp-peer-port': '1' });
    assert.ok(!Object.keys(market.seen.at(-1)?.headers ?? {}).some((h) => h.startsWith('x-edge-tcp-peer')));
    assert.ok(inputs.length > before && inputs.at(-1)?.clientIp !== '6.6.6.6');
  });

  test('a client that sends its request line after a second of silence is served (the first-request deadline is seconds, not a race)', async () => {
    const res = await new Promise<string>((resolve, reject) => {
      const sock = connect(envoy.edgePort, '127.0.0.1');
      let got = '';
      sock.on('connect', () => setTimeout(() => sock.write(`GET /v1/markets HTTP/1.1\r\nhost: e\r\nx-forwarded-for: 203.0.113.${++ip}\r\nconnection: close\r\n\r\n`), 1000));
      sock.on('data', (d: Buffer) => { got += d.toString(); });
      sock.on('end', () => resolve(got));
      sock.on('error', reject);
    });
    assert.match(res, /^HTTP\/1\.1 200 /);
  });

  test('a loopback/private peer is external too: it cannot choose x-request-id or send x-envoy-*', async () => {
    // noBackendEnvoy trusts no XFF hop, so the client address is the socket peer 127.0.0.1,
    // which Envoy's default internal_address_config would treat as internal.
    const res = await request(noBackendEnvoy.edgePort, 'GET', '/v1/markets', {
      'x-request-id': 'chosen-by-client', 'x-envoy-upstream-alt-stat-name': 'x',
    });
    assert.equal(res.status, 200);
    const got = market.seen.at(-1)!;
    assert.notEqual(got.headers['x-request-id'], 'chosen-by-client');
    assert.deepEqual(Object.keys(got.headers).filter((h) => h.startsWith('x-envoy-')), []);
  });

  test('a 451 denial reaches the client byte-identical, headers included', async () => {
    const geo = geoDenial('This service is not available in your jurisdiction.', 'https://example.com/why');
    decide = () => geo;
    try {
      const res = await request(envoy.edgePort, 'GET', '/v1/markets', client());
      assert.equal(res.status, 451);
      const id = res.headers['x-request-id'] as string;
      assert.match(id, /^[0-9a-f-]{36}$/);
      assert.equal(res.body, denialBody(geo, id));
      assert.equal(JSON.parse(res.body).requestId, id);
      assert.equal(res.headers['content-type'], 'application/json');
      assert.equal(res.headers['cache-control'], 'no-store');
      assert.equal(res.headers['link'], '<https://example.com/why>; rel="blocked-by"');
    } finally { decide = orderOrAllow; }
  });

  test('other denials keep their status and body (400 with field)', async () => {
    const d = deny('invalid_order', ERROR_MESSAGE.invalid_order, 'size');
    decide = () => d;
    try {
      const res = await request(envoy.edgePort, 'POST', '/v1/orders', { ...client(), ...J }, '{}');
      assert.equal(res.status, 400);
      assert.equal(res.body, denialBody(d, res.headers['x-request-id'] as string));
      assert.deepEqual(Object.keys(JSON.parse(res.body)), ['error', 'message', 'field', 'requestId']);
    } finally { decide = orderOrAllow; }
  });

  // The order-body Lua filter fails closed whatever authz hands it. Our authz never allows an
  // order without a strict-base64 payload; these decisions stand in for a broken authz.
  const brokenAllows: Record<string, Decision> = {
    'no payload metadata': ALLOW,
    'payload metadata under another key': { ...ALLOW, metadata: { payload: 'AQ==' } },
    'payload metadata that is not base64': { ...ALLOW, metadata: { order_payload: 'not base64!' } },
    'payload metadata with non-zero padding bits (AR==)': { ...ALLOW, metadata: { order_payload: 'AR==' } },
    'payload metadata with a misplaced =': { ...ALLOW, metadata: { order_payload: 'AA=AAAAA' } },
    'an empty payload': { ...ALLOW, metadata: { order_payload: '' } },
    'a payload position that is not <start>:<length>': { ...ALLOW, metadata: { order_payload_at: '12-4' } },
    'a payload position past the end of the body': { ...ALLOW, metadata: { order_payload_at: '1:100000' } },
    'a payload position not between two quotes': { ...ALLOW, metadata: { order_payload_at: '3:4' } },
    'a payload position of length 0': { ...ALLOW, metadata: { order_payload_at: '1:0' } },
  };
  for (const [name, d] of Object.entries(brokenAllows)) {
    test(`order-body filter: ${name} → 503 service_unavailable JSON, nothing reaches the backend`, async () => {
      decide = () => d;
      try {
        const seen = backend.seen.length;
        const res = await request(envoy.edgePort, 'POST', '/v1/orders', { ...client(), ...J }, order(Buffer.from('x')));
        isContractJson(res, 503, 'service_unavailable');
        assert.equal(res.body, orderBodyFailure(res.headers['x-request-id'] as string));
        assert.equal(backend.seen.length, seen);
      } finally { decide = orderOrAllow; }
    });
  }

  test('order-body filter: payloads of every byte value and around its 3,072-byte chunking arrive byte-exact', async () => {
    const payloads = [
      Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
      ...[1, 2, 3, 3071, 3072, 3073, 6145].map((n) => Buffer.from(Array.from({ length: n }, (_, i) => (i * 37 + n) & 0xff))),
    ];
    for (const payload of payloads) {
      const seen = backend.seen.length;
      const res = await request(envoy.edgePort, 'POST', '/v1/orders', { ...client(), ...J }, order(payload));
      assert.equal(res.status, 201, res.body);
      assert.equal(backend.seen.length, seen + 1);
      const got = backend.seen.at(-1)!;
      assert.deepEqual(got.body, payload, `${payload.length} bytes`);
      assert.equal(got.headers['content-length'], String(payload.length));
    }
  });

  test('order-body filter: a payload handed over by position and one whose JSON string has escapes (handed over as text) arrive byte-exact', async () => {
    const payload = Buffer.from([0xfb, 0xff, 0xbf, 0x00, 0x3e, 0x3f]);
    const text = payload.toString('base64');
    assert.ok(text.includes('/') && text.includes('+'));
    const deadline = Math.floor(Date.now() / 1000) + 600;
    const plain = `{"marketId":"m1","deadline":${deadline},"size":"1","payload":"${text}"}`;
    // PHP's json_encode and others write `/` as `\/`: the same payload.
    const escaped = plain.replace(text, text.replaceAll('/', '\\/'));
    for (const [body, by] of [[plain, 'position'], [escaped, 'text']] as const) {
      const seen = backend.seen.length;
      const at = inputs.length;
      const res = await request(envoy.edgePort, 'POST', '/v1/orders', { ...client(), ...J }, body);
      assert.equal(res.status, 201, res.body);
      const decided = orderOrAllow(inputs.slice(at).find((i) => i.phase === undefined)!);
      assert.ok(by === 'position' ? 'order_payload_at' in (decided.metadata ?? {}) : 'order_payload' in (decided.metadata ?? {}), `handed over by ${by}`);
      assert.equal(backend.seen.length, seen + 1);
      assert.deepEqual(backend.seen.at(-1)!.body, payload, by);
    }
  });

  test('authz too slow or down → 503 service_unavailable JSON, never an allow', async () => {
    decide = () => new Promise((r) => setTimeout(() => r(ALLOW), 800));
    try {
      const res = await request(envoy.edgePort, 'GET', '/v1/markets', client());
      isContractJson(res, 503, 'service_unavailable');
      assert.equal(JSON.parse(res.body).message, ERROR_MESSAGE.service_unavailable);
    } finally { decide = orderOrAllow; }
  });

  test('body over ORDER_MAX_BYTES → 413 payload_too_large JSON: declared, authz asked for geo only (no body); chunked, never judged cut short', async () => {
    let before = inputs.length;
    const res = await request(envoy.edgePort, 'POST', '/v1/orders', { ...client(), ...J }, 'x'.repeat(20_000));
    isContractJson(res, 413, 'payload_too_large');
    assert.deepEqual(inputs.slice(before).map((i) => [i.route, i.phase, i.body]), [['read', undefined, undefined]]);
    // Chunked (no content-length): read while the header phase is decided, then either Envoy's own
    // 413 at the buffer limit or a body phase with the body cut at ORDER_MAX_BYTES, marked partial.
    before = inputs.length;
    const chunked = await new Promise<{ status: number; headers: Record<string, unknown>; body: string }>((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port: envoy.edgePort, method: 'POST', path: '/v1/orders', agent: false, headers: { ...client(), ...J } }, (r) => {
        let body = '';
        r.on('data', (d: Buffer) => { body += d.toString(); });
        r.on('end', () => resolve({ status: r.statusCode ?? 0, headers: r.headers, body }));
      });
      req.on('error', reject);
      req.write('x'.repeat(10_000));
      req.end('x'.repeat(10_000));
    });
    isContractJson(chunked, 413, 'payload_too_large');
    for (const i of inputs.slice(before).filter((x) => x.phase === undefined)) assert.equal(i.partialBody, true, 'a body phase only with the cut body, marked');
  });

  test('an order body stalled or trickled past REQUEST_BODY_TIMEOUT_MS → 408 bad_request JSON at that time; a refused header phase answers before any body', async () => {
    for (const trickle of [false, true]) {
      const t0 = Date.now();
      const res = await new Promise<{ status: number; headers: Record<string, unknown>; body: string }>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port: envoy.edgePort, method: 'POST', path: '/v1/orders', agent: false,
          headers: { ...client(), ...J, 'content-length': '1000' } }, (r) => {
          let body = '';
          r.setEncoding('utf8');
          r.on('data', (d: string) => { body += d; });
          r.on('end', () => resolve({ status: r.statusCode ?? 0, headers: r.headers, body }));
        });
        req.on('error', reject);
        req.write('{');
        // One byte every 200 ms never leaves the stream idle; the timeout counts anyway.
        const timer = trickle ? setInterval(() => req.write(' '), 200) : undefined;
        req.on('response', () => clearInterval(timer));
        req.on('close', () => clearInterval(timer));
      });
      const ms = Date.now() - t0;
      isContractJson(res, 408, 'bad_request');
      // REQUEST_BODY_TIMEOUT_MS=1500 here: not before it, and well before Envoy's idle timeout (30 s).
      assert.ok(ms >= 1400 && ms < 5000, `${trickle ? 'trickled' : 'stalled'}: 408 after ${ms} ms`);
    }
    const d = geoDenial('not here', undefined);
    decide = (i) => (i.phase !== undefined ? d : orderOrAllow(i));
    try {
      const before = inputs.length;
      // Headers only, a body announced and never sent: the header phase answers.
      const res = await new Promise<number>((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port: envoy.edgePort, method: 'POST', path: '/v1/orders', agent: false,
          headers: { ...client(), ...J, 'content-length': '16000' } }, (r) => { r.resume(); resolve(r.statusCode ?? 0); req.destroy(); });
        req.on('error', reject);
        req.flushHeaders();
      });
      assert.equal(res, 451);
      assert.deepEqual(inputs.slice(before).map((i) => i.phase), [HEADER_PHASE], 'decided on the headers, no body phase');
    } finally { decide = orderOrAllow; }
  });

  test('internal paths other than the exact ingest POST never reach the market service', async () => {
    const seen = market.seen.length;
    isContractJson(await request(envoy.edgePort, 'GET', '/INTERNAL/Ingest/market', client()), 404, 'not_found');
    isContractJson(await request(envoy.edgePort, 'POST', '/internal/ingest/market/', { ...client(), ...J }, '{}'), 404, 'not_found');
    const get = await request(envoy.edgePort, 'GET', '/internal/ingest/market', client());
    isContractJson(get, 405, 'method_not_allowed');
    assert.equal(get.headers['allow'], 'POST');
    assert.equal(market.seen.length, seen);
    isContractJson(await request(envoy.edgePort, 'GET', '/v1%2Fmarkets', client()), 400, 'bad_request');
  });

  test('an accepted order reaches the backend once, as the decoded bytes at /orders with authz\'s x-edge-* headers (client values overwritten), over mTLS', async () => {
    const payload = Buffer.from([0x00, 0xff, 0x7b, 0x22, 0x80]);
    const seen = backend.seen.length;
    const res = await request(envoy.edgePort, 'POST', '/v1/orders',
      { ...client(), ...J, 'x-request-id': 'client-chosen', 'x-edge-size': '999999', 'x-edge-market-id': 'spoofed' }, order(payload));
    assert.equal(res.status, 201, res.body);
    assert.equal(backend.seen.length, seen + 1);
    const got = backend.seen.at(-1)!;
    assert.equal(got.url, '/orders');
    assert.deepEqual(got.body, payload);
    assert.equal(got.headers['content-type'], 'application/octet-stream');
    assert.equal(got.headers['content-length'], '5');
    assert.equal(got.headers['x-edge-market-id'], 'm1');
    assert.equal(got.headers['x-edge-size'], '1');
    assert.match(String(got.headers['x-edge-deadline']), /^[0-9]+$/);
    assert.equal(got.clientCertCn, 'edge-client');
    assert.notEqual(got.headers['x-request-id'], 'client-chosen', 'external clients cannot choose the dedup id');
    assert.equal(res.headers['x-request-id'], got.headers['x-request-id'], 'the client learns the id');
  });

  test('order-body filter: only allow-listed headers reach the backend, and no query string', async () => {
    const seen = backend.seen.length;
    const res = await request(envoy.edgePort, 'POST', '/v1/orders?admin=1&x=2', {
      ...client(), ...J, cookie: 'session=secret', authorization: 'Bearer client-token', 'content-encoding': 'gzip',
      'x-edge-verified': 'yes', 'x-edge-nonce': 'n', 'x-custom': 'c', 'user-agent': 'test-agent',
    }, order(Buffer.from('q')));
    assert.equal(res.status, 201, res.body);
    assert.equal(backend.seen.length, seen + 1);
    const got = backend.seen.at(-1)!;
    assert.equal(got.url, '/orders');
    const allowed = new Set<string>([...ORDER_UPSTREAM_HEADERS, 'host', 'connection', 'transfer-encoding']);
    assert.deepEqual(Object.keys(got.headers).filter((h) => !allowed.has(h)), []);
    assert.equal(got.headers['user-agent'], 'test-agent');
    assert.deepEqual(got.body, Buffer.from('q'));
  });

  test('order-body filter: a chunked HTTP/1.1 order and an HTTP/2 order both reach the backend byte-exact with content-length', async () => {
    const payload = Buffer.from([0x00, 0x0d, 0x0a, 0x30, 0x0d, 0x0a, 0xff]); // NUL, CRLF, "0", CRLF: chunk-framing look-alikes
    const body = Buffer.from(order(payload));
    // HTTP/1.1, Transfer-Encoding: chunked, the envelope split across three chunks.
    const seen = backend.seen.length;
    const chunked = await new Promise<number>((resolve, reject) => {
      const r = http.request({ host: '127.0.0.1', port: envoy.edgePort, method: 'POST', path: '/v1/orders', agent: false, headers: { ...client(), ...J } }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      });
      r.on('error', reject);
      r.write(body.subarray(0, 5));
      r.write(body.subarray(5, 40));
      r.end(body.subarray(40));
    });
    assert.equal(chunked, 201);
    assert.equal(backend.seen.length, seen + 1);
    assert.deepEqual(backend.seen.at(-1)!.body, payload);
    assert.equal(backend.seen.at(-1)!.headers['content-length'], String(payload.length));
    assert.equal(backend.seen.at(-1)!.headers['transfer-encoding'], undefined);
    // HTTP/2 (h2c prior knowledge).
    const session = http2.connect(`http://127.0.0.1:${envoy.edgePort}`);
    try {
      const status = await new Promise<number>((resolve, reject) => {
        const st = session.request({ ':method': 'POST', ':path': '/v1/orders', ...client(), ...J });
        let code = 0;
        st.on('response', (h) => { code = Number(h[':status']); });
        st.on('error', reject);
        st.resume();
        st.on('end', () => resolve(code));
        st.end(body);
      });
      assert.equal(status, 201);
    } finally { session.close(); }
    assert.equal(backend.seen.length, seen + 2);
    assert.deepEqual(backend.seen.at(-1)!.body, payload);
    assert.equal(backend.seen.at(-1)!.headers['content-length'], String(payload.length));
  });

  test('backend slower than ORDER_BACKEND_TIMEOUT_MS → 504 backend_timeout (outcome unknown), sent once', async () => {
    backendMode = 'slow';
    try {
      const seen = backend.seen.length;
      const res = await request(envoy.edgePort, 'POST', '/v1/orders', { ...client(), ...J, 'x-envoy-upstream-rq-timeout-ms': '5000' }, order(Buffer.from('a')));
      isContractJson(res, 504, 'backend_timeout');
      assert.equal(backend.seen.length, seen + 1);
    } finally { backendMode = 'ok'; }
  });

  test('backend resets after receiving the order → 504 (outcome unknown); client retry headers are ignored', async () => {
    backendMode = 'reset';
    try {
      const seen = backend.seen.length;
      const res = await request(envoy.edgePort, 'POST', '/v1/orders',
        { ...client(), ...J, 'x-envoy-retry-on': 'reset,5xx,connect-failure', 'x-envoy-max-retries': '5' }, order(Buffer.from('b')));
      isContractJson(res, 504, 'backend_timeout');
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(backend.seen.length, seen + 1, 'exactly one attempt');
    } finally { backendMode = 'ok'; }
  });

  test('no order backend configured → 502 backend_unavailable JSON (after authz)', async () => {
    const res = await request(noBackendEnvoy.edgePort, 'POST', '/v1/orders', { ...client(), ...J }, order(Buffer.from('c')));
    isContractJson(res, 502, 'backend_unavailable');
  });

  test('backend unreachable → 502 backend_unavailable JSON (the order was not delivered)', async () => {
    await backend.close();
    const res = await request(envoy.edgePort, 'POST', '/v1/orders', { ...client(), ...J }, order(Buffer.from('d')));
    isContractJson(res, 502, 'backend_unavailable');
    assert.equal(JSON.parse(res.body).message, ERROR_MESSAGE.backend_unavailable);
  });
});
