/**
 * The setting-name registry: every environment variable the project reads as a setting
 * (KNOWN_SETTINGS, recorded by running loadConfig), and the check that reports a variable that
 * looks like a setting but is none (a typo, a removed name), or refuses it with STRICT_SETTINGS=1.
 */
import { loadConfig } from './load.ts';
import { str } from './parse.ts';
import { ConfigError, type Env } from './types.ts';

/**
 * Settings read outside loadConfig: the secrets (credentials.ts, each also as `<NAME>_FILE`),
 * and the development-only ones (`npm start`, the demo backend, the scripts; README
 * "Development only"). STRICT_SETTINGS is read by checkSettingNames below.
 */
const SECRET_SETTINGS = ['EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_PUBLIC_KEY', 'EDGE_FEED_ED25519_KEY'];
const DEV_SETTINGS = [
  'DEV_REDIS_PORT', 'DEV_BACKEND_PORT', 'DEV_RUN_DIR', 'STRICT_SETTINGS', 'DEV_EDGE_TLS',
  'BACKEND_CERT_FILE', 'BACKEND_KEY_FILE', 'BACKEND_CLIENT_CA_FILE', 'BACKEND_PORT', 'BACKEND_BIND_ADDRESS',
  'NODE_BIN', 'ENVOY_BIN', 'GRPCURL_BIN', 'PYTHON', 'RELIABILITY_SOAK_SECS', 'RELIABILITY_ONLY', 'EDGE_REQUIRE_CONTAINERS', 'EDGE_E2E_TRACE_AUDIT', 'EDGE_E2E_TRACE_AUDIT_KEEP',
];

/** The names loadConfig reads: recorded by running it (without and with an order backend), never listed by hand. */
function configSettingNames(): string[] {
  const seen = new Set<string>();
  const recording = (base: Record<string, string>): Env => new Proxy(base, {
    get(target, key) {
      if (typeof key === 'string') seen.add(key);
      return target[key as string];
    },
  });
  loadConfig(recording({}));
  loadConfig(recording({ ORDER_BACKEND_URL: 'https://backend:8443', ORDER_BACKEND_CA_FILE: 'a', EDGE_CLIENT_CERT_FILE: 'b', EDGE_CLIENT_KEY_FILE: 'c' }));
  return [...seen];
}

/** Every environment variable the project reads as a setting (README "Settings"). */
export const KNOWN_SETTINGS: ReadonlySet<string> = new Set([
  ...configSettingNames(), ...SECRET_SETTINGS, ...SECRET_SETTINGS.map((n) => `${n}_FILE`), ...DEV_SETTINGS,
]);

/**
 * The project's prefixes: the first word of every known setting (EDGE_, AUTHZ_, RATE_, GEO_, …),
 * except those of other programs' variables (NODE_ is Node's: NODE_ENV, NODE_OPTIONS, …; OTEL_ is
 * OpenTelemetry's, whose SDK in the service also reads its own, e.g. OTEL_EXPORTER_OTLP_HEADERS).
 */
export const SETTING_PREFIXES: readonly string[] = [...new Set(
  [...KNOWN_SETTINGS].filter((n) => n.includes('_')).map((n) => `${n.slice(0, n.indexOf('_'))}_`),
)].filter((p) => p !== 'NODE_' && p !== 'OTEL_').sort();

/** Optimal string alignment distance (Levenshtein plus adjacent transpositions). */
function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, d[i - 2]![j - 2]! + 1);
      d[i]![j] = v;
    }
  }
  return d[a.length]![b.length]!;
}

export interface UnknownSetting {
  readonly name: string;
  /** The known setting nearest to it. */
  readonly nearest: string;
  readonly message: string;
}

/**
 * Variables that look like settings but are none: every name with one of the project's
 * prefixes that is not a setting (RATE_LIMIT_RPS), and any other name within two edits of one
 * (EGDE_PORT, LOGLEVEL). Nothing reads them, so each is reported with the setting nearest to it.
 */
export function unknownSettings(env: Env): UnknownSetting[] {
  const out: UnknownSetting[] = [];
  for (const name of Object.keys(env).sort()) {
    if (KNOWN_SETTINGS.has(name) || !/^[A-Z][A-Z0-9_]*$/.test(name)) continue;
    let nearest = '';
    let best = Infinity;
    for (const k of KNOWN_SETTINGS) {
      const dist = editDistance(name, k);
      if (dist < best) [best, nearest] = [dist, k];
    }
    const prefixed = SETTING_PREFIXES.some((p) => name.startsWith(p));
    if (prefixed || best <= (name.length >= 8 ? 2 : 1)) {
      out.push({ name, nearest, message: `${name} is not a setting (did you mean ${nearest}?)` });
    }
  }
  return out;
}

/**
 * Reports unknownSettings: returns them as warnings, or with STRICT_SETTINGS=1 throws a
 * ConfigError naming them (README "Settings").
 */
export function checkSettingNames(env: Env): UnknownSetting[] {
  const strict = str(env, 'STRICT_SETTINGS') ?? '0';
  if (strict !== '0' && strict !== '1') throw new ConfigError('STRICT_SETTINGS', '1 or 0', strict);
  const unknown = unknownSettings(env);
  const [first, ...more] = unknown;
  if (strict === '1' && first !== undefined) {
    const others = more.length === 0 ? '' : ` (also not settings: ${more.map((u) => u.name).join(', ')})`;
    throw new ConfigError(first.name, `a known setting (STRICT_SETTINGS=1 refuses unknown ones); did you mean ${first.nearest}?${others}`);
  }
  return unknown;
}
