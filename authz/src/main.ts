/**
 * Entry point (`npm run authz`): only wiring. Load config → build dependencies → start.
 *
 * AUTHZ_WORKERS > 1 runs that many worker processes behind one set of ports (node:cluster
 * hands connections out round-robin); the primary serves the admin port with metrics
 * aggregated across workers and forwards seal/shutdown to every worker.
 */
import cluster from 'node:cluster';
import { checkSettingNames, ConfigError, loadConfig } from './common/config.ts';
import { loadCredentials } from './common/credentials.ts';
import { defaultGeoipWarning, geoipBuildEpochSecs, staleGeoipWarning } from './common/geoip-default.ts';
import { createLogger, logOutput } from './common/log.ts';
import { applyHeapGrowth } from './common/runtime-env.ts';
import { startsSealed } from './common/seal-file.ts';
import { runPrimary, runSingle, runWorker } from './process.ts';

// Before anything sizable is allocated (runtime-env.ts says why).
applyHeapGrowth();

// A bad setting, or a key that is not one (the primary reads the keys below before forking):
// one fatal line naming the variable, exit status 1, as npm start and the deployments show it;
// never a stack trace (a ConfigError's message holds no key material: credentials.ts).
function orRefuse<T>(load: () => T): T {
  try {
    return load();
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    createLogger('info', logOutput()).fatal({ setting: err.variable, err: err.message }, 'invalid setting');
    process.exit(1);
  }
}
const config = orRefuse(() => loadConfig());
const logger = createLogger(config.logLevel, logOutput());
// Variables that look like settings but are none (STRICT_SETTINGS=1: refused, like a bad value).
const unknownSettings = checkSettingNames(process.env);
if (!cluster.isWorker) for (const u of unknownSettings) logger.warn({ setting: u.name, nearest: u.nearest }, `${u.message}; it is ignored`);
// The default GeoIP database is for development and tests (common/geoip-default.ts says why).
const geoipWarning = defaultGeoipWarning(config.geoipDb);
if (geoipWarning !== undefined && !cluster.isWorker) logger.warn({ geoipDb: config.geoipDb }, geoipWarning);
// A database already past EdgeGeoipStale's threshold: the alert will fire; say so (and why) now.
const staleWarning = cluster.isWorker ? undefined : staleGeoipWarning(config.geoipDb, geoipBuildEpochSecs(config.geoipDb));
if (staleWarning !== undefined) logger.warn({ geoipDb: config.geoipDb }, staleWarning);

if (config.workers > 1 && cluster.isPrimary) {
  // Validate the credentials before forking (fail fast, naming the variable), then drop them;
  // a service that starts sealed (AUTHZ_SEAL_FILE present) reads no key at all.
  if (!startsSealed(config)) orRefuse(() => loadCredentials({ ...process.env })).zeroize();
  runPrimary(config, logger);
} else {
  // A port that cannot be listened on (common/listen-error.ts) or anything else that stops
  // start-up: one fatal line saying why, exit status 1 (a worker's makes the primary stop too).
  try {
    await (cluster.isWorker ? runWorker(config, logger) : runSingle(config, logger));
  } catch (err) {
    logger.fatal({ err: err instanceof Error ? err.message : String(err) }, 'start-up failed');
    process.exit(1);
  }
}
