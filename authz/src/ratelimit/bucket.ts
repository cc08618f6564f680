/**
 * The global rate limit's state: token buckets in Redis, taken atomically by one Lua script
 * (GCRA, the "generic cell rate algorithm": a bucket is a single number, the theoretical arrival
 * time TAT of the next request at the steady rate).
 *
 * Two kinds of bucket, the keys Envoy's local limiter uses:
 *   - the client's, `edge:rl:<client>`: an IPv4 address as written (`edge:rl:192.0.2.7`; an
 *     IPv4-mapped IPv6 address `::ffff:192.0.2.7` is its IPv4), an IPv6 address's /64 in the form
 *     Envoy's masked_remote_address writes it (`edge:rl:2001:db8:3:ffff::/64`): RATE_BURST tokens
 *     refilled at RPS_PER_IP per second;
 *   - an IPv6 client's prefix's, `edge:rl:<prefix>` (RATE_PREFIX_V6, default 48:
 *     `edge:rl:2001:db8:3::/48`): PREFIX_BURST tokens refilled at RPS_PER_PREFIX, shared by every
 *     /64 of one subscriber's allocation. An IPv4 client has none (docs/api.md "Client address,
 *     geo and rate limit"). The two kinds cannot collide: a prefix is shorter than /64.
 * The value is the TAT in microseconds of Redis's clock (TIME, so every replica of the edge
 * shares one clock); the key expires on its own when the bucket would be full again, so an idle
 * client costs nothing and a full bucket is "no key".
 *
 * Token-bucket semantics, the same as Envoy's local limiter: a request of `hits` tokens
 * (hits_addend) passes when its client's bucket and its prefix's bucket both have that many left,
 * and then takes them from both; a refused request takes nothing from either. All or nothing, in
 * one script: a /64 over its own limit spends none of its siblings' prefix budget, and a request the
 * prefix refuses costs its client nothing (Envoy's local stage differs here: docs/envoy.md §3).
 */
import { isIP } from 'node:net';
import type { Redis } from 'ioredis';
import { RATE_LIMIT } from '../common/contract.ts';
import { canonicalAddress, ipv6Groups, mappedIpv4, prefixOf } from '../common/ip.ts';

export const RATE_LIMIT_KEY_PREFIX = 'edge:rl:';

/**
 * One batch of requests against the buckets, in arrival order (RedisBuckets.take: the requests
 * that arrived while the previous batch was at Redis). KEYS: the distinct buckets of the batch
 * (at most TAKE_MANY_MAX_KEYS). ARGV[1] the client bucket's emission interval in µs
 * (10^6 / RPS_PER_IP), ARGV[2] its burst (RATE_BURST), ARGV[3] and ARGV[4] the prefix bucket's
 * (RPS_PER_PREFIX, PREFIX_BURST); then two per run of identical consecutive requests:
 * `c × 512 + p` (c the index in KEYS of the client's bucket, p of the prefix's, 0: none) and how
 * many one-token requests the run holds (negative: one request of that many tokens,
 * hits_addend). A run keeps one busy client's requests to two arguments (the benchmark's one
 * client: 2 instead of one per request).
 * Returns {now (µs of Redis's clock), each key's TAT before the batch (KEYS order), then per run
 * how many of its requests were granted (the first ones: identical requests, tokens only go)}.
 *
 * - A request passes when every bucket it names has the tokens (`tat + hits × interval - now <=
 *   capacity`); then each takes them, the TAT rounded to a whole µs as it is stored (%.0f), so the
 *   next request of the batch sees exactly what it would see in a call of its own. A refused
 *   request takes nothing. One TIME, one round trip for the whole batch; each key read once and
 *   written once.
 * - `redis.set_repl(REPL_NONE)`: buckets are neither written to the append-only file nor
 *   replicated. Their state is worth a second at most; with the AOF's fsync on every write
 *   (docs/operations.md, "Redis durability") each request would otherwise cost an fsync, and a
 *   restart or a failover only gives every client a full bucket again.
 * - TAT is written with %.0f: Lua would print a number with 14 significant digits, i.e. lose the
 *   microseconds of a 16-digit timestamp.
 * RedisBuckets computes each request's answer (tokens left, time to full) from `now`, the TATs
 * before the batch and the grants, with the same arithmetic (printfRound).
 */
export const TAKE_MANY_SCRIPT = `
redis.replicate_commands()
redis.set_repl(redis.REPL_NONE)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ci, pi = tonumber(ARGV[1]), tonumber(ARGV[3])
local ccap, pcap = tonumber(ARGV[2]) * ci, tonumber(ARGV[4]) * pi
local tat, last, out = {}, {}, {now}
for k = 1, #KEYS do
  local v = tonumber(redis.call('GET', KEYS[k])) or now
  if v < now then v = now end
  tat[k] = v
  out[k + 1] = v
end
local n = #KEYS + 1
for a = 5, #ARGV, 2 do
  local code, count = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local c, p = math.floor(code / 512), code % 512
  local hits = 1
  if count < 0 then hits, count = -count, 1 end
  local granted = 0
  while granted < count do
    local ca = tat[c] + hits * ci
    if ca - now > ccap then break end
    local pa
    if p > 0 then
      pa = tat[p] + hits * pi
      if pa - now > pcap then break end
    end
    last[c] = ca
    tat[c] = tonumber(string.format('%.0f', ca))
    if p > 0 then
      last[p] = pa
      tat[p] = tonumber(string.format('%.0f', pa))
    end
    granted = granted + 1
  end
  n = n + 1
  out[n] = granted
end
for k = 1, #KEYS do
  if last[k] then redis.call('SET', KEYS[k], string.format('%.0f', tat[k]), 'PX', math.ceil((last[k] - now) / 1000)) end
end
return out
`;

/**
 * A number rounded to a whole number as C's `printf("%.0f")` (Lua's string.format) rounds it:
 * to the nearest, a tie to the even neighbour.
 */
export function printfRound(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** At most this many distinct buckets per TAKE_MANY_SCRIPT call (a larger batch is split; under 512, the script's index packing). */
export const TAKE_MANY_MAX_KEYS = 256;

/**
 * Batching under load. While the previous call carried at least `busy` requests (the load is
 * high), the next call is sent when it holds `full` requests or `lingerMs` after the previous one
 * was sent, whichever comes first; otherwise a request goes at the end of its event-loop turn.
 * Each call costs the TS process ~40 µs and Redis ~65 µs of CPU (system calls on the loopback
 * socket, Redis waking), whatever it carries: at 1,000 req/s a call carries about one request
 * and waits for nothing; at saturation the wait makes calls carry ~2× more (docs/envoy.md §3).
 */
export const BATCH: BatchPolicy = { busy: 4, full: 16, lingerMs: 2 };

export interface BatchPolicy {
  readonly busy: number;
  readonly full: number;
  readonly lingerMs: number;
}

/** One bucket after a request: whole tokens left (after it when granted, before it when refused), µs until full (0: full). */
export interface BucketState {
  readonly remaining: number;
  readonly untilFullUs: number;
}

/** The answer to one request: the client's bucket (remaining, untilFullUs) and, for an IPv6 client, its prefix's. */
export interface Take extends BucketState {
  readonly allowed: boolean;
  /** The prefix's bucket; undefined when the request had none (IPv4, or RATE_PREFIX_V6=64). */
  readonly prefix?: BucketState;
}

/** The two buckets' settings (Config has them all). */
export interface BucketLimits {
  readonly rpsPerIp: number;
  readonly rateBurst: number;
  /** RATE_PREFIX_V6: the prefix bucket's length (64: none). */
  readonly ratePrefixV6: number;
  readonly rpsPerPrefix: number;
  readonly prefixBurst: number;
}

/**
 * The bucket an answer's x-ratelimit-* headers describe (docs/api.md): on a refusal the one that
 * refused (both: the one whose next token comes later, since the request needs both); on a grant
 * the one with fewer whole tokens left (a tie: the client's).
 */
export function tighter(t: Take, hits: number, limits: BucketLimits): 'client' | 'prefix' {
  const p = t.prefix;
  if (p === undefined) return 'client';
  if (t.allowed) return p.remaining < t.remaining ? 'prefix' : 'client';
  const clientOut = t.remaining < hits;
  const prefixOut = p.remaining < hits;
  if (clientOut && prefixOut) return nextTokenUs(p, limits.rpsPerPrefix) > nextTokenUs(t, limits.rpsPerIp) ? 'prefix' : 'client';
  return prefixOut ? 'prefix' : 'client';
}

/** Microseconds until a bucket refilled at `rps` has one more whole token (0 when full). */
export function nextTokenUs(b: BucketState, rps: number): number {
  if (b.untilFullUs <= 0) return 0;
  const intervalUs = 1_000_000 / rps;
  const part = b.untilFullUs % intervalUs;
  return part > 0 ? part : intervalUs;
}

/** The buckets: `take` rejects when Redis cannot answer (the caller fails open). */
export interface Buckets {
  /** `hits` tokens from `client`'s bucket and, when given, from `prefix`'s: both or neither. */
  take(client: string, hits: number, prefix?: string): Promise<Take>;
  /**
   * One token from a lease this process holds for `client` (LeasePolicy), at once, without Redis;
   * undefined when it holds none (then `take` asks Redis).
   */
  takeLeased?(client: string, prefix?: string): Take | undefined;
}

/**
 * Token leases (RATE_LEASE_TOKENS, RATE_LEASE_MS; docs/envoy.md §3 "Token leases"). A Redis call
 * for a busy client also buys up to `tokens` tokens more than its waiting requests need (the same
 * script, the same both-or-neither test per token, after every request of the batch: a lease only
 * takes what the batch left); this process hands them out without Redis until they are spent or
 * `ms` after the call that bought them was sent, then they are void (never given back).
 * - Size: a client's first call buys none; each further call within `ms` of its previous one
 *   doubles what it buys (1, 2, 4, … up to `tokens`); a call after a quiet `ms` buys none again.
 *   So a client that sends one request now and then costs exactly what it did without leases, and
 *   one that keeps a process busy is served from its lease almost always.
 * - Bound: a process holds at most `tokens` unspent tokens per client, all bought within the last
 *   `ms`; so across N processes a client gets at most
 *   `burst + rate × t + min(N × tokens, rate × ms / 1000)` in any t seconds (the tokens held
 *   at the start of the window, or everything bought within `ms` before it).
 * - The other side: tokens one process holds are missing to the others until spent or void
 *   (at most `tokens` per process and client, for at most `ms`).
 */
export interface LeasePolicy {
  /** Most tokens a call buys beyond its requests, and most a process holds per client; 0: no leases. */
  readonly tokens: number;
  /** How long bought tokens stay good, from the moment the call that bought them was sent. */
  readonly ms: number;
}

export const NO_LEASES: LeasePolicy = Object.freeze({ tokens: 0, ms: 0 });

/** What this process knows of one client (by its bucket key): its lease and its demand. */
interface Lease {
  readonly prefix: string | undefined;
  /** Tokens bought and not handed out yet. */
  tokens: number;
  /** performance.now() from which the unspent tokens are void. */
  expiresAt: number;
  /** performance.now() when the last call for this client was sent. */
  calledAt: number;
  /** The extra tokens the last call bought (LeasePolicy: doubling). */
  size: number;
  /** The buckets after the last token bought, and when the call that bought it was sent (a leased answer's headers). */
  base: Take | undefined;
  boughtAt: number;
}

/** A bucket as a leased answer describes it: `base` (after the last token bought) with `held` tokens not yet spent and `elapsedUs` of refill since. */
function heldState(b: BucketState, held: number, elapsedUs: number, interval: number, capacity: number): BucketState {
  const untilFull = Math.max(0, b.untilFullUs - held * interval - elapsedUs);
  return { remaining: Math.max(0, Math.floor((capacity - untilFull) / interval)), untilFullUs: Math.floor(untilFull) };
}

interface TakeCommand {
  edgeRateLimitTakeMany(...args: (string | number)[]): Promise<number[]>;
}

/** A request waiting for the next batch. */
interface Pending {
  readonly client: string;
  readonly prefix: string | undefined;
  readonly hits: number;
  resolve(t: Take): void;
  reject(err: unknown): void;
}

export class RedisBuckets implements Buckets {
  readonly #cmd: TakeCommand;
  readonly #limitArgs: readonly string[];
  readonly #client: { readonly interval: number; readonly capacity: number };
  readonly #prefix: { readonly interval: number; readonly capacity: number };
  /** Requests waiting for the next batch, in arrival order. */
  #pending: Pending[] = [];
  /** A flush is queued (setImmediate). */
  #scheduled = false;
  /** The linger timer (BATCH), when the next flush waits for more requests. */
  #linger: NodeJS.Timeout | undefined;
  /** Requests the previous flush carried, and when it was sent (performance.now()). */
  #lastSize = 0;
  #lastSentAt = 0;
  /** Batches sent and not yet answered (a split batch is several calls). */
  #inFlight = 0;
  readonly #onCall: (requests: number) => void;
  readonly #batch: BatchPolicy;
  readonly #lease: LeasePolicy;
  /** Leases and demand per client bucket key (only with leases; swept every `max(ms, 1 s)`). */
  readonly #leases = new Map<string, Lease>();

  /**
   * Defines the script on `redis`: call before the client sends its first command (auto-pipelining).
   * `onCall` is told of every script call and how many requests it carries (the
   * edge_ratelimit_redis_calls_total metric); `batch`
   * is BATCH but in tests; `lease`: token leases (Config rateLeaseTokens/rateLeaseMs), none by default.
   */
  constructor(redis: Redis, limits: BucketLimits, onCall: (requests: number) => void = () => {}, batch: BatchPolicy = BATCH, lease: LeasePolicy = NO_LEASES) {
    this.#onCall = onCall;
    this.#batch = batch;
    this.#lease = lease;
    if (lease.tokens > 0) {
      // Forget clients quiet for `ms` whose lease is void: their next call buys none anyway.
      setInterval(() => {
        const now = performance.now();
        for (const [k, l] of this.#leases) if (now - l.calledAt >= lease.ms && now >= l.expiresAt) this.#leases.delete(k);
      }, Math.max(lease.ms, 1000)).unref();
    }
    redis.defineCommand('edgeRateLimitTakeMany', { lua: TAKE_MANY_SCRIPT });
    this.#cmd = redis as unknown as TakeCommand;
    const clientInterval = 1_000_000 / limits.rpsPerIp;
    const prefixInterval = 1_000_000 / limits.rpsPerPrefix;
    this.#client = { interval: clientInterval, capacity: limits.rateBurst * clientInterval };
    this.#prefix = { interval: prefixInterval, capacity: limits.prefixBurst * prefixInterval };
    this.#limitArgs = [String(clientInterval), String(limits.rateBurst), String(prefixInterval), String(limits.prefixBurst)];
  }

  /**
   * One request's `hits` tokens from its client's bucket and its prefix's (when given), in the
   * next batch: the requests that arrive while a batch is at Redis go together, in one
   * TAKE_MANY_SCRIPT call, when it returns (at the end of the current event-loop turn when none
   * is; under load up to BATCH.lingerMs later). The same grants as one call each, in arrival
   * order; one round trip per batch, and a batch grows with the load instead of each request
   * waiting its turn on the connection.
   */
  take(client: string, hits: number, prefix?: string): Promise<Take> {
    if (hits === 1 && this.#lease.tokens > 0) {
      const t = this.takeLeased(client, prefix);
      if (t !== undefined) return Promise.resolve(t);
    }
    return new Promise<Take>((resolve, reject) => {
      this.#pending.push({ client, prefix, hits, resolve, reject });
      this.#schedule();
    });
  }

  /**
   * One token from this process's lease for `client` (its prefix follows from it), at once;
   * undefined when none is held or it is void. The answer describes the buckets as Redis left
   * them after the lease was bought, with the tokens still held counted as not taken, plus the
   * refill since (so one process's client sees what it would without leases, up to `ms` late).
   */
  takeLeased(client: string, _prefix?: string): Take | undefined {
    const l = this.#leases.get(client);
    if (l === undefined || l.tokens === 0) return undefined;
    const now = performance.now();
    if (now >= l.expiresAt) {
      l.tokens = 0;
      return undefined;
    }
    l.tokens--;
    const base = l.base!;
    const elapsedUs = (now - l.boughtAt) * 1000;
    const client_ = heldState(base, l.tokens, elapsedUs, this.#client.interval, this.#client.capacity);
    if (base.prefix === undefined) return { allowed: true, remaining: client_.remaining, untilFullUs: client_.untilFullUs };
    const prefix = heldState(base.prefix, l.tokens, elapsedUs, this.#prefix.interval, this.#prefix.capacity);
    return { allowed: true, remaining: client_.remaining, untilFullUs: client_.untilFullUs, prefix };
  }

  /** Extra tokens the call sent now buys for `client` (LeasePolicy: doubling within `ms`, else none). */
  #leaseSize(client: string, prefix: string | undefined, now: number): number {
    const l = this.#leases.get(client);
    if (l === undefined) {
      this.#leases.set(client, { prefix, tokens: 0, expiresAt: 0, calledAt: now, size: 0, base: undefined, boughtAt: 0 });
      return 0;
    }
    const held = now < l.expiresAt ? l.tokens : 0;
    l.size = now - l.calledAt < this.#lease.ms ? Math.min(this.#lease.tokens, Math.max(1, l.size * 2)) : 0;
    l.calledAt = now;
    return Math.max(0, l.size - held);
  }

  /** Queues the next flush, if one may go: none at Redis, none queued, something waiting (BATCH). */
  #schedule(): void {
    const waiting = this.#pending.length;
    if (this.#inFlight > 0 || waiting === 0 || this.#scheduled) return;
    if (this.#linger !== undefined) {
      if (waiting < this.#batch.full) return;
      clearTimeout(this.#linger);
      this.#linger = undefined;
    } else if (this.#lastSize >= this.#batch.busy && waiting < this.#batch.full) {
      const wait = this.#lastSentAt + this.#batch.lingerMs - performance.now();
      if (wait > 0) {
        this.#linger = setTimeout(this.#lingered, wait);
        return;
      }
    }
    this.#scheduled = true;
    setImmediate(this.#flush);
  }

  readonly #lingered = (): void => {
    this.#linger = undefined;
    this.#flush();
  };

  readonly #flush = (): void => {
    this.#scheduled = false;
    let pending = this.#pending;
    this.#pending = [];
    if (this.#lease.tokens > 0) {
      // Requests that waited while their client's lease was being bought are served from it.
      pending = pending.filter((r) => {
        const t = r.hits === 1 ? this.takeLeased(r.client, r.prefix) : undefined;
        if (t === undefined) return true;
        r.resolve(t);
        return false;
      });
      if (pending.length === 0) return;
    }
    this.#lastSize = pending.length;
    this.#lastSentAt = performance.now();
    let keys = new Map<string, number>();
    let from = 0;
    for (let i = 0; i < pending.length; i++) {
      const r = pending[i]!;
      const adds = (keys.has(r.client) ? 0 : 1) + (r.prefix === undefined || keys.has(r.prefix) ? 0 : 1);
      if (keys.size + adds > TAKE_MANY_MAX_KEYS) {
        this.#send(keys, pending.slice(from, i));
        keys = new Map();
        from = i;
      }
      if (!keys.has(r.client)) keys.set(r.client, keys.size + 1);
      if (r.prefix !== undefined && !keys.has(r.prefix)) keys.set(r.prefix, keys.size + 1);
    }
    this.#send(keys, from === 0 ? pending : pending.slice(from));
  };

  /** One script call: `keys` (bucket → its 1-based index in KEYS) and the requests naming them. */
  #send(keys: ReadonlyMap<string, number>, requests: readonly Pending[]): void {
    const args: (string | number)[] = [keys.size];
    for (const k of keys.keys()) args.push(RATE_LIMIT_KEY_PREFIX + k);
    args.push(...this.#limitArgs);
    // Runs of identical consecutive one-token requests: [c × 512 + p, count] (TAKE_MANY_SCRIPT).
    const runs: number[] = [];
    let previous = -1;
    for (const r of requests) {
      const code = keys.get(r.client)! * 512 + (r.prefix === undefined ? 0 : keys.get(r.prefix)!);
      if (r.hits === 1 && code === previous) {
        (args[args.length - 1] as number)++;
        runs[runs.length - 1]!++;
        continue;
      }
      args.push(code, r.hits === 1 ? 1 : -r.hits);
      runs.push(1);
      previous = r.hits === 1 ? code : -1;
    }
    // Leases: after every request of the batch, a run of extra one-token takes per client that
    // asked for one token (LeasePolicy), answered with how many were granted.
    const sentAt = performance.now();
    const extras: { client: string; prefix: string | undefined }[] = [];
    if (this.#lease.tokens > 0) {
      const seen = new Set<string>();
      for (const r of requests) {
        if (r.hits !== 1 || seen.has(r.client)) continue;
        seen.add(r.client);
        const n = this.#leaseSize(r.client, r.prefix, sentAt);
        if (n === 0) continue;
        args.push(keys.get(r.client)! * 512 + (r.prefix === undefined ? 0 : keys.get(r.prefix)!), n);
        extras.push({ client: r.client, prefix: r.prefix });
      }
    }
    this.#onCall(requests.length);
    this.#inFlight++;
    this.#cmd.edgeRateLimitTakeMany(...args).then((out) => {
      this.#inFlight--;
      this.#schedule();
      const tat = this.#answer(keys, requests, runs, out);
      if (extras.length > 0) this.#bought(keys, runs.length, extras, out, sentAt, tat);
    }, (err: unknown) => {
      this.#inFlight--;
      this.#schedule();
      for (const r of requests) r.reject(err);
    });
  }

  /**
   * Each request's answer, as the script decided it (the grants) and with its arithmetic: from
   * Redis's `now` and each key's TAT before the batch, the requests in order, every grant moving
   * its buckets' TATs on (rounded as stored).
   */
  #answer(keys: ReadonlyMap<string, number>, requests: readonly Pending[], runs: readonly number[], out: readonly number[]): number[] {
    const now = out[0]!;
    const tat = out.slice(0, keys.size + 1);
    const c = this.#client;
    const p = this.#prefix;
    let run = 0;
    let inRun = 0;
    for (let i = 0; i < requests.length; i++, inRun++) {
      if (inRun === runs[run]) {
        run++;
        inRun = 0;
      }
      const r = requests[i]!;
      const granted = inRun < out[keys.size + 1 + run]!;
      const ci = keys.get(r.client)!;
      const client = state(tat, ci, r.hits, granted, now, c.interval, c.capacity);
      if (r.prefix === undefined) {
        r.resolve({ allowed: granted, remaining: client.remaining, untilFullUs: client.untilFullUs });
        continue;
      }
      const prefix = state(tat, keys.get(r.prefix)!, r.hits, granted, now, p.interval, p.capacity);
      r.resolve({ allowed: granted, remaining: client.remaining, untilFullUs: client.untilFullUs, prefix });
    }
    return tat;
  }

  /**
   * The leases a call bought (`extras`, its runs after the `runs` of its requests): each run's
   * grants, the buckets after the last (the script's arithmetic on `tat`, the TATs as the call's
   * requests left them: #answer's).
   * Tokens still held from before keep their own expiry (a lease never outlives `ms`).
   */
  #bought(keys: ReadonlyMap<string, number>, runs: number, extras: readonly { client: string; prefix: string | undefined }[], out: readonly number[], sentAt: number, tat: number[]): void {
    const now = out[0]!;
    const c = this.#client;
    const p = this.#prefix;
    for (let j = 0; j < extras.length; j++) {
      const e = extras[j]!;
      const granted = out[keys.size + 1 + runs + j]!;
      const l = this.#leases.get(e.client);
      if (granted === 0 || l === undefined) continue;
      const ci = keys.get(e.client)!;
      const pi = e.prefix === undefined ? 0 : keys.get(e.prefix)!;
      let client: BucketState | undefined;
      let prefix: BucketState | undefined;
      for (let g = 0; g < granted; g++) {
        client = state(tat, ci, 1, true, now, c.interval, c.capacity);
        if (pi > 0) prefix = state(tat, pi, 1, true, now, p.interval, p.capacity);
      }
      const held = performance.now() < l.expiresAt ? l.tokens : 0;
      if (held === 0) l.expiresAt = sentAt + this.#lease.ms;
      l.tokens = held + granted;
      l.base = prefix === undefined ? { allowed: true, ...client! } : { allowed: true, ...client!, prefix };
      l.boughtAt = sentAt;
    }
  }

}

/** One bucket's state after a request (granted: moves `tat[k]` on as the script stores it). */
function state(tat: number[], k: number, hits: number, granted: boolean, now: number, interval: number, capacity: number): BucketState {
  const before = tat[k]!;
  if (!granted) return { remaining: Math.max(0, Math.floor((capacity - (before - now)) / interval)), untilFullUs: Math.floor(before - now) };
  const after = before + hits * interval;
  tat[k] = printfRound(after);
  return { remaining: Math.max(0, Math.floor((capacity - (after - now)) / interval)), untilFullUs: Math.floor(after - now) };
}

/** The groups of an address or a masked value (`2001:db8::/64`); undefined for an IPv4 or no address. */
function groupsOf(value: string): number[] | undefined {
  const slash = value.indexOf('/');
  const address = slash === -1 ? value : value.slice(0, slash);
  return isIP(address) === 6 ? ipv6Groups(address) : undefined;
}

/**
 * The bucket's client for an address: an IPv4 address itself, an IPv4-mapped one its IPv4,
 * another IPv6 address its /64. Accepts a masked value (`2001:db8::/64`, as Envoy sends it) too;
 * undefined for anything that is not an address.
 */
export function clientOf(value: string): string | undefined {
  const slash = value.indexOf('/');
  // An address that embeds an IPv4 (6to4, NAT64, SIIT, Teredo) is that IPv4's client (common/ip.ts);
  // a masked value (Envoy's /64) no longer holds one.
  const address = slash === -1 ? canonicalAddress(value) : value.slice(0, slash);
  const family = isIP(address);
  if (family === 4) return address;
  if (family !== 6) return undefined;
  const g = ipv6Groups(address);
  if (g === undefined) return undefined;
  return mappedIpv4(g) ?? prefixOf(g, RATE_LIMIT.v6PrefixLength);
}

/** The buckets one request takes: its client's and, for an IPv6 client, its prefix's. */
export interface ClientKey {
  readonly client: string;
  readonly prefix: string | undefined;
}

/**
 * The keys for an address (x-edge-client-ip), built once for RATE_PREFIX_V6: clientOf's client
 * and, for an IPv6 client (not IPv4-mapped), its prefix of `prefixLength` bits; no prefix when
 * `prefixLength` is 64 (it would be the client itself). Undefined for anything that is not an address.
 */
export function clientKeys(prefixLength: number): (address: string) => ClientKey | undefined {
  const withPrefix = prefixLength < RATE_LIMIT.v6PrefixLength;
  return (raw) => {
    // An embedded IPv4 (6to4, NAT64, SIIT, Teredo) takes that IPv4's bucket (common/ip.ts).
    const address = canonicalAddress(raw);
    const family = isIP(address);
    if (family === 4) return { client: address, prefix: undefined };
    if (family !== 6) return undefined;
    // canonicalAddress has made an IPv4-mapped address its IPv4: this is an IPv6 client.
    const g = ipv6Groups(address);
    if (g === undefined) return undefined;
    return { client: prefixOf(g, RATE_LIMIT.v6PrefixLength), prefix: withPrefix ? prefixOf(g, prefixLength) : undefined };
  };
}

export interface Entry {
  readonly key: string;
  readonly value: string;
}

/**
 * The client a descriptor limits: `[client=v4, client_ip=<address>]` or
 * `[client=v6, masked_remote_address=<prefix>]` (contract.ts RATE_LIMIT); undefined for any other
 * descriptor, which this service does not limit as a client.
 */
export function descriptorClient(entries: readonly Entry[]): string | undefined {
  if (entries.length !== 2 || entries[0]!.key !== RATE_LIMIT.familyKey) return undefined;
  const [family, address] = [entries[0]!.value, entries[1]!];
  if (family === RATE_LIMIT.v4 && address.key === RATE_LIMIT.v4AddressKey) return clientOf(address.value);
  if (family === RATE_LIMIT.v6 && address.key === RATE_LIMIT.v6AddressKey) return clientOf(address.value);
  return undefined;
}

/**
 * The buckets a client descriptor takes (descriptorClient's client, and for an IPv6 client its
 * prefix of `prefixLength` bits, as clientKeys derives them); undefined for any other descriptor.
 */
export function descriptorKeys(entries: readonly Entry[], prefixLength: number): ClientKey | undefined {
  const client = descriptorClient(entries);
  if (client === undefined) return undefined;
  if (prefixLength >= RATE_LIMIT.v6PrefixLength || !client.includes(':')) return { client, prefix: undefined };
  return { client, prefix: prefixOf(groupsOf(client)!, prefixLength) };
}

/**
 * The prefix a descriptor names: `[prefix=v6, masked_remote_address=<prefix>]`, re-masked to
 * `prefixLength` bits in the form clientKeys writes; undefined for any other descriptor, an
 * IPv4(-mapped) address, or with no prefix bucket (64).
 */
export function descriptorPrefix(entries: readonly Entry[], prefixLength: number): string | undefined {
  if (prefixLength >= RATE_LIMIT.v6PrefixLength || entries.length !== 2) return undefined;
  if (entries[0]!.key !== RATE_LIMIT.prefixKey || entries[0]!.value !== RATE_LIMIT.v6 || entries[1]!.key !== RATE_LIMIT.v6AddressKey) return undefined;
  const g = groupsOf(entries[1]!.value);
  return g === undefined || mappedIpv4(g) !== undefined ? undefined : prefixOf(g, prefixLength);
}
