/**
 * `npm start`'s supervisor: launches the children (each in a process group of its own, output
 * passed through), restarts a TS service, Redis or demo backend that exits once the stack is
 * ready (after 0.5 s, doubling up to 5 s while it keeps failing; back to 0.5 s after 10 s up),
 * ends the stack when Envoy exits or a child exits while starting, and stops the children in
 * dependency order.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';

/** The children npm start runs. */
export type Name = 'redis' | 'backend' | 'authz' | 'envoy';
interface Run { readonly proc: ChildProcess; readonly exited: Promise<string>; readonly startedAt: number }

/** A readiness probe's outcome; `answer` says what the component answered (for messages). */
export interface Probe { readonly ok: boolean; readonly answer: string }

/** One supervised child. */
export interface Service {
  readonly name: Name;
  /** How messages name it. */
  readonly label: string;
  readonly cmd: string;
  readonly args: readonly string[];
  readonly env: NodeJS.ProcessEnv;
  /** One readiness probe. */
  readonly ready: () => Promise<Probe>;
  run?: Run;
  delayMs: number;
  restarts: number;
  timer?: NodeJS.Timeout;
}

/** What the supervisor needs from npm start. */
export interface SupervisorDeps {
  /** One line of npm start's own output. */
  readonly say: (msg: string) => void;
  /** A child's output, passed through. */
  readonly emit: (stream: NodeJS.WriteStream, chunk: Uint8Array) => void;
  /** Whether the stack is sealed (the TS service comes back sealed after a restart). */
  readonly sealed: () => boolean;
  /** Said when the TS service exits while the stack is sealed. */
  readonly sealedNote: () => string;
  /** Run once every child has stopped, before `exit` (removes the pid file). */
  readonly afterStop: () => void;
  /** Ends npm start with `code` (process.exit). */
  readonly exit: (code: number) => void;
  /** How long a restarted child has to become ready before that is said (30 s). */
  readonly restartReadyMs?: number;
}

/** Launches, restarts and stops npm start's children. */
export class Supervisor {
  readonly services = new Map<Name, Service>();
  /** Set once the stack is ready: from then on a child that exits (but Envoy) is restarted. */
  supervising = false;
  private stoppingNow = false;
  /** SHUTDOWN_GRACE_MS: how long the TS service may take to drain, plus 5 s. */
  shutdownGraceMs = 5000;
  /** ENVOY_ADMIN_PORT: asked to drain its listeners when the stack stops. */
  envoyAdminPort = 0;

  private readonly deps: SupervisorDeps;

  constructor(deps: SupervisorDeps) {
    this.deps = deps;
  }

  /** Whether the stack is stopping (stop() was called). */
  get stopping(): boolean {
    return this.stoppingNow;
  }

  /** Registers `svc` and starts it. */
  add(svc: Service): void {
    this.services.set(svc.name, svc);
    this.launch(svc);
  }

  private launch(svc: Service): void {
    if (this.stoppingNow) return;
    // detached: a process group of its own, so a Ctrl-C at the terminal reaches only this
    // process, which stops the children in order.
    // Their output goes through this process, never straight to the terminal: when the terminal or
    // the pipe goes away, the children keep writing to a pipe that is still read (and dropped here)
    // while they are stopped in order, instead of each failing its own writes.
    const proc = spawn(svc.cmd, [...svc.args], { env: svc.env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    proc.stdout?.on('data', (chunk: Buffer) => this.deps.emit(process.stdout, chunk));
    proc.stderr?.on('data', (chunk: Buffer) => this.deps.emit(process.stderr, chunk));
    const exited = new Promise<string>((resolve) => {
      proc.once('exit', (code, signal) => resolve(code === null ? `signal ${signal ?? '?'}` : `code ${code}`));
      proc.once('error', (err) => resolve(`could not start: ${err.message}`));
    });
    const run: Run = { proc, exited, startedAt: Date.now() };
    svc.run = run;
    void exited.then((how) => {
      if (svc.run === run) svc.run = undefined;
      this.onExit(svc, how, Date.now() - run.startedAt);
    });
  }

  private onExit(svc: Service, how: string, upMs: number): void {
    const { say, sealed } = this.deps;
    if (this.stoppingNow) return;
    if (!this.supervising || svc.name === 'envoy') {
      say(`${svc.label} exited (${how}); stopping the stack`);
      void this.stop(1);
      return;
    }
    if (upMs >= 10_000) svc.delayMs = 500; // it had recovered: start the backoff over
    const delay = svc.delayMs;
    svc.delayMs = Math.min(delay * 2, 5000);
    svc.restarts++;
    say(`${svc.label} exited (${how}); restarting it in ${delay / 1000} s (restart ${svc.restarts})`);
    if (svc.name === 'authz' && sealed()) say(this.deps.sealedNote());
    svc.timer = setTimeout(() => {
      svc.timer = undefined;
      if (this.stoppingNow) return;
      this.launch(svc);
      const run = svc.run;
      void this.waitFor(svc.ready, this.deps.restartReadyMs ?? 30_000).then((p) => {
        if (this.stoppingNow || svc.run !== run) return;
        say(p.ok ? `${svc.label} is back (pid ${run?.proc.pid ?? '?'})${svc.name === 'authz' && sealed() ? ', SEALED' : ''}` : `${svc.label} is not ready 30 s after its restart: ${p.answer}`);
      });
    }, delay);
  }

  /** Probes until one passes, the stack stops, or `timeoutMs` is up: the last outcome. */
  async waitFor(probe: () => Promise<Probe>, timeoutMs: number): Promise<Probe> {
    const end = Date.now() + timeoutMs;
    let last: Probe = { ok: false, answer: 'not asked yet' };
    while (Date.now() < end && !this.stoppingNow) {
      last = await probe();
      if (last.ok) return last;
      await sleep(100);
    }
    return last;
  }

  /** SIGTERM, then up to `ms` for it to exit; SIGKILL to its process group after that. */
  async halt(svc: Service | undefined, ms: number): Promise<void> {
    const run = svc?.run;
    if (svc === undefined || run === undefined) return;
    run.proc.kill('SIGTERM');
    const done = await Promise.race([run.exited.then(() => true), sleep(ms, false, { ref: false })]);
    if (done) return;
    this.deps.say(`${svc.label} did not stop within ${ms / 1000} s; killing it`);
    try {
      process.kill(-(run.proc.pid ?? 0), 'SIGKILL');
    } catch { /* gone */ }
    await run.exited;
  }

  /** Stops the stack in dependency order (once), then exits with `code`. */
  async stop(code: number): Promise<void> {
    if (this.stoppingNow) return;
    this.stoppingNow = true;
    this.supervising = false;
    const t0 = Date.now();
    const services = this.services;
    for (const s of services.values()) clearTimeout(s.timer);
    this.deps.say('stopping: Envoy stops taking requests, the TS service seals and drains, then the backend and Redis stop');
    if (services.get('envoy')?.run !== undefined) {
      // Listeners closed: no new connection; requests in flight finish while the TS service drains.
      try {
        await fetch(`http://127.0.0.1:${this.envoyAdminPort}/drain_listeners?inboundonly`, { method: 'POST', signal: AbortSignal.timeout(1000) });
      } catch { /* Envoy is going anyway */ }
    }
    await this.halt(services.get('authz'), this.shutdownGraceMs + 5000);
    await this.halt(services.get('envoy'), 5000);
    await Promise.all([this.halt(services.get('backend'), 5000), this.halt(services.get('redis'), 10_000)]);
    this.deps.afterStop();
    this.deps.say(`stopped in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    this.deps.exit(code);
  }

  /** SIGKILL to every child's process group (on exit: after an internal error, leave nothing behind). */
  killAll(): void {
    for (const s of this.services.values()) {
      try {
        if (s.run?.proc.pid !== undefined) process.kill(-s.run.proc.pid, 'SIGKILL');
      } catch { /* gone */ }
    }
  }
}
