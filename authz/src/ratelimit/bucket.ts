/**
 * The global rate limit's state: one token bucket per client in Redis, taken atomically by one
 * Lua script (GCRA, the "generic cell rate algorithm": the bucket is a single number, the
 * theoretical arrival time TAT of the next request at the steady rate).
 *
 * Key scheme: `edge:rl:<client>`, where the client is the key Envoy's local limiter uses:
 *   - an IPv4 address as written (`edge:rl:192.0.2.7`); an IPv4-mapped IPv6 address
 *     (`::ffff:192.0.2.7`) is its IPv4;
 *   - an IPv6 address's /64, in the form Envoy's masked_remote_address writes it
 *     (`edge:rl:2001:db8:3:ffff::/64`).
 * The value is the TAT in microseconds of Redis's clock (TIME, so every replica of the edge
 * shares one clock); the key expires on its own when the bucket would be full again, so an idle
 * client costs nothing and a full bucket is "no key".
 *
 * Token-bucket semantics, the same as Envoy's local limiter: RATE_BURST tokens, refilled
 * continuously at RPS_PER_IP per second; a request of `hits` tokens (hits_addend) passes when
 * that many are left and then takes them; a refused request takes nothing.
 */
import { isIP } from 'node:net';
import type { Redis } from 'ioredis';
import { RATE_LIMIT } from '../common/contract.ts';

export const RATE_LIMIT_KEY_PREFIX = 'edge:rl:';

/**
 * What both bucket scripts start with: no replication or AOF for what follows (below), Redis's
 * clock in µs (`now`), and ARGV[1] the emission interval and ARGV[2] the burst as `interval` and
 * `capacity` (µs).
 */
const SCRIPT_PRELUDE = `
redis.replicate_commands()
redis.set_repl(redis.REPL_NONE)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2]) * interval
`;

/**
 * KEYS[1] the client's bucket; ARGV[1] the emission interval in µs (10^6 / RPS_PER_IP),
 * ARGV[2] the burst (RATE_BURST), ARGV[3] the tokens this request takes.
 * Returns {allowed 0|1, tokens left (whole), µs until the bucket is full again}.
 *
 * - `redis.set_repl(REPL_NONE)`: the bucket is neither written to the append-only file nor
 *   replicated. Its state is worth a second at most; with the AOF's fsync on every write
 *   (docs/operations.md, "Redis durability") each request would otherwise cost an fsync, and a
 *   restart or a failover only gives every client a full bucket again.
 * - TAT is written with %.0f: Lua would print a number with 14 significant digits, i.e. lose the
 *   microseconds of a 16-digit timestamp.
 */
export const TAKE_SCRIPT = `${SCRIPT_PRELUDE}local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local after = tat + tonumber(ARGV[3]) * interval
if after - now > capacity then
  return {0, math.floor((capacity - (tat - now)) / interval), math.floor(tat - now)}
end
redis.call('SET', KEYS[1], string.format('%.0f', after), 'PX', math.ceil((after - now) / 1000))
return {1, math.floor((capacity - (after - now)) / interval), math.floor(after - now)}
`;

/**
 * The same bucket for many one-token requests at once (RedisBuckets.take with hits = 1: the
 * requests that arrived while the previous batch was at Redis): KEYS the distinct clients'
 * buckets; ARGV[1] the emission interval, ARGV[2] the burst, ARGV[2 + i] how many one-token
 * requests KEYS[i] has in the batch, in arrival order.
 * Returns {now (µs of Redis's clock), then per key: tokens granted, the key's TAT before the batch}.
 *
 * Each key's requests are taken one after the other exactly as the single script takes them in
 * turn: the same test (a request passes when `tat + interval - now <= capacity`) and the TAT
 * rounded to a whole µs after each grant, as the single script stores it (`%.0f`), so a batch
 * grants exactly what the same requests sent one by one in the same microsecond would have: the
 * first `granted` pass, the rest are refused and take nothing. RedisBuckets computes each
 * request's answer from `now` and the TAT before the batch the same way (printfRound). One TIME,
 * one script, one round trip for the whole batch.
 */
export const TAKE_MANY_SCRIPT = `${SCRIPT_PRELUDE}local out = {now}
for i = 1, #KEYS do
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  local start = tat
  local want = tonumber(ARGV[i + 2])
  local granted = 0
  local last = tat
  while granted < want do
    local after = tat + interval
    if after - now > capacity then break end
    last = after
    tat = tonumber(string.format('%.0f', after))
    granted = granted + 1
  end
  if granted > 0 then
    redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', math.ceil((last - now) / 1000))
  end
  out[2 * i] = granted
  out[2 * i + 1] = start
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

/** At most this many distinct clients per TAKE_MANY_SCRIPT call (a larger batch is split). */
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

export interface Take {
  readonly allowed: boolean;
  /** Whole tokens left after this request (before it, when refused). */
  readonly remaining: number;
  /** Microseconds until the bucket is full again (0: full). */
  readonly untilFullUs: number;
}

export interface BucketLimits {
  readonly rpsPerIp: number;
  readonly rateBurst: number;
}

/** The buckets: `take` rejects when Redis cannot answer (the caller fails open). */
export interface Buckets {
  take(client: string, hits: number): Promise<Take>;
}

interface TakeCommand {
  edgeRateLimitTake(key: string, intervalUs: string, burst: number, hits: number): Promise<[number, number, number]>;
  edgeRateLimitTakeMany(...args: (string | number)[]): Promise<number[]>;
}

interface Waiter {
  resolve(t: Take): void;
  reject(err: unknown): void;
}

export class RedisBuckets implements Buckets {
  readonly #cmd: TakeCommand;
  readonly #interval: string;
  readonly #intervalUs: number;
  readonly #capacityUs: number;
  readonly #burst: number;
  /** One-token requests waiting for the next batch, per client, in arrival order. */
  #pending = new Map<string, Waiter[]>();
  /** Requests in #pending. */
  #pendingCount = 0;
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

  /**
   * Defines the scripts on `redis`: call before the client sends its first command (auto-pipelining).
   * `onCall` is told of every script call and how many requests it carries (the
   * edge_ratelimit_redis_calls_total metric); `batch`
   * is BATCH but in tests.
   */
  constructor(redis: Redis, limits: BucketLimits, onCall: (requests: number) => void = () => {}, batch: BatchPolicy = BATCH) {
    this.#onCall = onCall;
    this.#batch = batch;
    redis.defineCommand('edgeRateLimitTake', { numberOfKeys: 1, lua: TAKE_SCRIPT });
    redis.defineCommand('edgeRateLimitTakeMany', { lua: TAKE_MANY_SCRIPT });
    this.#cmd = redis as unknown as TakeCommand;
    this.#intervalUs = 1_000_000 / limits.rpsPerIp;
    this.#interval = String(this.#intervalUs);
    this.#capacityUs = limits.rateBurst * this.#intervalUs;
    this.#burst = limits.rateBurst;
  }

  /**
   * One request's `hits` tokens. A one-token request (every Check, and Envoy's ratelimit filter
   * without hits_addend) joins the next batch: the one-token requests that arrive while a batch
   * is at Redis go together, in one TAKE_MANY_SCRIPT call, when it returns (at the end of the
   * current event-loop turn when none is; under load up to BATCH.lingerMs later). The same
   * grants as one call each; one round trip per batch, and a batch grows with the load instead
   * of each request waiting its turn on the connection. More tokens at once (all or nothing) take
   * the single script.
   */
  take(client: string, hits: number): Promise<Take> {
    if (hits !== 1) {
      this.#onCall(1);
      return this.#takeSingle(client, hits);
    }
    return new Promise<Take>((resolve, reject) => {
      const waiting = this.#pending.get(client);
      if (waiting === undefined) this.#pending.set(client, [{ resolve, reject }]);
      else waiting.push({ resolve, reject });
      this.#pendingCount++;
      this.#schedule();
    });
  }

  /** Queues the next flush, if one may go: none at Redis, none queued, something waiting (BATCH). */
  #schedule(): void {
    if (this.#inFlight > 0 || this.#pendingCount === 0 || this.#scheduled) return;
    if (this.#linger !== undefined) {
      if (this.#pendingCount < this.#batch.full) return;
      clearTimeout(this.#linger);
      this.#linger = undefined;
    } else if (this.#lastSize >= this.#batch.busy && this.#pendingCount < this.#batch.full) {
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

  async #takeSingle(client: string, hits: number): Promise<Take> {
    const [allowed, remaining, untilFullUs] = await this.#cmd.edgeRateLimitTake(RATE_LIMIT_KEY_PREFIX + client, this.#interval, this.#burst, hits);
    return { allowed: allowed === 1, remaining: Math.max(0, remaining), untilFullUs };
  }

  readonly #flush = (): void => {
    this.#scheduled = false;
    const pending = this.#pending;
    this.#pending = new Map();
    this.#lastSize = this.#pendingCount;
    this.#lastSentAt = performance.now();
    this.#pendingCount = 0;
    let clients: string[] = [];
    let waiters: Waiter[][] = [];
    for (const [client, w] of pending) {
      clients.push(client);
      waiters.push(w);
      if (clients.length === TAKE_MANY_MAX_KEYS) {
        this.#send(clients, waiters);
        clients = [];
        waiters = [];
      }
    }
    if (clients.length > 0) this.#send(clients, waiters);
  };

  #send(clients: readonly string[], waiters: readonly Waiter[][]): void {
    const args: (string | number)[] = [clients.length];
    for (const c of clients) args.push(RATE_LIMIT_KEY_PREFIX + c);
    args.push(this.#interval, this.#burst);
    for (const w of waiters) args.push(w.length);
    let requests = 0;
    for (const w of waiters) requests += w.length;
    this.#onCall(requests);
    this.#inFlight++;
    this.#cmd.edgeRateLimitTakeMany(...args).then((out) => {
      this.#inFlight--;
      this.#schedule();
      const now = out[0]!;
      for (let i = 0; i < waiters.length; i++) this.#answer(waiters[i]!, out[2 * i + 1]!, out[2 * i + 2]!, now);
    }, (err: unknown) => {
      this.#inFlight--;
      this.#schedule();
      for (const w of waiters) for (const x of w) x.reject(err);
    });
  }

  /**
   * Each waiter's answer, as the single script would have given it in turn (the same
   * arithmetic from the TAT before the batch and Redis's `now`): the first `granted` pass with
   * what they left; the rest are refused with what the last grant left.
   */
  #answer(waiters: readonly Waiter[], granted: number, start: number, now: number): void {
    const interval = this.#intervalUs;
    const capacity = this.#capacityUs;
    let tat = start;
    for (let j = 0; j < waiters.length; j++) {
      if (j < granted) {
        const after = tat + interval;
        waiters[j]!.resolve({ allowed: true, remaining: Math.max(0, Math.floor((capacity - (after - now)) / interval)), untilFullUs: Math.floor(after - now) });
        tat = printfRound(after);
      } else {
        waiters[j]!.resolve({ allowed: false, remaining: Math.max(0, Math.floor((capacity - (tat - now)) / interval)), untilFullUs: Math.floor(tat - now) });
      }
    }
  }
}

/** The eight 16-bit groups of an IPv6 address (an embedded dotted IPv4 tail included). */
function v6Groups(address: string): number[] | undefined {
  let s = address.toLowerCase();
  const zone = s.indexOf('%');
  if (zone !== -1) s = s.slice(0, zone);
  const lastColon = s.lastIndexOf(':');
  const tail = s.slice(lastColon + 1);
  if (tail.includes('.')) {
    const o = tail.split('.').map(Number);
    if (o.length !== 4 || o.some((x) => !(x >= 0 && x <= 255))) return undefined;
    s = `${s.slice(0, lastColon + 1)}${((o[0]! << 8) | o[1]!).toString(16)}:${((o[2]! << 8) | o[3]!).toString(16)}`;
  }
  const halves = s.split('::');
  if (halves.length > 2) return undefined;
  const parse = (part: string | undefined): number[] => (part === undefined || part === '' ? [] : part.split(':').map((g) => parseInt(g, 16)));
  const head = parse(halves[0]);
  const rest = parse(halves[1]);
  const groups = halves.length === 2 ? [...head, ...Array<number>(8 - head.length - rest.length).fill(0), ...rest] : head;
  return groups.length === 8 && groups.every((g) => g >= 0 && g <= 0xffff) ? groups : undefined;
}

/** `2001:db8:3:ffff::/64`: the /64 of an address in Envoy's (RFC 5952) form. */
function prefix64(groups: readonly number[]): string {
  const first = groups.slice(0, 4);
  while (first.length > 0 && first.at(-1) === 0) first.pop();
  return `${first.map((g) => g.toString(16)).join(':')}::/${RATE_LIMIT.v6PrefixLength}`;
}

/**
 * The bucket's client for an address: an IPv4 address itself, an IPv4-mapped one its IPv4,
 * another IPv6 address its /64. Accepts a masked value (`2001:db8::/64`, as Envoy sends it) too;
 * undefined for anything that is not an address.
 */
export function clientOf(value: string): string | undefined {
  const slash = value.indexOf('/');
  const address = slash === -1 ? value : value.slice(0, slash);
  const family = isIP(address);
  if (family === 4) return address;
  if (family !== 6) return undefined;
  const g = v6Groups(address);
  if (g === undefined) return undefined;
  if (g[0] === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0 && g[5] === 0xffff) {
    return `${g[6]! >> 8}.${g[6]! & 255}.${g[7]! >> 8}.${g[7]! & 255}`;
  }
  return prefix64(g);
}

export interface Entry {
  readonly key: string;
  readonly value: string;
}

/**
 * The client a descriptor limits: `[client=v4, client_ip=<address>]` or
 * `[client=v6, masked_remote_address=<prefix>]` (contract.ts RATE_LIMIT); undefined for any other
 * descriptor, which this service does not limit.
 */
export function descriptorClient(entries: readonly Entry[]): string | undefined {
  if (entries.length !== 2 || entries[0]!.key !== RATE_LIMIT.familyKey) return undefined;
  const [family, address] = [entries[0]!.value, entries[1]!];
  if (family === RATE_LIMIT.v4 && address.key === RATE_LIMIT.v4AddressKey) return clientOf(address.value);
  if (family === RATE_LIMIT.v6 && address.key === RATE_LIMIT.v6AddressKey) return clientOf(address.value);
  return undefined;
}
