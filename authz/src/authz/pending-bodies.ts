/**
 * The bound on ingest bodies one client address may have Envoy hold at once
 * (INGEST_MAX_PENDING_PER_CLIENT; docs/envoy.md "Bodies and memory").
 *
 * An ingest is decided twice: its header phase (before Envoy buffers the body) and its body phase
 * (once the body is whole). Between the two, Envoy holds up to INGEST_MAX_BYTES of body for it, and
 * nothing but the headers has been checked: the HMAC needs the body. So the header phase admits a
 * body only while its client has fewer than `maxPerClient` pending; a body is pending from its
 * header phase's allow until its body phase arrives (same x-request-id), or at most `ttlMs`
 * (REQUEST_BODY_TIMEOUT_MS): by then Envoy has answered 408 and dropped the body, and no body
 * phase will come. A feed sending a few ingests at a time never meets the bound; an address that
 * stalls bodies holds at most `maxPerClient` of them instead of rate × timeout.
 *
 * Per process: both Checks of one request travel over the same gRPC connection of one Envoy
 * worker, so they reach the same TS worker. If that connection is replaced between the two, the
 * slot stays taken until `ttlMs` passes (a few seconds, one slot per request in flight then).
 * With AUTHZ_WORKERS = W, one address may hold up to W × maxPerClient (docs/envoy.md).
 */
import { clientOf } from '../ratelimit/bucket.ts';

export interface PendingBodies {
  /**
   * Admits one more pending body for the client at `clientIp`, tracked under `requestId`:
   * undefined when admitted, else the milliseconds until that client's oldest pending body
   * expires (≥ 1). An address that is none, or a Check without a request id, is admitted untracked.
   */
  admit(clientIp: string, requestId: string | undefined): number | undefined;
  /** The body phase of `requestId` arrived: its slot is free (nothing when it is not pending). */
  release(requestId: string | undefined): void;
  /** Bodies pending now, all clients. */
  size(): number;
}

export interface PendingBodiesOptions {
  readonly maxPerClient: number;
  readonly ttlMs: number;
  readonly nowMs: () => number;
}

interface Entry {
  readonly id: string;
  readonly client: string;
  readonly expiresAt: number;
  live: boolean;
}

export function createPendingBodies(opts: PendingBodiesOptions): PendingBodies {
  const { maxPerClient, ttlMs, nowMs } = opts;
  const byId = new Map<string, Entry>();
  /** Each client's live entries, oldest first. */
  const byClient = new Map<string, Entry[]>();
  /** Every entry in admission order: with one TTL for all, also expiry order. */
  let queue: Entry[] = [];
  let head = 0;

  const drop = (e: Entry): void => {
    e.live = false;
    byId.delete(e.id);
    const list = byClient.get(e.client);
    if (list === undefined) return;
    const i = list.indexOf(e);
    if (i !== -1) list.splice(i, 1);
    if (list.length === 0) byClient.delete(e.client);
  };
  const sweep = (now: number): void => {
    while (head < queue.length && queue[head]!.expiresAt <= now) {
      const e = queue[head]!;
      head += 1;
      if (e.live) drop(e);
    }
    // Released entries stay in the queue until they expire; compact once half of it is spent.
    if (head > 1024 && head * 2 > queue.length) {
      queue = queue.slice(head);
      head = 0;
    }
  };

  return {
    admit(clientIp, requestId) {
      const client = clientOf(clientIp);
      if (client === undefined || requestId === undefined || requestId === '') return undefined;
      const now = nowMs();
      sweep(now);
      if (byId.has(requestId)) return undefined;
      const list = byClient.get(client);
      if (list !== undefined && list.length >= maxPerClient) return Math.max(1, list[0]!.expiresAt - now);
      const e: Entry = { id: requestId, client, expiresAt: now + ttlMs, live: true };
      byId.set(requestId, e);
      if (list === undefined) byClient.set(client, [e]);
      else list.push(e);
      queue.push(e);
      return undefined;
    },
    release(requestId) {
      if (requestId === undefined) return;
      const e = byId.get(requestId);
      if (e !== undefined) drop(e);
    },
    size() {
      sweep(nowMs());
      return byId.size;
    },
  };
}
