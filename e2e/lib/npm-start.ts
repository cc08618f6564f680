/**
 * `npm start` under test: a fresh run directory and free ports (`freshStart`), scripts/start.ts
 * started with its output collected (`startScript`, or `Collected` around any child), waited for
 * by a line it prints, stopped with Ctrl-C's signal within a bound (`stop`). Used by the tests of
 * the start sequence (e2e/start*.test.ts, e2e/uds.test.ts) and the docs walkthroughs
 * (e2e/docs.test.ts).
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { freePort } from '../../testkit/redis-server.ts';
import { tempDir } from '../../testkit/temp-dir.ts';
import { recordPem, recordSecret, shortenEnvoyFlush, traceAudit } from '../../testkit/trace-ledger.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const NODE = join(ROOT, 'scripts', 'node');

/** A child whose stdout and stderr are collected in `out`. */
export class Collected {
  out = '';
  readonly child: ChildProcess;
  readonly exited: Promise<number | null>;
  /** The exit code `stop` saw, or `killed` when SIGINT did not stop it within the bound. */
  code: number | null | 'killed' | undefined;
  /** Under the trace audit, once the stack's Envoy exports every AUDIT_FLUSH_MS: how long a stop waits for its last spans. */
  #untilFlushed: (() => number) | undefined;
  constructor(child: ChildProcess, envoyAdminPort?: string) {
    this.child = child;
    child.stdout?.on('data', (d: Buffer) => { this.out += d.toString(); });
    child.stderr?.on('data', (d: Buffer) => { this.out += d.toString(); });
    this.exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)));
    // The trace audit: what the stack wrote (its keys) is in the ledger before a test removes it.
    if (traceAudit) child.once('exit', () => { for (const d of freshRunDirs) recordRunDir(d); });
    // The trace audit: npm start's Envoy exports every 5 s and drops what it holds when stopped;
    // once its admin answers, it exports every AUDIT_FLUSH_MS instead, so its last spans are audited.
    if (traceAudit && envoyAdminPort !== undefined) void this.#shortenFlush(envoyAdminPort);
  }
  async #shortenFlush(adminPort: string): Promise<void> {
    while (this.child.exitCode === null && this.child.signalCode === null) {
      try {
        this.#untilFlushed = await shortenEnvoyFlush(adminPort);
        return;
      } catch {
        await sleep(200); // Envoy not up yet (or this run does not trace: then it never is)
      }
    }
  }
  /** Waits until the output matches `re`, the process exits or `ms` pass, then asserts the match (the output in the message). */
  async waitFor(re: RegExp, ms: number): Promise<void> {
    const end = Date.now() + ms;
    while (!re.test(this.out) && Date.now() < end && this.child.exitCode === null) await sleep(50);
    assert.match(this.out, re);
  }
  /** The exit code; fails the test (with the output) if it does not exit within `ms`. */
  async exit(ms: number): Promise<number | null> {
    const timer = new AbortController();
    const code = await Promise.race([this.exited, sleep(ms, 'timeout', { signal: timer.signal }).catch(() => 'aborted')]);
    timer.abort();
    assert.notEqual(code, 'timeout', `did not exit within ${ms} ms:\n${this.out}`);
    return code as number | null;
  }
  /**
   * Ctrl-C: SIGINT, then up to `ms` for it to exit; SIGKILL after that (`code` is then `killed`).
   * Never throws, so it can end a `finally`; the caller asserts `code`.
   */
  async stop(ms = 30_000): Promise<void> {
    if (this.#untilFlushed !== undefined) await sleep(this.#untilFlushed());
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGINT');
    const timer = new AbortController();
    const code = await Promise.race([this.exited, sleep(ms, 'timeout' as const, { signal: timer.signal }).catch(() => 'aborted' as const)]);
    timer.abort();
    if (code === 'timeout' || code === 'aborted') {
      this.child.kill('SIGKILL');
      await this.exited;
      this.code = 'killed';
    } else {
      this.code = code;
    }
  }
  /** The lines our scripts printed (npm's banner and warnings left out). */
  lines(): string[] {
    return this.out.split('\n').filter((l) => l !== '' && !l.startsWith('> ') && !/^npm (warn|error|notice)/.test(l));
  }
}

/** scripts/start.ts (what `npm start` runs after setup) with `env`, from the checkout's root. */
export function startScript(env: Record<string, string>): Collected {
  return new Collected(spawn(NODE, [join(ROOT, 'scripts/start.ts')], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] }), env['ENVOY_ADMIN_PORT']);
}

/** The port settings npm start listens on or renders. */
export const START_PORTS = ['EDGE_PORT', 'AUTHZ_GRPC_PORT', 'MARKET_PORT', 'AUTHZ_ADMIN_PORT', 'ENVOY_ADMIN_PORT', 'DEV_REDIS_PORT', 'DEV_BACKEND_PORT'] as const;
export type StartPort = (typeof START_PORTS)[number];

/** Settings of the test's own environment that would make npm start use something else than its own (Redis, backend, keys, database). */
const OUTSIDE_SETTINGS = [
  'REDIS_URL', 'ORDER_BACKEND_URL', 'EDGE_INGEST_HMAC', 'EDGE_INGEST_HMAC_PREVIOUS', 'EDGE_FEED_ED25519_PUBLIC_KEY', 'EDGE_FEED_ED25519_KEY',
  'GEOIP_DB', 'NODE_TEST_CONTEXT',
] as const;

/** The run directories freshStart made (the trace audit reads their secrets when a child exits). */
const freshRunDirs = new Set<string>();

/** A hex or base64 key's bytes (a `hex:`/`base64:` prefix as the service's key formats have it), else undefined. */
function keyBytes(v: string): Buffer | undefined {
  const raw = v.replace(/^(hex|base64):/, '');
  if (/^([0-9a-fA-F]{2}){16,}$/.test(raw)) return Buffer.from(raw, 'hex');
  return /^[A-Za-z0-9+/]{22,}={0,2}$/.test(raw) ? Buffer.from(raw, 'base64') : undefined;
}

/**
 * The trace audit (testkit/trace-ledger.ts): the secrets npm start wrote into `runDir` (dev.env's
 * values, the admin and rate limit tokens, the PKI's private keys) and the order files (*.bin) a
 * test put there, into the ledger; a no-op outside the audit or once the directory is gone.
 */
export function recordRunDir(runDir: string): void {
  if (!traceAudit) return;
  const bytes = (f: string): Buffer | undefined => {
    try {
      return readFileSync(join(runDir, f));
    } catch { return undefined; }
  };
  const read = (f: string): string | undefined => bytes(f)?.toString('utf8');
  for (const [k, v] of Object.entries(parseKeys(read('dev.env') ?? ''))) if (/HMAC|KEY|TOKEN/.test(k)) recordSecret(`npm start dev.env ${k}`, v, keyBytes(v));
  for (const f of ['admin-token', 'ratelimit-token']) recordSecret(`npm start ${f}`, read(f)?.trim());
  let files: string[];
  try {
    files = readdirSync(runDir, { recursive: true, encoding: 'utf8' });
  } catch { return; }
  for (const f of files) {
    if (f.endsWith('.key')) recordPem(`npm start ${f}`, read(f) ?? '');
    else if (f.endsWith('.bin')) recordSecret(`order file ${f}`, bytes(f));
  }
}

export interface FreshStart<P extends StartPort = StartPort> {
  readonly runDir: string;
  readonly ports: Record<P, number>;
  readonly env: Record<string, string>;
}

/**
 * A fresh run directory (DEV_RUN_DIR, removed at exit at the latest; `runDir` one the test made),
 * a free port for each of `ports` (default START_PORTS), and this process's environment without
 * OUTSIDE_SETTINGS and `unset`, with LOG_LEVEL=warn and `extra`.
 */
export async function freshStart<P extends StartPort = StartPort>(opts: {
  prefix?: string; runDir?: string; ports?: readonly P[]; unset?: readonly string[]; extra?: Record<string, string>;
} = {}): Promise<FreshStart<P>> {
  const runDir = opts.runDir ?? tempDir(opts.prefix ?? 'edge-start-');
  if (traceAudit) freshRunDirs.add(runDir);
  const names = opts.ports ?? (START_PORTS as readonly StartPort[] as readonly P[]);
  const ports = Object.fromEntries(await Promise.all(names.map(async (k) => [k, await freePort()] as const))) as Record<P, number>;
  const env: Record<string, string> = { ...process.env as Record<string, string>, DEV_RUN_DIR: runDir, LOG_LEVEL: 'warn' };
  for (const k of [...OUTSIDE_SETTINGS, ...opts.unset ?? []]) delete env[k];
  for (const [k, v] of Object.entries(ports)) env[k] = String(v);
  return { runDir, ports, env: { ...env, ...opts.extra } };
}

/** The settings of a keys file (the run directory's dev.env): its `NAME=value` lines. */
export function keysOf(file: string): Record<string, string> {
  return parseKeys(readFileSync(file, 'utf8'));
}
function parseKeys(text: string): Record<string, string> {
  return Object.fromEntries(text.split('\n')
    .filter((l) => /^[A-Z0-9_]+=/.test(l)).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
}

/** Whether something accepts a TCP connection on 127.0.0.1:`port`. */
export function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(port, '127.0.0.1', () => { sock.destroy(); resolve(true); });
    sock.on('error', () => resolve(false));
  });
}
