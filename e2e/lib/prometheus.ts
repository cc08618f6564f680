/**
 * A real Prometheus server (Debian `prometheus`) scraping a running stack every second: the TS
 * service's `/metrics` as job `edge-authz` (as deploy/prometheus/scrape.yaml names it) and Envoy's
 * admin `/stats/prometheus` as job `edge-envoy`. Its storage lives in a temporary directory,
 * removed by stop(). Used to evaluate the dashboard's queries (e2e/dashboard.test.ts) and to
 * draw its picture from real data (scripts/dashboard-picture.ts).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import YAML from 'yaml';
import { freePort } from '../../testkit/redis-server.ts';
import { removeTempDir, tempDir } from '../../testkit/temp-dir.ts';
import { TOOLS } from '../../deploy/test/tools.ts';

export interface PromSeries { metric: Record<string, string>; value?: [number, string]; values?: [number, string][] }

export interface Prometheus {
  readonly url: string;
  /** An instant query; throws with Prometheus's error for a query it refuses. */
  query(expr: string, time?: number): Promise<PromSeries[]>;
  /** A range query (start/end in Unix seconds). */
  queryRange(expr: string, start: number, end: number, stepSecs: number): Promise<PromSeries[]>;
  /** Waits until both jobs have been scraped successfully at least `scrapes` more times. */
  waitForScrapes(scrapes?: number): Promise<void>;
  stop(): Promise<void>;
}

/** `host:port` of each target: the TS service's admin listener and Envoy's admin. */
export async function startPrometheus(targets: { authzAdmin: string; envoyAdmin: string }): Promise<Prometheus> {
  const dir = tempDir('edge-prometheus-');
  const port = await freePort();
  const hostPort = (u: string): string => new URL(u).host;
  writeFileSync(join(dir, 'prometheus.yml'), YAML.stringify({
    global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
    scrape_configs: [
      { job_name: 'edge-authz', static_configs: [{ targets: [hostPort(targets.authzAdmin)] }] },
      { job_name: 'edge-envoy', metrics_path: '/stats/prometheus', static_configs: [{ targets: [hostPort(targets.envoyAdmin)] }] },
    ],
  }));
  let output = '';
  const proc: ChildProcess = spawn(TOOLS.prometheus.bin, [
    `--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn',
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  proc.stdout?.on('data', (c) => { output += String(c); });
  proc.stderr?.on('data', (c) => { output += String(c); });
  const spawned = new Promise<void>((resolve, reject) => {
    proc.once('spawn', () => resolve());
    proc.once('error', (e) => reject(new Error(`${TOOLS.prometheus.bin} did not start (${e.message}): ${TOOLS.prometheus.install}`)));
  });
  const url = `http://127.0.0.1:${port}`;
  const stop = async (): Promise<void> => {
    if (proc.exitCode === null && proc.signalCode === null) {
      const exited = new Promise((r) => proc.once('exit', r));
      proc.kill('SIGTERM');
      await Promise.race([exited, sleep(5000)]);
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    }
    removeTempDir(dir);
  };
  const api = async (path: string, params: Record<string, string>): Promise<PromSeries[]> => {
    const res = await fetch(`${url}${path}?${new URLSearchParams(params)}`);
    const body = await res.json() as { status: string; error?: string; data?: { result: PromSeries[] } };
    if (body.status !== 'success') throw new Error(`Prometheus refused ${params['query']}: ${body.error}`);
    return body.data!.result;
  };
  const query = (expr: string, time?: number): Promise<PromSeries[]> =>
    api('/api/v1/query', { query: expr, ...(time === undefined ? {} : { time: String(time) }) });
  try {
    await spawned;
    for (const end = Date.now() + 20_000; ; await sleep(200)) {
      if (proc.exitCode !== null) throw new Error(`prometheus exited ${proc.exitCode}: ${output}`);
      const ready = await fetch(`${url}/-/ready`).then((r) => r.ok, () => false);
      if (ready) break;
      if (Date.now() > end) throw new Error(`prometheus not ready in 20 s: ${output}`);
    }
  } catch (e) {
    await stop();
    throw e;
  }
  return {
    url,
    query,
    queryRange: (expr, start, end, step) => api('/api/v1/query_range', { query: expr, start: String(start), end: String(end), step: String(step) }),
    async waitForScrapes(scrapes = 2) {
      // Both targets up, then the fewest `up` samples either job has: its scrape count.
      const count = async (): Promise<number> => {
        const up = await query('count(up == 1)');
        if (Number(up[0]?.value?.[1] ?? 0) < 2) return 0;
        const r = await query('min(count_over_time(up[1h]))');
        return Number(r[0]?.value?.[1] ?? 0);
      };
      const target = (await count()) + scrapes;
      for (const end = Date.now() + 30_000; (await count()) < target; await sleep(250)) {
        if (Date.now() > end) throw new Error(`prometheus did not scrape both targets ${scrapes} times in 30 s: ${JSON.stringify(await query('up'))} ${output}`);
      }
    },
    stop,
  };
}
