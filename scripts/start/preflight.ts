/**
 * `npm start`'s preflight: every setting checked before anything starts (loadConfig, the
 * databases it names, the development settings, and the ports the stack will listen on), giving
 * the Plan the start sequence follows. A bad setting throws a ConfigError; nothing is written.
 */
import { spawnSync } from 'node:child_process';
import { checkDatabases } from '../../authz/src/common/adapters/databases.ts';
import { checkSettingNames, ConfigError, loadConfig, type Config } from '../../authz/src/common/config.ts';

/** The environment npm start reads and amends (defaults it fills in for the TS service). */
export type StartEnv = Record<string, string | undefined>;

/** Whether setting `name` is unset or blank. */
export const isBlank = (env: StartEnv, name: string): boolean => (env[name] ?? '').trim() === '';

/** A development setting: an integer in [min, max] (the wording of config.ts). */
export function devInt(env: StartEnv, name: string, def: number, min: number, max: number): number {
  const raw = env[name]?.trim();
  if (raw === undefined || raw === '') return def;
  const n = Number(raw);
  if (!/^[0-9]+$/.test(raw) || n < min || n > max) throw new ConfigError(name, `an integer in [${min}, ${max}]`, raw);
  return n;
}

/** What the start sequence will run, once every setting has been checked. */
export interface Plan {
  readonly config: Config;
  /** DEV_REDIS_PORT when this stack runs its own redis-server. */
  readonly redisPort: number | undefined;
  /** DEV_BACKEND_PORT when this stack runs the demo backend (0: a free port is chosen). */
  readonly backendPort: number | undefined;
  /** Every port the stack will listen on, by the setting that names it. */
  readonly ports: ReadonlyArray<readonly [setting: string, port: number]>;
  /** Variables that look like settings but are none (reported here, not passed to the TS service). */
  readonly unknown: readonly string[];
  /** DEV_EDGE_TLS=1: TLS on the client port with a development certificate (unless EDGE_TLS_* are given). */
  readonly devEdgeTls: boolean;
}

/** Whether a redis-server can be started here (`redis-server --version` succeeds). */
export const redisServerInstalled = (): boolean => spawnSync('redis-server', ['--version']).status === 0;

/**
 * Checks every setting of `env` and plans the stack; unknown setting names are passed to `warn`
 * (one line each). `hasRedisServer` says whether a private redis-server can run (without
 * REDIS_URL). Throws ConfigError for the first bad setting, port 0, or two settings naming one port.
 */
export function checkSettings(env: StartEnv, warn: (line: string) => void, hasRedisServer: () => boolean = redisServerInstalled): Plan {
  const blank = (name: string): boolean => isBlank(env, name);
  const unknown = checkSettingNames(env);
  for (const u of unknown) warn(`warning: ${u.message}; it is ignored (STRICT_SETTINGS=1 makes this an error)`);
  const redisPort = devInt(env, 'DEV_REDIS_PORT', 6390, 1, 65535);
  const backendPort = devInt(env, 'DEV_BACKEND_PORT', 8443, 0, 65535);
  const devEdgeTls = (env['DEV_EDGE_TLS'] ?? '').trim();
  if (devEdgeTls !== '' && devEdgeTls !== '0' && devEdgeTls !== '1') throw new ConfigError('DEV_EDGE_TLS', '1 or 0', devEdgeTls);
  const runsRedis = blank('REDIS_URL') && hasRedisServer();
  // Checked as the TS service will see them: with the REDIS_URL of the redis-server started below
  // (RATE_LIMIT_SCOPE=global needs one; without redis-server, local is the only choice).
  const config = loadConfig(runsRedis ? { ...env, REDIS_URL: `redis://127.0.0.1:${redisPort}/0` } : env);
  // GEOIP_DB and ANONYMIZER_DB as the TS service will check them: the wrong kind of database is a bad setting.
  checkDatabases(config);
  const runsBackend = blank('ORDER_BACKEND_URL');
  const ports: [string, number][] = [
    ['EDGE_PORT', config.edgePort],
    // With a socket, AUTHZ_GRPC_PORT / MARKET_PORT are listened on only when set (config.ts).
    ...(config.authzGrpcTcp ? [['AUTHZ_GRPC_PORT', config.authzGrpcPort] as [string, number]] : []),
    ...(config.marketTcp ? [['MARKET_PORT', config.marketPort] as [string, number]] : []),
    ['AUTHZ_ADMIN_PORT', config.authzAdminPort], ['ENVOY_ADMIN_PORT', config.envoyAdminPort],
    // Ingest on a listener of its own only when INGEST_PORT is set; else on EDGE_PORT as every route.
    ...(config.ingestPort === undefined ? [] : [['INGEST_PORT', config.ingestPort] as [string, number]]),
    // Envoy's stats listener (GET /stats/prometheus only) only when ENVOY_STATS_PORT is set.
    ...(config.envoyStatsPort === undefined ? [] : [['ENVOY_STATS_PORT', config.envoyStatsPort] as [string, number]]),
  ];
  for (const [name, port] of ports) {
    // Port 0 lets the system choose: nobody (the banner, Envoy, a client) would know the port.
    if (port === 0) throw new ConfigError(name, 'a port in [1, 65535] for npm start', '0');
  }
  if (runsRedis) ports.push(['DEV_REDIS_PORT', redisPort]);
  if (runsBackend && backendPort !== 0) ports.push(['DEV_BACKEND_PORT', backendPort]);
  const seen = new Map<number, string>();
  for (const [name, port] of ports) {
    const other = seen.get(port);
    if (other !== undefined) throw new ConfigError(name, `a port other than ${other}'s`, String(port));
    seen.set(port, name);
  }
  return { config, redisPort: runsRedis ? redisPort : undefined, backendPort: runsBackend ? backendPort : undefined, ports, unknown: unknown.map((u) => u.name), devEdgeTls: devEdgeTls === '1' };
}
