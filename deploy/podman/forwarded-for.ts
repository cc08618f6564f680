/**
 * A preload for scripts/edge-client.ts when it talks to the pod from the host (docs/deploy.md §4,
 * "Run the pod locally with Podman"):
 *
 *   EDGE_CLIENT_XFF=8.8.8.8 scripts/node --import ./deploy/podman/forwarded-for.ts scripts/edge-client.ts demo-ingest 0xdemo --url …
 *
 * Every request the process sends carries `X-Forwarded-For: $EDGE_CLIENT_XFF`, the entry the load
 * balancer in front of the pod appends (the pod trusts one hop: XFF_NUM_TRUSTED_HOPS=1). Without
 * it the client address is the TCP peer, the podman network's gateway, which no GeoIP database
 * places anywhere: GEO_UNKNOWN=block answers 451 (GEO_TRUSTED_CIDRS is empty in the pod).
 */
const xff = process.env['EDGE_CLIENT_XFF'];
if (xff === undefined || xff.trim() === '') throw new Error('EDGE_CLIENT_XFF (the client address the load balancer would append) is required');
const send = globalThis.fetch;
globalThis.fetch = (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
  const headers = new Headers(init?.headers);
  headers.set('x-forwarded-for', xff);
  return send(input, { ...init, headers });
};
