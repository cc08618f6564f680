/**
 * Envoy's memory budget: the one place where the local-limit descriptor cap, the downstream
 * connection cap, the overload manager's heap bound and thresholds and the Envoy container's
 * memory limit are derived and checked against one another (docs/capacity.md "The pod's budget").
 *
 *   standing heap = base + descriptor LRUs × cap × bytes per descriptor + connections × bytes per connection
 *   standing heap + heap for requests in flight ≤ the first memory action's threshold × heap bound
 *   heap bound = container limit − what is not heap (ENVOY_NON_HEAP_MB)
 *
 * So everything Envoy keeps for legitimate clients — every descriptor LRU full, every connection
 * the cap admits open at the costliest kind — stays below the first overload action with room
 * for requests in flight: the memory actions (reset streams, refuse requests) act only on what
 * requests in flight hold, and the kernel's OOM kill never comes first.
 *
 * And the descriptor cap covers every client one Envoy can meet within a bucket's refill time:
 * a bucket untouched that long is full again, so evicting it from the LRU changes nothing.
 */
import { ENVOY_NON_HEAP_MB } from '../../authz/src/common/config.ts';
import type { JsonObject } from './common.ts';
import { FILTER } from './names.ts';

const MIB = 1_048_576;

/**
 * What one unit costs Envoy 1.40, as the budget counts it: each measured (bench:capacity writes the
 * measurements into docs/capacity.md) and rounded up.
 */
export const ENVOY_UNIT_COSTS = {
  /**
   * Heap per local-limit descriptor (one client in one LRU). Measured: 460–520 B per IPv4 client
   * and ~500 B per descriptor of an IPv6 client in its own /48 (two descriptors: its /64's and
   * its prefix's), up to 200,000 clients (bench:capacity); 609 B in an earlier run after 20,000
   * clients (docs/envoy.md §3); an outside measurement 500–650 B. Budgeted at the top of all.
   */
  descriptorBytes: 650,
  /**
   * Heap per downstream connection, the costliest kind: an idle HTTP/2 connection held ~35 KB on
   * 1.40 (an idle HTTP/1.1 one ~16 KB, a silent one ~12 KB; docs/envoy.md §8).
   */
  connectionBytes: 36_000,
  /** Envoy's own heap with the rendered config, idle after a warm-up: 8.9 MB allocated (bench:capacity). */
  baseHeapBytes: 16 * MIB,
  /**
   * Heap requests in flight may hold before the first memory action: 32 MiB, e.g. 512 full-size
   * (64 KiB) order bodies at once, or 4 pending ingests of 1 MiB for each of 8 TS workers' bound
   * (docs/envoy.md §4a). Past it the overload manager's actions are what bounds them.
   */
  inFlightBytes: 32 * MIB,
  /**
   * The least Envoy CPU a request that takes a descriptor costs, in µs: bare Envoy proxying a
   * read, no filter at all, took 41 µs at saturation (docs/benchmarks.md, stack (1)); a request
   * through the filter chain costs more (bench:capacity: a new client answered at once, the Check
   * failing). So one Envoy core meets at most 10^6 / 40 = 25,000 new clients a second.
   */
  minEnvoyUsPerRequest: 40,
} as const;

/**
 * The local stage's LRU size, per wildcard descriptor (Envoy keeps one LRU for each of the two or
 * three: IPv4 clients, IPv6 /64s, IPv6 prefixes). 50,000 = one Envoy core's most new clients a
 * second (25,000) × the default refill time (RATE_BURST / RPS_PER_IP = PREFIX_BURST /
 * RPS_PER_PREFIX = 2 s): an entry is evicted only after it went untouched for 2 s, when its
 * bucket is full again anyway. Was 200,000 per LRU: three full LRUs held ~390 MB (at 650 B), more
 * than the 256 MiB container had in all.
 */
export const LOCAL_RATE_LIMIT_DESCRIPTOR_CAP = 50_000;

/**
 * The overload manager's cap on downstream connections (all listeners, this Envoy). 5,000 of the
 * costliest kind hold ~180 MB; past it Envoy closes new connections at accept
 * (`listener.edge.downstream_global_cx_overflow`). Behind a balancer (XFF_NUM_TRUSTED_HOPS ≥ 1)
 * the edge sees the balancer's pooled connections, not the clients'.
 */
export const MAX_DOWNSTREAM_CONNECTIONS = 5_000;

/**
 * Heap pressure (heap in use / heap bound) at which each memory action acts:
 * - shrink_heap: from 0.90, tcmalloc returns free pages to the system (after a burst, Envoy's RSS
 *   otherwise stays at its peak: measured 623 MB with 7 MB allocated, docs/reliability.md);
 * - reset_high_memory_stream: from 0.85 (scaled to 0.95), Envoy resets the streams that hold the
 *   most buffered bytes, largest first (buffer accounting: BUFFER_ACCOUNT_MIN_POWER_OF_TWO);
 * - stop_accepting_requests: from 0.95, new requests are answered 503 (service_unavailable).
 */
export const MEMORY_ACTIONS = {
  shrinkHeap: 0.9,
  resetStreams: { scaling: 0.85, saturation: 0.95 },
  stopAccepting: 0.95,
} as const;

/** Envoy's CPUs in the pod (the envoy container's limits.cpu, deploy/k8s/base/deployment.yaml). */
export const ENVOY_POD_CPUS = 1;

/** What the budget is computed from: the values a rendered pod carries. */
export interface EnvoyBudgetInput {
  /** The container's memory limit (ENVOY_MEMORY_LIMIT_MB, limits.memory), MiB. */
  readonly memoryLimitMb: number;
  /** The fixed_heap monitor's max_heap_size_bytes. */
  readonly maxHeapBytes: number;
  /** max_dynamic_descriptors, and how many wildcard descriptors (LRUs) have it. */
  readonly descriptorCap: number;
  readonly descriptorLrus: number;
  /** The overload manager's max_active_downstream_connections. */
  readonly maxConnections: number;
  /** Every memory action's trigger thresholds (the lowest is where shedding starts). */
  readonly thresholds: readonly number[];
  /** CPUs Envoy may use (limits.cpu). */
  readonly envoyCpus: number;
  /** The longest refill of a bucket from empty: max(RATE_BURST / RPS_PER_IP, PREFIX_BURST / RPS_PER_PREFIX), s. */
  readonly refillSecs: number;
}

export interface EnvoyBudget {
  readonly limitBytes: number;
  readonly nonHeapBytes: number;
  readonly maxHeapBytes: number;
  /** Heap at which the first memory action starts: lowest threshold × the heap bound. */
  readonly firstActionBytes: number;
  readonly baseHeapBytes: number;
  readonly descriptorsBytes: number;
  readonly connectionsBytes: number;
  readonly inFlightBytes: number;
  /** base + descriptors + connections. */
  readonly standingBytes: number;
  /** firstActionBytes − standing − in flight: ≥ 0 when it adds up. */
  readonly spareBytes: number;
  /** The descriptor cap the refill time needs (clients one Envoy can meet within it). */
  readonly descriptorsNeeded: number;
  /** Why it does not add up; empty when it does. */
  readonly problems: readonly string[];
}

const mb = (b: number): string => `${(b / 1e6).toFixed(1)} MB`;

/** The budget of one Envoy: its parts and whether they add up. */
export function envoyBudget(i: EnvoyBudgetInput): EnvoyBudget {
  const c = ENVOY_UNIT_COSTS;
  const limitBytes = i.memoryLimitMb * MIB;
  const nonHeapBytes = ENVOY_NON_HEAP_MB * MIB;
  const firstActionBytes = Math.min(...i.thresholds) * i.maxHeapBytes;
  const descriptorsBytes = i.descriptorCap * i.descriptorLrus * c.descriptorBytes;
  const connectionsBytes = i.maxConnections * c.connectionBytes;
  const standingBytes = c.baseHeapBytes + descriptorsBytes + connectionsBytes;
  const spareBytes = firstActionBytes - standingBytes - c.inFlightBytes;
  const descriptorsNeeded = Math.ceil(i.envoyCpus * (1e6 / c.minEnvoyUsPerRequest) * i.refillSecs);
  const problems: string[] = [];
  if (i.maxHeapBytes + nonHeapBytes > limitBytes) {
    problems.push(`heap bound ${mb(i.maxHeapBytes)} + ${ENVOY_NON_HEAP_MB} MiB not heap exceeds the container limit ${i.memoryLimitMb} MiB`);
  }
  for (const t of i.thresholds) if (!(t > 0 && t < 1)) problems.push(`overload threshold ${t} is not under the heap bound (0 < t < 1)`);
  if (spareBytes < 0) {
    problems.push(`standing heap ${mb(standingBytes)} (base ${mb(c.baseHeapBytes)} + ${i.descriptorLrus} × ${i.descriptorCap} descriptors ${mb(descriptorsBytes)} `
      + `+ ${i.maxConnections} connections ${mb(connectionsBytes)}) + ${mb(c.inFlightBytes)} in flight exceeds the first memory action at ${mb(firstActionBytes)} `
      + `(${Math.min(...i.thresholds)} × heap bound ${mb(i.maxHeapBytes)}, container ${i.memoryLimitMb} MiB)`);
  }
  if (i.descriptorCap < descriptorsNeeded) {
    problems.push(`descriptor cap ${i.descriptorCap} is under the ${descriptorsNeeded} clients ${i.envoyCpus} Envoy CPU(s) can meet within a ${i.refillSecs} s refill: a bucket still refilling could be evicted`);
  }
  return { limitBytes, nonHeapBytes, maxHeapBytes: i.maxHeapBytes, firstActionBytes, baseHeapBytes: c.baseHeapBytes, descriptorsBytes, connectionsBytes, inFlightBytes: c.inFlightBytes, standingBytes, spareBytes, descriptorsNeeded, problems };
}

/** Every memory action's thresholds (what overloadManager renders from MEMORY_ACTIONS). */
export const MEMORY_THRESHOLDS: readonly number[] = [MEMORY_ACTIONS.shrinkHeap, MEMORY_ACTIONS.resetStreams.scaling, MEMORY_ACTIONS.resetStreams.saturation, MEMORY_ACTIONS.stopAccepting];

/**
 * The smallest container limit (a multiple of 64 MiB) under which the shipped caps add up: every
 * descriptor LRU (three: IPv4, IPv6 /64, IPv6 prefix) full and every connection open.
 */
export function requiredEnvoyMemoryLimitMb(): number {
  const c = ENVOY_UNIT_COSTS;
  const standing = c.baseHeapBytes + 3 * LOCAL_RATE_LIMIT_DESCRIPTOR_CAP * c.descriptorBytes + MAX_DOWNSTREAM_CONNECTIONS * c.connectionBytes;
  const heap = (standing + c.inFlightBytes) / Math.min(...MEMORY_THRESHOLDS);
  return Math.ceil((heap / MIB + ENVOY_NON_HEAP_MB) / 64) * 64;
}

const asObject = (v: unknown): JsonObject => (v !== null && typeof v === 'object' ? v as JsonObject : {});
const asArray = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);

/**
 * The budget's Envoy inputs read back from a rendered bootstrap (the YAML's object): the local
 * rate limit filter's cap and wildcard descriptors (the largest over every listener), the
 * connection cap, the fixed_heap bound and every memory action's thresholds.
 */
export function budgetOfBootstrap(bootstrap: JsonObject): Pick<EnvoyBudgetInput, 'maxHeapBytes' | 'descriptorCap' | 'descriptorLrus' | 'maxConnections' | 'thresholds'> {
  const om = asObject(bootstrap['overload_manager']);
  const monitors = asArray(om['resource_monitors']).map(asObject);
  const typed = (name: string): JsonObject => asObject(monitors.find((m) => String(m['name']).endsWith(name))?.['typed_config']);
  const thresholds: number[] = [];
  for (const a of asArray(om['actions']).map(asObject)) {
    for (const t of asArray(a['triggers']).map(asObject)) {
      const th = asObject(t['threshold']);
      const sc = asObject(t['scaled']);
      for (const v of [th['value'], sc['scaling_threshold'], sc['saturation_threshold']]) if (typeof v === 'number') thresholds.push(v);
    }
  }
  let descriptorCap = 0;
  let descriptorLrus = 0;
  for (const l of asArray(asObject(bootstrap['static_resources'])['listeners']).map(asObject)) {
    for (const fc of asArray(l['filter_chains']).map(asObject)) {
      for (const f of asArray(fc['filters']).map(asObject)) {
        for (const hf of asArray(asObject(f['typed_config'])['http_filters']).map(asObject)) {
          if (hf['name'] !== FILTER.rateLimit) continue;
          const rl = asObject(hf['typed_config']);
          const wildcards = asArray(rl['descriptors']).map(asObject)
            .filter((d) => asArray(d['entries']).map(asObject).some((e) => e['value'] === undefined)).length;
          descriptorCap = Math.max(descriptorCap, Number(rl['max_dynamic_descriptors'] ?? 20));
          descriptorLrus = Math.max(descriptorLrus, wildcards);
        }
      }
    }
  }
  return {
    maxHeapBytes: Number(typed('fixed_heap')['max_heap_size_bytes']),
    maxConnections: Number(typed('global_downstream_max_connections')['max_active_downstream_connections']),
    descriptorCap, descriptorLrus, thresholds,
  };
}
