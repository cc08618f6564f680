/**
 * Entry point (`npm run authz`): only wiring. Load config → build dependencies → start.
 *
 * AUTHZ_WORKERS > 1 runs that many worker processes behind one set of ports (node:cluster
 * hands connections out round-robin); the primary serves the admin port with metrics
 * aggregated across workers and forwards seal/shutdown to every worker.
 */
import cluster from 'node:cluster';
import { loadConfig } from './config.ts';
import { loadCredentials } from './credentials.ts';
import { createLogger } from './log.ts';
import { runPrimary, runSingle, runWorker } from './process.ts';

const config = loadConfig();
const logger = createLogger(config.logLevel);

if (config.workers > 1 && cluster.isPrimary) {
  // Validate the credentials before forking (fail fast, naming the variable), then drop them.
  loadCredentials({ ...process.env }).zeroize();
  runPrimary(config, logger);
} else if (cluster.isWorker) {
  await runWorker(config, logger);
} else {
  await runSingle(config, logger);
}
