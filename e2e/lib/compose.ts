/**
 * The shipped deploy/docker-compose.yml run as it is, by the real docker-compose (Debian 1.29),
 * for e2e/compose.test.ts. Nothing here edits or copies the compose file: everything a run needs
 * differently is what compose itself takes from outside:
 *
 *   -p <name>                 a project of its own per run (containers, network, volumes)
 *   --project-directory <dir> where the file's relative paths (./.secrets, ./.geoip) resolve:
 *                             a temp dir that deploy/compose-setup.ts fills (`--out <dir>`)
 *   --env-file <dir>/.env     EDGE_UID/EDGE_GID as compose-setup.ts wrote them
 *   environment               the variables the file interpolates: EDGE_PUBLISH (a free
 *                             loopback port), EDGE_SUBNET (a /24 no other Docker network uses),
 *                             XFF_NUM_TRUSTED_HOPS, BLOCKED_COUNTRIES, and the images
 *                             (e2e/lib/images.ts: official when present, else local stand-ins)
 *
 * The image is built through compose too (`docker-compose build`, project directory deploy/, so
 * `build.context: ..` is the checkout), then `up -d --no-build` runs it from the temp directory.
 * Every child process has a timeout; nothing here waits unbounded.
 */
import { execFile, spawnSync } from 'node:child_process';
import { chmodSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort } from '../../testkit/redis-server.ts';
import { COMPOSE_FILES } from '../../deploy/compose-setup.ts';
import { ROOT } from '../../deploy/paths.ts';
import { COMPOSE_FILE } from '../../deploy/test/tools.ts';
import { dockerCli, dockerEngine, imageEnv } from './images.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

export const COMPOSE_BIN = 'docker-compose';
const SIGNALS = ['SIGINT', 'SIGTERM'] as const;
const NODE = join(ROOT, 'scripts', 'node');

export interface RunResult {
  readonly status: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Wall time of the child, ms. */
  readonly ms: number;
  /** The command line, for messages. */
  readonly cmd: string;
}

export interface RunOptions {
  readonly timeoutMs: number;
  readonly env?: NodeJS.ProcessEnv;
  readonly cwd?: string;
}

/** Runs a child to completion, killed (SIGKILL) after `timeoutMs`; never rejects. */
export function run(bin: string, args: readonly string[], opts: RunOptions): Promise<RunResult> {
  const t0 = Date.now();
  const cmd = [bin, ...args].join(' ');
  return new Promise((resolve) => {
    execFile(bin, args, { encoding: 'utf8', timeout: opts.timeoutMs, killSignal: 'SIGKILL', maxBuffer: 256 << 20, env: opts.env ?? process.env, cwd: opts.cwd ?? ROOT },
      (err, stdout, stderr) => {
        const e = err as (NodeJS.ErrnoException & { code?: number | string; signal?: NodeJS.Signals | null; killed?: boolean }) | null;
        const status = e === null ? 0 : typeof e.code === 'number' ? e.code : null;
        const timedOut = e?.killed === true && e.signal === 'SIGKILL' ? `\n[killed after ${opts.timeoutMs} ms]` : '';
        const spawnErr = e !== null && typeof e.code === 'string' ? `\n[${e.code}: ${e.message}]` : '';
        resolve({ status, signal: e?.signal ?? null, stdout, stderr: stderr + timedOut + spawnErr, ms: Date.now() - t0, cmd });
      });
  });
}

/** Throws with the command's output unless it exited 0. */
export function ok(r: RunResult): RunResult {
  if (r.status !== 0) throw new Error(`${r.cmd} failed (exit ${r.status ?? r.signal}, ${r.ms} ms):\n${r.stderr}${r.stdout}`.slice(0, 20_000));
  return r;
}

/**
 * Why the compose tests cannot run here (one line), or undefined: a Docker engine must answer
 * and docker-compose must be installed.
 */
export function composeSkipReason(): string | undefined {
  const engine = dockerEngine();
  if (!engine.ok) return engine.why;
  const r = spawnSync(COMPOSE_BIN, ['version', '--short'], { encoding: 'utf8', timeout: 30_000, env: composeBaseEnv() });
  if (r.error !== undefined) return `no docker-compose (${(r.error as NodeJS.ErrnoException).code ?? r.error.message}): apt-get install docker-compose`;
  if (r.status !== 0) return `docker-compose does not run: ${(r.stderr || r.stdout).trim().split('\n')[0]}`;
  return undefined;
}

/** The variables deploy/docker-compose.yml interpolates (`${NAME…}`), read from the file. */
export function interpolatedNames(): string[] {
  return [...new Set([...readFileSync(COMPOSE_FILE, 'utf8').matchAll(/\$\{([A-Za-z_][A-Za-z0-9_]*)/g)].map((m) => m[1] ?? ''))];
}

/**
 * This process's environment without anything that would steer compose from outside the test
 * (COMPOSE_*, the variables the file interpolates), with /usr/bin first: Debian's docker 20.10
 * CLI, whose built-in BuildKit honours deploy/Dockerfile.dockerignore (e2e/lib/images.ts).
 */
function composeBaseEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith('COMPOSE_')) delete env[k];
  for (const k of interpolatedNames()) delete env[k];
  env['PATH'] = `/usr/bin:${process.env['PATH'] ?? '/bin'}`;
  return env;
}

function ipv4ToInt(ip: string): number {
  return ip.split('.').reduce((n, o) => (n * 256) + Number(o), 0);
}

/** Whether two IPv4 CIDRs overlap (IPv6 ones never do with the IPv4 candidates). */
export function cidrsOverlap(a: string, b: string): boolean {
  const parse = (c: string): [number, number] | undefined => {
    const [ip, len] = c.split('/');
    if (ip === undefined || !/^\d+\.\d+\.\d+\.\d+$/.test(ip)) return undefined;
    const bits = Number(len ?? 32);
    const size = 2 ** (32 - bits);
    const start = Math.floor(ipv4ToInt(ip) / size) * size;
    return [start, start + size - 1];
  };
  const x = parse(a);
  const y = parse(b);
  return x !== undefined && y !== undefined && x[0] <= y[1] && y[0] <= x[1];
}

/** Every IPv4 subnet the engine's networks and this host's interfaces use. */
async function usedSubnets(): Promise<string[]> {
  const used: string[] = [];
  const ids = ok(await run(dockerCli(), ['network', 'ls', '-q'], { timeoutMs: 30_000 })).stdout.split('\n').filter((l) => l !== '');
  if (ids.length > 0) {
    const r = ok(await run(dockerCli(), ['network', 'inspect', '--format', '{{range .IPAM.Config}}{{.Subnet}} {{end}}', ...ids], { timeoutMs: 30_000 }));
    used.push(...r.stdout.split(/\s+/).filter((s) => s.includes('/')));
  }
  for (const addrs of Object.values(networkInterfaces())) {
    for (const a of addrs ?? []) if (a.family === 'IPv4' && a.cidr !== null) used.push(a.cidr);
  }
  return used;
}

/**
 * A /24 for the project's network (EDGE_SUBNET) that no Docker network or host interface uses:
 * the file's default (172.28.0.0/24) may be taken by a stack someone else runs on this engine.
 */
export async function freeSubnet(skip: readonly string[] = []): Promise<string> {
  const used = [...await usedSubnets(), ...skip];
  for (let i = 0; i < 254; i++) {
    const candidate = `172.28.${((process.pid + i) % 254) + 1}.0/24`;
    if (!used.some((u) => cidrsOverlap(candidate, u))) return candidate;
  }
  throw new Error(`no free /24 in 172.28.0.0/16 (used: ${used.join(', ')})`);
}

/** Parsed JSON objects among compose log lines (`service_1  | {...}`), with the service name. */
export function jsonLogLines(logs: string): { service: string; line: Record<string, unknown> }[] {
  const out: { service: string; line: Record<string, unknown> }[] = [];
  for (const raw of logs.split('\n')) {
    const bar = raw.indexOf('| ');
    if (bar < 0) continue;
    const text = raw.slice(bar + 2).trim();
    if (!text.startsWith('{')) continue;
    try {
      const line = JSON.parse(text) as unknown;
      if (typeof line === 'object' && line !== null && !Array.isArray(line)) out.push({ service: raw.slice(0, bar).trim().replace(/_\d+$/, ''), line: line as Record<string, unknown> });
    } catch { /* not JSON */ }
  }
  return out;
}

export interface ContainerState {
  readonly id: string;
  readonly status: string;
  readonly exitCode: number;
  readonly oomKilled: boolean;
  readonly startedAt: string;
  readonly finishedAt: string;
  readonly health: string | undefined;
}

export interface ProjectResources {
  readonly containers: string[];
  readonly networks: string[];
  readonly volumes: string[];
}

export interface ComposeProjectOptions {
  /** Extra values for the variables the compose file interpolates (e.g. BLOCKED_COUNTRIES). */
  readonly vars?: Readonly<Record<string, string>>;
}

export interface ComposeProject {
  /** The compose project name (`-p`). */
  readonly name: string;
  /** The project directory: compose-setup.ts `--out` (secrets, PKI, GeoIP dir, .env). */
  readonly dir: string;
  /** The client port, TLS (`https://127.0.0.1:<port>`; the certificate compose-setup.ts issues names that address). */
  readonly edgeUrl: string;
  /** The CA of that certificate (deploy/.secrets/pki/edge-ca.crt under `dir`): what `curl --cacert` is given. */
  readonly edgeCaFile: string;
  /** Envoy's ingest listener (INGEST_PORT), published on its own free port. */
  readonly ingestUrl: string;
  readonly subnet: string;
  /** What compose was given for the file's variables. */
  readonly vars: Readonly<Record<string, string>>;
  /** The environment every compose command runs with. */
  readonly env: NodeJS.ProcessEnv;
  /** `docker-compose -p … -f deploy/docker-compose.yml --project-directory <dir> --env-file <dir>/.env <args>`. */
  compose(args: readonly string[], timeoutMs?: number): Promise<RunResult>;
  /** `docker-compose build` (project directory deploy/, so `build.context: ..` is the checkout). */
  build(timeoutMs?: number): Promise<RunResult>;
  /** `up -d --no-build`, retried on another subnet if the chosen one was taken meanwhile. */
  up(timeoutMs?: number): Promise<RunResult>;
  /** `docker-compose logs --no-color [service]`. */
  logs(service?: string): Promise<string>;
  /** The last lines of every service's log, for a failure message. */
  logTail(lines?: number): Promise<string>;
  /** The container of a service (running or exited), by compose's labels. */
  container(service: string): Promise<ContainerState>;
  /** `docker-compose exec -T <service> <cmd…>`. */
  exec(service: string, cmd: readonly string[], timeoutMs?: number): Promise<RunResult>;
  /** `scripts/node deploy/compose-setup.ts --out <dir> [...args]`. */
  setup(args?: readonly string[]): Promise<RunResult>;
  /** Replaces the GeoIP database the way operations.md says: write a temp name in the directory, rename over. */
  replaceGeoip(bytes: Buffer): void;
  /** Containers, networks and volumes labelled with this project. */
  resources(): Promise<ProjectResources>;
  /** `down -v --remove-orphans`. */
  down(timeoutMs?: number): Promise<RunResult>;
  /** Removes the project directory. */
  removeDir(): void;
}

/** Prepares a project: a 0755 temp directory (searchable by the containers' user) and a free port and subnet. */
export async function composeProject(opts: ComposeProjectOptions = {}): Promise<ComposeProject> {
  const name = `edgee2e${process.pid}${Date.now().toString(36).slice(-4)}`;
  const dir = tempDir('edge-compose-e2e-');
  chmodSync(dir, 0o755);
  const port = await freePort();
  const ingestPort = await freePort();
  const images = imageEnv();
  let subnet = await freeSubnet();
  const vars: Record<string, string> = {
    ...images,
    EDGE_PUBLISH: `127.0.0.1:${port}`,
    INGEST_PUBLISH: `127.0.0.1:${ingestPort}`,
    EDGE_SUBNET: subnet,
    ...opts.vars,
  };
  const env: NodeJS.ProcessEnv = { ...composeBaseEnv(), ...vars, COMPOSE_DOCKER_CLI_BUILD: '1', DOCKER_BUILDKIT: '1' };
  const envFile = join(dir, COMPOSE_FILES.env);
  const base = (projectDir: string): string[] => ['-p', name, '-f', COMPOSE_FILE, '--project-directory', projectDir, '--env-file', envFile];
  const compose = (args: readonly string[], timeoutMs = 60_000): Promise<RunResult> => run(COMPOSE_BIN, [...base(dir), ...args], { timeoutMs, env });
  const label = `label=com.docker.compose.project=${name}`;
  const docker = (args: readonly string[], timeoutMs = 30_000): Promise<RunResult> => run(dockerCli(), args, { timeoutMs, env });

  const project: ComposeProject = {
    name,
    dir,
    edgeUrl: `https://127.0.0.1:${port}`,
    edgeCaFile: join(dir, COMPOSE_FILES.edgeCa),
    ingestUrl: `http://127.0.0.1:${ingestPort}`,
    get subnet() { return subnet; },
    get vars() { return vars; },
    env,
    compose,
    build: (timeoutMs = 600_000) => run(COMPOSE_BIN, [...base(join(ROOT, 'deploy')), 'build'], { timeoutMs, env }),
    async up(timeoutMs = 180_000) {
      let r = await compose(['up', '-d', '--no-build'], timeoutMs);
      for (let attempt = 0; attempt < 3 && r.status !== 0 && /overlap/i.test(r.stderr); attempt++) {
        // Another stack took the subnet between the choice and `up`: next free one.
        await compose(['down', '-v', '--remove-orphans'], 60_000);
        subnet = await freeSubnet([subnet]);
        vars['EDGE_SUBNET'] = subnet;
        env['EDGE_SUBNET'] = subnet;
        r = await compose(['up', '-d', '--no-build'], timeoutMs);
      }
      return r;
    },
    async logs(service) {
      return ok(await compose(['logs', '--no-color', ...(service === undefined ? [] : [service])], 60_000)).stdout;
    },
    async logTail(lines = 80) {
      const r = await compose(['logs', '--no-color', '--tail', String(lines)], 60_000);
      return `--- docker-compose logs --tail ${lines} (project ${name}) ---\n${r.stdout}${r.stderr}`;
    },
    async container(service) {
      const ids = ok(await docker(['ps', '-a', '-q', '--no-trunc', '--filter', label, '--filter', `label=com.docker.compose.service=${service}`])).stdout.split('\n').filter((l) => l !== '');
      if (ids.length !== 1) throw new Error(`project ${name}: ${ids.length} containers for service ${service}`);
      const fmt = '{{json .State}}';
      const s = JSON.parse(ok(await docker(['inspect', '--format', fmt, ids[0] ?? ''])).stdout) as {
        Status: string; ExitCode: number; OOMKilled: boolean; StartedAt: string; FinishedAt: string; Health?: { Status: string };
      };
      return { id: ids[0] ?? '', status: s.Status, exitCode: s.ExitCode, oomKilled: s.OOMKilled, startedAt: s.StartedAt, finishedAt: s.FinishedAt, health: s.Health?.Status };
    },
    exec: (service, cmd, timeoutMs = 30_000) => compose(['exec', '-T', service, ...cmd], timeoutMs),
    setup: (args = []) => run(NODE, [join(ROOT, 'deploy/compose-setup.ts'), '--out', dir, ...args], { timeoutMs: 60_000 }),
    replaceGeoip(bytes) {
      const tmp = join(dir, COMPOSE_FILES.geoipDir, `.country.mmdb.${process.pid}.tmp`);
      writeFileSync(tmp, bytes, { mode: 0o444 });
      chmodSync(tmp, 0o444);
      renameSync(tmp, join(dir, COMPOSE_FILES.geoipDb));
    },
    async resources() {
      const list = async (args: string[]): Promise<string[]> => ok(await docker(args)).stdout.split('\n').filter((l) => l !== '');
      return {
        containers: await list(['ps', '-a', '-q', '--filter', label]),
        networks: await list(['network', 'ls', '-q', '--filter', label]),
        volumes: await list(['volume', 'ls', '-q', '--filter', label]),
      };
    },
    down: (timeoutMs = 90_000) => compose(['down', '-v', '--remove-orphans', '--timeout', '20'], timeoutMs),
    removeDir: () => {
      for (const sig of SIGNALS) process.off(sig, onSignal);
      rmSync(dir, { recursive: true, force: true });
    },
  };
  // Interrupted (Ctrl-C, a CI job's SIGTERM): remove the project before going, synchronously and bounded.
  const onSignal = (sig: NodeJS.Signals): void => {
    spawnSync(COMPOSE_BIN, [...base(dir), 'down', '-v', '--remove-orphans', '--timeout', '5'], { env, stdio: 'ignore', timeout: 60_000 });
    rmSync(dir, { recursive: true, force: true });
    process.exit(sig === 'SIGINT' ? 130 : 143);
  };
  for (const sig of SIGNALS) process.once(sig, onSignal);
  return project;
}

/** Polls `probe` until it returns a value (not undefined) or `timeoutMs` passes; then throws with `what`. */
export async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined>, everyMs = 200): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      // One probe may not outlive the deadline either (a fetch that never answers).
      const left = Math.max(end - Date.now(), 1000);
      const v = await Promise.race([probe(), sleep(left, undefined, { ref: false }).then(() => { throw new Error(`a probe took over ${left} ms`); })]);
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() >= end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last === undefined ? '' : ` (last error: ${(last as Error).message})`}`);
    await sleep(everyMs);
  }
}
