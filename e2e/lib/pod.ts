/**
 * Podman for e2e/pod.test.ts: the shipped Kubernetes manifests run as a pod by `podman kube play`
 * (deploy/podman/setup.ts prepares the overlay, secrets and containers.conf).
 *
 * - Every podman call runs with CONTAINERS_CONF pointing at the run's own containers.conf (in the
 *   run's temp directory): nothing under /etc changes, the network's CNI file lives there too.
 * - Names carry the run's id (kustomize nameSuffix, the network edge-<id>, the image tags
 *   localhost/edge-pod-<id>/…), so cleanup removes exactly what the run made and the final check
 *   can tell the run's leftovers from anything else in podman's store.
 * - Images come from the Docker engine (`podman pull docker-daemon:<image>`), under the run's
 *   names only (copyImage).
 * - Every child process has a timeout (e2e/lib/compose.ts `run`).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { Socket } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { podmanEnv, writeContainersConf } from '../../deploy/podman/setup.ts';
import { dockerCli, dockerEngine } from './images.ts';
import { ok, run, type RunResult } from './compose.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

export const PODMAN_BIN = 'podman';
/** The image podman builds itself (from catatonit) for every pod's infra container. */
const PAUSE_REPO = 'localhost/podman-pause';

export type Podman = (args: readonly string[], timeoutMs?: number) => Promise<RunResult>;

/** A podman runner with CONTAINERS_CONF = `conf`. */
export function podmanWith(conf: string): Podman {
  const env = podmanEnv(conf);
  return (args, timeoutMs = 60_000) => run(PODMAN_BIN, args, { timeoutMs, env });
}

function syncPodman(conf: string, args: readonly string[], timeoutMs = 60_000): { status: number | null; out: string; error?: string } {
  const r = spawnSync(PODMAN_BIN, args, { encoding: 'utf8', env: podmanEnv(conf), timeout: timeoutMs, killSignal: 'SIGKILL' });
  return { status: r.status, out: `${r.stderr ?? ''}${r.stdout ?? ''}`, ...(r.error === undefined ? {} : { error: (r.error as NodeJS.ErrnoException).code ?? r.error.message }) };
}

/** Names of the pause images in podman's store (`repo:tag`). */
function pauseImages(conf: string): string[] {
  return syncPodman(conf, ['images', '--format', '{{.Repository}}:{{.Tag}}', '--filter', `reference=${PAUSE_REPO}`]).out.split('\n').map((l) => l.trim()).filter((l) => l.startsWith(PAUSE_REPO));
}

export interface PodmanProbe {
  /** One line: why the pod test cannot run here, or undefined. */
  readonly skip: string | undefined;
  /** Pause images present before this process made one (they stay). */
  readonly pauseBefore: readonly string[];
}

/**
 * Whether the pod test can run here: podman installed, root (the pod runs under rootful podman), a
 * Docker engine to take the images from, and podman able to start a container: a pod with only its
 * infra container (podman's own pause image, no other image needed), started and removed.
 */
export function probePodman(): PodmanProbe {
  const v = spawnSync(PODMAN_BIN, ['--version'], { encoding: 'utf8', timeout: 30_000 });
  if (v.error !== undefined) return { skip: `no podman (${(v.error as NodeJS.ErrnoException).code ?? v.error.message}): apt-get install podman catatonit runc`, pauseBefore: [] };
  if (process.getuid?.() !== 0) return { skip: 'not root: the pod test runs rootful podman (the pod\'s uid 1000 reads root-owned secret files through its fsGroup)', pauseBefore: [] };
  const engine = dockerEngine();
  if (!engine.ok) return { skip: `the pod's images come from the Docker engine: ${engine.why}`, pauseBefore: [] };
  const dir = tempDir('edge-pod-probe-');
  try {
    const conf = writeContainersConf(dir);
    const pauseBefore = pauseImages(conf);
    const name = `edge-pod-probe-${process.pid}`;
    const created = syncPodman(conf, ['pod', 'create', '--network', 'none', '--name', name]);
    const started = created.status === 0 ? syncPodman(conf, ['pod', 'start', name]) : created;
    syncPodman(conf, ['pod', 'rm', '-f', '-t', '0', name]);
    if (started.status !== 0) {
      const line = started.out.split('\n').map((l) => l.trim()).find((l) => /^Error/.test(l)) ?? started.out.trim().split('\n')[0] ?? `exit ${started.status}`;
      return { skip: `podman cannot run a container here (${line.slice(0, 200)})`, pauseBefore };
    }
    return { skip: undefined, pauseBefore };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Copies `dockerImage` from the Docker engine into podman's store as `podmanRef` and under no
 * other name: the engine tags it `podmanRef` for the moment of the pull (podman names what it
 * pulls from docker-daemon: after the engine's name; a shared name like docker.io/library/… would
 * move between runs that pull at once) and the tag is removed again.
 */
export async function copyImage(podman: Podman, dockerImage: string, podmanRef: string): Promise<void> {
  ok(await run(dockerCli(), ['tag', dockerImage, podmanRef], { timeoutMs: 30_000 }));
  try {
    ok(await podman(['pull', '-q', `docker-daemon:${podmanRef}`], 300_000));
  } finally {
    await run(dockerCli(), ['rmi', podmanRef], { timeoutMs: 30_000 });
  }
  ok(await podman(['image', 'exists', podmanRef]));
}

/** Seeds a named volume with one file (owner root, 0444), as `podman volume import` of a tar. */
export async function importFile(podman: Podman, volume: string, name: string, content: Buffer): Promise<void> {
  const dir = tempDir('edge-pod-import-');
  try {
    writeFileSync(join(dir, name), content, { mode: 0o444 });
    const tar = join(dir, 'volume.tar');
    ok(await run('tar', ['-C', dir, '--owner=0', '--group=0', '--mode=0444', '-cf', tar, name], { timeoutMs: 30_000 }));
    ok(await podman(['volume', 'import', volume, tar]));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export interface ContainerState {
  readonly status: string;
  readonly exitCode: number;
  readonly oomKilled: boolean;
  readonly startedAt: number;
  readonly finishedAt: number;
}

/** `podman inspect` state of a container; times in ms since the epoch (NaN when unset). */
export async function containerState(podman: Podman, name: string): Promise<ContainerState> {
  const s = JSON.parse(ok(await podman(['inspect', '--type', 'container', '--format', '{{json .State}}', name])).stdout) as {
    Status: string; ExitCode: number; OOMKilled: boolean; StartedAt: string; FinishedAt: string;
  };
  // podman prints "2026-11-24 23:59:01.123456789 +0000 UTC"; Date.parse wants ISO.
  const t = (s1: string): number => {
    const m = /^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)(\.\d+)? ([+-]\d\d)(\d\d)/.exec(s1);
    return m === null ? Date.parse(s1) : Date.parse(`${m[1]}T${m[2]}${(m[3] ?? '').slice(0, 4)}${m[4]}:${m[5]}`);
  };
  return { status: s.Status, exitCode: s.ExitCode, oomKilled: s.OOMKilled, startedAt: t(s.StartedAt), finishedAt: t(s.FinishedAt) };
}

/** The pod's address on `network` (its infra container's). */
export async function podIp(podman: Podman, pod: string, network: string): Promise<string> {
  const infra = ok(await podman(['pod', 'inspect', pod, '--format', '{{.InfraContainerID}}'])).stdout.trim();
  const ip = ok(await podman(['inspect', '--type', 'container', '--format', `{{(index .NetworkSettings.Networks "${network}").IPAddress}}`, infra])).stdout.trim();
  if (!/^\d+\.\d+\.\d+\.\d+$/.test(ip)) throw new Error(`pod ${pod} has no IPv4 address on ${network}: "${ip}"`);
  return ip;
}

/** Everything a container wrote (stdout and stderr). */
export async function containerLogs(podman: Podman, name: string): Promise<string> {
  const r = ok(await podman(['logs', name], 60_000));
  return `${r.stdout}${r.stderr}`;
}

/** Whether a TCP connection to host:port is accepted within `timeoutMs`. */
export function tcpAccepts(host: string, port: number, timeoutMs = 2000): Promise<boolean> {
  return new Promise((resolve) => {
    const s = new Socket();
    const done = (v: boolean): void => { s.destroy(); resolve(v); };
    s.setTimeout(timeoutMs, () => done(false));
    s.once('error', () => done(false));
    s.connect(port, host, () => done(true));
  });
}

/**
 * A redis-server for the pod on the network's gateway address (bound there only: the address
 * exists once the pod is attached, so it starts after `kube play`), with one replica on loopback
 * beside it: the production overlay counts a nonce or a market record only once a replica
 * confirmed it (REDIS_MIN_REPLICAS=1), so the pod runs against a master that has one, as it would
 * in production (where Sentinel also elects it; no Sentinel here). Protected mode is off on the
 * master: with no password Redis otherwise refuses every client that is not on loopback.
 */
export class GatewayRedis {
  readonly dir = tempDir('edge-pod-redis-');
  #procs: ChildProcess[] = [];
  #log = '';
  readonly host: string;
  readonly port: number;
  readonly replicaPort: number;
  constructor(host: string, port: number, replicaPort: number) {
    this.host = host;
    this.port = port;
    this.replicaPort = replicaPort;
  }
  #spawn(name: string, args: string[]): ChildProcess {
    const dir = join(this.dir, name);
    mkdirSync(dir);
    const p = spawn('redis-server', [...args, '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: ['ignore', 'pipe', 'pipe'] });
    p.stdout?.on('data', (d: Buffer) => { this.#log += d.toString(); });
    p.stderr?.on('data', (d: Buffer) => { this.#log += d.toString(); });
    this.#procs.push(p);
    return p;
  }
  async start(timeoutMs = 10_000): Promise<void> {
    const master = this.#spawn('master', ['--bind', this.host, '--port', String(this.port), '--protected-mode', 'no']);
    const replica = this.#spawn('replica', ['--bind', '127.0.0.1', '--port', String(this.replicaPort), '--replicaof', this.host, String(this.port)]);
    const end = Date.now() + timeoutMs;
    while (Date.now() < end) {
      if (master.exitCode !== null || replica.exitCode !== null) break;
      if ((await this.#ask(this.host, this.port, 'INFO replication')).includes('connected_slaves:1')
        && (await this.#ask('127.0.0.1', this.replicaPort, 'INFO replication')).includes('master_link_status:up')) return;
      await sleep(100);
    }
    throw new Error(`redis-server on ${this.host}:${this.port} and its replica on 127.0.0.1:${this.replicaPort} were not in sync within ${timeoutMs} ms:\n${this.#log.slice(-2000)}`);
  }
  /** One inline command's reply (what arrives within 500 ms), or '' when nothing answers. */
  #ask(host: string, port: number, command: string): Promise<string> {
    return new Promise((resolve) => {
      const s = new Socket();
      let got = '';
      const done = (): void => { s.destroy(); resolve(got); };
      s.setTimeout(500, done);
      s.once('error', done);
      s.on('data', (d: Buffer) => {
        got += d.toString();
        // A bulk reply ($<n>\r\n<n bytes>\r\n) or an error line is complete.
        const bulk = /^\$(\d+)\r\n/.exec(got);
        if (bulk === null ? got.endsWith('\r\n') : got.length >= bulk[0].length + Number(bulk[1]) + 2) done();
      });
      s.connect(port, host, () => s.write(`${command}\r\n`));
    });
  }
  async stop(): Promise<void> {
    await Promise.all(this.#procs.map(async (p) => {
      if (p.exitCode !== null || p.signalCode !== null) return;
      const exited = new Promise((resolve) => p.once('exit', resolve));
      p.kill('SIGKILL');
      await Promise.race([exited, sleep(5000)]);
    }));
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export interface PodmanObjects {
  readonly pods: string[];
  readonly containers: string[];
  readonly volumes: string[];
  readonly secrets: string[];
  readonly networks: string[];
  readonly images: string[];
}

/** Every pod, container, volume, secret, network (of this conf) and image name in podman. */
export async function podmanObjects(podman: Podman): Promise<PodmanObjects> {
  const list = async (args: string[]): Promise<string[]> => ok(await podman(args)).stdout.split('\n').map((l) => l.trim()).filter((l) => l !== '');
  return {
    // podman 4.3's `pod ps` lists every pod (it has no -a).
    pods: await list(['pod', 'ps', '--format', '{{.Name}}']),
    containers: await list(['ps', '-a', '--format', '{{.Names}}']),
    volumes: await list(['volume', 'ls', '--format', '{{.Name}}']),
    secrets: await list(['secret', 'ls', '--format', '{{.Name}}']),
    networks: await list(['network', 'ls', '--format', '{{.Name}}']),
    images: await list(['images', '--format', '{{.Repository}}:{{.Tag}}']),
  };
}

/**
 * The pause images present now that were not before the run and that no container uses: the
 * run's to remove. One that another pod uses (a run started meanwhile) is that run's.
 */
export async function newPauseImages(podman: Podman, before: readonly string[]): Promise<string[]> {
  const now = ok(await podman(['images', '--format', '{{.Repository}}:{{.Tag}}', '--filter', `reference=${PAUSE_REPO}`])).stdout.split('\n').map((l) => l.trim()).filter((l) => l.startsWith(PAUSE_REPO));
  const unused: string[] = [];
  for (const image of now.filter((i) => !before.includes(i))) {
    if (ok(await podman(['ps', '-a', '-q', '--filter', `ancestor=${image}`])).stdout.trim() === '') unused.push(image);
  }
  return unused;
}
