/**
 * Child processes for benchmarks: servers run in their own process so their CPU is read
 * from /proc separately from the load generator's.
 *
 * Two kinds:
 *  - Node children (`forkNode`) speak a tiny IPC protocol: the child calls `serveParent`
 *    (./serve-parent.ts) once it listens ({type:'ready', port}), then answers named calls (e.g. 'stats').
 *    A child exits when its parent goes away (IPC disconnect), so none outlive a crash.
 *  - Any other program (`spawnProgram`, e.g. Envoy): started with its output in a log
 *    file; readiness is the caller's business (poll a port or an admin endpoint).
 * Both are stopped by their own pid only (SIGTERM, then SIGKILL after a grace period),
 * and anything still running when the parent exits is killed.
 */
import { fork, spawn, type ChildProcess } from 'node:child_process';
import { openSync, closeSync } from 'node:fs';

const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of running) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.once(sig, () => {
    for (const c of running) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    process.exit(130);
  });
}

/** A started child process. */
export interface Child {
  readonly pid: number;
  readonly process: ChildProcess;
  /** SIGTERM, wait up to `graceMs`, then SIGKILL. Resolves once it has exited. */
  stop(graceMs?: number): Promise<void>;
}

/** A Node child that reported `ready` over IPC. */
export interface NodeChild extends Child {
  /** The port the child reported when it became ready. */
  readonly port: number;
  /** Invokes a named handler in the child and resolves with its result. */
  call<T = unknown>(cmd: string, arg?: unknown): Promise<T>;
}

type FromChild =
  | { type: 'ready'; port: number }
  | { type: 'reply'; id: number; result?: unknown; error?: string };

function track(cp: ChildProcess): Child {
  if (cp.pid === undefined) throw new Error('child process did not start');
  running.add(cp);
  const exited = new Promise<void>((resolve) => {
    if (cp.exitCode !== null || cp.signalCode !== null) resolve();
    else cp.once('exit', () => resolve());
  }).finally(() => running.delete(cp));
  return {
    pid: cp.pid,
    process: cp,
    async stop(graceMs = 2000) {
      if (cp.exitCode === null && cp.signalCode === null) cp.kill('SIGTERM');
      const timer = setTimeout(() => cp.kill('SIGKILL'), graceMs);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** stdio for a child: stdout and stderr appended to `logFile`; `done` closes our copy of the fd. */
function logStdio(logFile: string | undefined): { stdio: ['ignore', number | 'ignore', number | 'ignore']; done(): void } {
  if (logFile === undefined) return { stdio: ['ignore', 'ignore', 'ignore'], done() {} };
  const fd = openSync(logFile, 'a');
  return { stdio: ['ignore', fd, fd], done: () => closeSync(fd) };
}

/**
 * Forks `script` with the current Node binary (type stripping included) and waits for its
 * `ready` message. stdout/stderr go to `logFile` (or nowhere).
 */
export async function forkNode(script: string, opts: {
  args?: readonly string[];
  env?: NodeJS.ProcessEnv;
  logFile?: string;
  execArgv?: readonly string[];
  readyTimeoutMs?: number;
} = {}): Promise<NodeChild> {
  const log = logStdio(opts.logFile);
  const cp = fork(script, [...(opts.args ?? [])], {
    env: opts.env ?? process.env,
    execArgv: [...(opts.execArgv ?? [])],
    stdio: [...log.stdio, 'ipc'],
  });
  log.done();
  const child = track(cp);
  const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  let nextId = 1;
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${script}: not ready after ${opts.readyTimeoutMs ?? 20_000} ms`)), opts.readyTimeoutMs ?? 20_000);
    cp.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${script} exited before ready (code ${code}, signal ${signal}); see ${opts.logFile ?? 'its output'}`));
    });
    cp.on('message', (m: FromChild) => {
      if (m.type === 'ready') {
        clearTimeout(timer);
        resolve(m.port);
      } else if (m.type === 'reply') {
        const p = pending.get(m.id);
        pending.delete(m.id);
        if (m.error !== undefined) p?.reject(new Error(m.error));
        else p?.resolve(m.result);
      }
    });
  });
  cp.once('exit', () => {
    for (const p of pending.values()) p.reject(new Error(`${script} exited`));
    pending.clear();
  });
  return {
    ...child,
    port,
    call<T>(cmd: string, arg?: unknown): Promise<T> {
      const id = nextId++;
      return new Promise<T>((resolve, reject) => {
        pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
        cp.send({ type: 'call', id, cmd, arg });
      });
    },
  };
}

/** Starts any executable with its output appended to `logFile`. */
export function spawnProgram(cmd: string, args: readonly string[], opts: { env?: NodeJS.ProcessEnv; logFile?: string } = {}): Child {
  const log = logStdio(opts.logFile);
  const cp = spawn(cmd, [...args], { env: opts.env ?? process.env, stdio: log.stdio });
  log.done();
  return track(cp);
}
