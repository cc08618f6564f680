/**
 * Process lifecycle: single process, cluster primary, cluster worker. Signals seal.
 */
import cluster, { type Worker } from 'node:cluster';
import { availableParallelism } from 'node:os';
import type { Server } from 'node:http';
import { AggregatorRegistry } from 'prom-client';
import { createAdminServer, type AdminSealResult } from './admin.ts';
import { createApp, type App } from './app.ts';
import type { Config } from './common/config.ts';
import { listenAs } from './common/listen-error.ts';
import { MEMORY_RELEASE_DEFAULTS, startMemoryRelease } from './common/memory-release.ts';
import type { Logger } from './common/log.ts';
import { writeSealFile } from './common/seal-file.ts';
import { listenAtSocket, ownSocket, prepareSocket, removeOwnSocketsAtExit, socketSettings } from './common/unix-socket.ts';
import { readTokenFile, type TokenCheck } from './common/token.ts';

/**
 * After the seal the service keeps answering `sealed` (Envoy sees NOT_SERVING and 503 sealed)
 * until nothing has asked for DRAIN_QUIET_MS, at most SHUTDOWN_GRACE_MS; then it stops and
 * exits 0. Where Envoy stopped first (npm start, compose, the pod's shutdown order) that is at
 * once; with Envoy still sending (a seal through the admin port) it is the whole grace period.
 */
export const DRAIN_QUIET_MS = 500;
const DRAIN_POLL_MS = 100;

function exitWhenDrained(app: App, graceMs: number): void {
  const sealedAt = Date.now();
  const timer = setInterval(() => {
    if (app.quietMs() < DRAIN_QUIET_MS && Date.now() - sealedAt < graceMs) return;
    clearInterval(timer);
    app.stop().finally(() => process.exit(0));
  }, Math.min(DRAIN_POLL_MS, Math.max(1, graceMs)));
  timer.unref();
}

/** The admin port (metrics, seal), its failure named by AUTHZ_ADMIN_PORT. */
function listenAdmin(admin: Server, config: Config): Promise<void> {
  return listenAs('AUTHZ_ADMIN_PORT', config.adminBindAddress, config.authzAdminPort, () => new Promise<void>((resolve, reject) => {
    admin.once('error', reject);
    admin.listen(config.authzAdminPort, config.adminBindAddress, () => {
      admin.off('error', reject);
      resolve();
    });
  }));
}

/** The signals that seal and stop the service; SIGHUP too (a terminal or log pipe gone: common/log.ts). */
const STOP_SIGNALS = ['SIGTERM', 'SIGINT', 'SIGHUP'] as const;

/** The admin token (AUTHZ_ADMIN_TOKEN_FILE), read at start; undefined: admin operations are off. */
function adminToken(config: Config): TokenCheck | undefined {
  return config.adminTokenFile === undefined ? undefined : readTokenFile('AUTHZ_ADMIN_TOKEN_FILE', config.adminTokenFile);
}

/**
 * A seal through the admin port: recorded in AUTHZ_SEAL_FILE first (so it outlives this process:
 * a supervisor or the kubelet restarts it sealed), then `seal`. A marker that cannot be written
 * does not stop the seal; the answer says it is not persistent, and the log says why.
 */
function adminSeal(config: Config, logger: Logger, seal: (reason: string) => void): (reason: string) => AdminSealResult {
  return (reason) => {
    let persistent = false;
    if (config.sealFile !== undefined) {
      try {
        writeSealFile(config.sealFile, { sealedAt: new Date().toISOString(), reason, pid: process.pid });
        persistent = true;
        logger.warn({ sealFile: config.sealFile }, 'seal recorded: every restart starts sealed until an operator removes the file (docs/operations.md "Seal and unseal")');
      } catch (err) {
        logger.error({ sealFile: config.sealFile, err: String(err) }, 'the seal could not be recorded in AUTHZ_SEAL_FILE: it ends with this process');
      }
    }
    seal(reason);
    return { persistent };
  };
}

/** SIGTERM/SIGINT/SIGHUP: a normal stop. It seals (keys zeroed) and exits, and records nothing: the next start is not sealed. */
function onSignals(seal: (reason: string) => void): void {
  for (const sig of STOP_SIGNALS) process.on(sig, () => seal(sig));
}

async function startApp(config: Config, logger: Logger, withAdmin: boolean): Promise<App> {
  const token = withAdmin ? adminToken(config) : undefined;
  const app = await createApp(config, logger, {
    onSealed: () => exitWhenDrained(app, config.shutdownGraceMs),
  });
  await app.start();
  if (withAdmin) {
    const admin = createAdminServer({ registry: app.metrics.registry, seal: adminSeal(config, logger, (r) => app.seal(r)), token, logger });
    app.onStop(() => new Promise<void>((resolve) => admin.close(() => resolve())));
    try {
      await listenAdmin(admin, config);
    } catch (err) {
      await app.stop();
      throw err;
    }
  }
  return app;
}

/** Gives the heap a burst left behind back once the process is quiet (common/memory-release.ts). */
function releaseMemoryWhenQuiet(logger: Logger): void {
  startMemoryRelease({
    ...MEMORY_RELEASE_DEFAULTS,
    onRelease: (before, after, pauseMs) => logger.info({
      heapTotalMb: Math.round(before.heapTotal / 1_048_576), heapTotalAfterMb: Math.round(after.heapTotal / 1_048_576),
      heapUsedMb: Math.round(before.heapUsed / 1_048_576), heapUsedAfterMb: Math.round(after.heapUsed / 1_048_576), pauseMs: Math.round(pauseMs),
    }, 'quiet after a burst: heap compacted and unused pages released'),
  });
}

/** One process serves everything (AUTHZ_WORKERS=1, the default). */
export async function runSingle(config: Config, logger: Logger): Promise<void> {
  const app = await startApp(config, logger, true);
  releaseMemoryWhenQuiet(logger);
  onSignals((reason) => app.seal(reason));
}

/** A cluster worker: the app, no admin port; seals on the primary's message. */
export async function runWorker(config: Config, logger: Logger): Promise<void> {
  // The primary's AggregatorRegistry asks every worker for its metrics; the worker-side
  // listener is installed by constructing an AggregatorRegistry (prom-client), at once so a
  // scrape during start-up is answered rather than timing out.
  new AggregatorRegistry();
  const app = await startApp(config, logger.child({ worker: cluster.worker?.id }), false);
  AggregatorRegistry.setRegistries([app.metrics.registry]);
  releaseMemoryWhenQuiet(logger);
  process.send?.('edge:ready');
  process.on('message', (msg: unknown) => {
    if (msg === 'edge:seal') app.seal('primary');
  });
  // The primary forwards signals; a worker ignores them so a Ctrl-C to the group seals once.
  for (const sig of STOP_SIGNALS) process.on(sig, () => undefined);
}

/** The cluster primary: forks workers, serves aggregated metrics and seal, forwards signals. */
export function runPrimary(config: Config, logger: Logger): void {
  let token: TokenCheck | undefined;
  try {
    token = adminToken(config);
  } catch (err) {
    logger.fatal({ err: err instanceof Error ? err.message : String(err) }, 'start-up failed');
    process.exit(1);
  }
  const n = Math.min(config.workers, Math.max(1, availableParallelism() * 2));
  const workers = new Set<Worker>();
  let sealed = false;
  // Stops the process: every worker is killed outright (a started worker ignores SIGTERM and
  // waits for the seal; Worker.kill() would only disconnect it once this process is gone).
  const fail = (): never => {
    for (const w of workers) w.process.kill('SIGKILL');
    process.exit(1);
  };
  // Until every first worker has started, a worker that exits before it is ready means the
  // service cannot start (a port in use, a bad file): forking it again would fail the same way, in
  // a loop, so the process stops for its supervisor to see. Later a replacement that fails is
  // forked again, as any worker that exits is (the others keep serving).
  let starting = n;
  const fork = (): void => {
    const w = cluster.fork();
    workers.add(w);
    const first = starting > 0;
    let ready = false;
    w.on('message', (msg: unknown) => {
      if (msg !== 'edge:ready' || ready) return;
      ready = true;
      // The listening sockets are this process's (node:cluster binds them here): removed at its exit.
      for (const [, path] of socketSettings(config)) ownSocket(path);
      if (first) starting--;
    });
    w.on('exit', (code, signal) => {
      workers.delete(w);
      if (first && !ready && !sealed) {
        logger.fatal({ worker: w.id, code, signal }, 'start-up failed: a worker could not start');
        fail();
      }
      if (!sealed) {
        logger.error({ worker: w.id, code, signal }, 'worker exited; starting a new one');
        fork();
      } else if (workers.size === 0) {
        process.exit(0);
      }
    });
  };
  // A stale socket file from a crashed run is removed once, here, before any worker listens
  // (common/unix-socket.ts); each worker's listen is then served by this process's handle.
  removeOwnSocketsAtExit();
  (async () => {
    for (const [setting, path] of socketSettings(config)) {
      await listenAtSocket(setting, path, async () => {
        if (await prepareSocket(path)) logger.warn({ socket: path }, 'removed a stale socket file (a previous run did not exit cleanly)');
      });
    }
  })().then(() => {
    for (let i = 0; i < n; i++) fork();
  }, (err: unknown) => {
    logger.fatal({ err: err instanceof Error ? err.message : String(err) }, 'start-up failed');
    fail();
  });
  const registry = new AggregatorRegistry();
  const aggregated = {
    contentType: registry.contentType,
    metrics: () => registry.clusterMetrics(),
  };
  const seal = (reason: string): void => {
    if (sealed) return;
    sealed = true;
    logger.warn({ reason, workers: workers.size }, 'sealing every worker');
    for (const w of workers) w.send('edge:seal');
    setTimeout(() => process.exit(0), config.shutdownGraceMs + 2000).unref();
  };
  const admin = createAdminServer({ registry: aggregated as never, seal: adminSeal(config, logger, seal), token, logger });
  listenAdmin(admin, config).catch((err: unknown) => {
    logger.fatal({ err: err instanceof Error ? err.message : String(err) }, 'start-up failed');
    fail();
  });
  onSignals(seal);
  logger.info({ workers: n }, 'cluster primary started');
}
