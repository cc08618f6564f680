/**
 * The podman side of this host: its hard limits (nofile, nproc) written into containers.conf from
 * the template, the environment every podman call runs with (CONTAINERS_CONF), and one podman call.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../paths.ts';

export const CONF_TEMPLATE = join(ROOT, 'deploy/podman/containers.conf.template');
/** podman cannot raise a container's RLIMIT_NPROC above its own, which it lowers to this. */
export const PODMAN_NPROC_CAP = 32768;

export interface HardLimits { readonly nofile: number; readonly nproc: number }

/** This process's hard limits (ulimit -Hn / -Hu), from /proc/self/limits; "unlimited" is Infinity. */
export function hardLimits(text = readFileSync('/proc/self/limits', 'utf8')): HardLimits {
  const hard = (label: string): number => {
    const m = new RegExp(`^${label}\\s+(\\S+)\\s+(\\S+)`, 'm').exec(text);
    if (m === null) throw new Error(`/proc/self/limits has no "${label}" line`);
    return m[2] === 'unlimited' ? Infinity : Number(m[2]);
  };
  return { nofile: hard('Max open files'), nproc: hard('Max processes') };
}

/** containers.conf.template filled in: limits from the machine, directories of the run. */
export function containersConf(dir: string, limits: HardLimits = hardLimits()): string {
  const nofile = Number.isFinite(limits.nofile) ? limits.nofile : 1048576;
  const values: Record<string, string> = {
    NPROC: String(Math.min(limits.nproc, PODMAN_NPROC_CAP)),
    NOFILE: String(nofile),
    NETWORK_CONFIG_DIR: join(dir, 'cni'),
    EVENTS_LOGFILE: join(dir, 'events.log'),
  };
  return readFileSync(CONF_TEMPLATE, 'utf8').replace(/\{\{([A-Z_]+)\}\}/g, (_, name: string) => {
    const v = values[name];
    if (v === undefined) throw new Error(`${CONF_TEMPLATE}: unknown placeholder {{${name}}}`);
    return v;
  });
}

/** Writes <dir>/containers.conf (and the directories it names); returns its path. */
export function writeContainersConf(dir: string, limits?: HardLimits): string {
  mkdirSync(join(dir, 'cni'), { recursive: true, mode: 0o700 });
  const path = join(dir, 'containers.conf');
  writeFileSync(path, containersConf(dir, limits));
  return path;
}

/** This process's environment with CONTAINERS_CONF set: what every podman call runs with. */
export function podmanEnv(conf: string): NodeJS.ProcessEnv {
  return { ...process.env, CONTAINERS_CONF: conf };
}

/** Runs podman with `args` (SIGKILL after `timeoutMs`); throws when it cannot be run. */
export function podmanSync(args: readonly string[], env: NodeJS.ProcessEnv, timeoutMs = 60_000): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync('podman', args, { encoding: 'utf8', env, timeout: timeoutMs, killSignal: 'SIGKILL' });
  if (r.error !== undefined) throw new Error(`podman ${args.join(' ')}: ${r.error.message}`);
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}
