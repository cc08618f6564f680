/**
 * GET /v1/geoblock (docs/api.md "GET /v1/geoblock"): the caller's tier, so a client
 * can tell its user before it tries. Envoy routes GET/HEAD /v1/geoblock here with ext_authz
 * allowing it whatever the geo verdict (a blocked client asks precisely to learn that it is
 * blocked); the classification is the authz service's own (stages/geo.ts, the same settings and
 * the same GeoDatabase object, in the same process), applied to the address Envoy computed.
 */
import type { IncomingMessage } from 'node:http';
import { HEADER } from '../common/contract.ts';
import type { GeoResult } from '../authz/stages/geo.ts';
import { normalizeIp } from '../common/ip.ts';

/** The client address: `x-edge-client-ip` (Envoy always overwrites it), else the TCP peer (a direct request). */
export function clientAddress(req: IncomingMessage): string {
  const h = req.headers[HEADER.clientIp];
  const raw = typeof h === 'string' ? h : req.socket.remoteAddress ?? '';
  const ip = normalizeIp(raw);
  return ip === '' ? raw : ip;
}

/** The geoblock body: `{blocked, access, country, region, ip, policy}` (`policy`: the version in force, when the classifier has one). */
export function geoblockBody(geo: GeoResult, ip: string): string {
  return JSON.stringify({ blocked: geo.access === 'blocked', access: geo.access, country: geo.country, region: geo.region, ip, ...(geo.policy === undefined ? {} : { policy: geo.policy }) });
}
