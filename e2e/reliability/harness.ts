/**
 * Faults under load: a steady load through Envoy (bounded concurrency, bounded time), one
 * fault at a time, outcome counts. Used by e2e/reliability.test.ts (short variants, npm test)
 * and scripts/reliability.ts (full variants, npm run reliability → docs/reliability.md).
 */
import { randomBytes } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Stack } from '../lib/stack.ts';
import { demoDocument } from '../../scripts/edge-client.ts';
import { signed, orderBody } from '../lib/client.ts';

export interface Outcome {
  readonly kind: string;
  readonly status: number;
  readonly startedAt: number;
  readonly endedAt: number;
  readonly json: boolean;
  /** The first 300 characters of the body; for a transport error (status 0), the error. */
  readonly body: string;
  /** The x-request-id Envoy answered with (its access-log line has the same id). */
  readonly requestId?: string;
  readonly meta?: string;
}

/** One request through Envoy; never throws (a transport error is status 0). */
export async function hit(stack: Stack, kind: string, method: string, path: string, body?: Buffer | string, headers: Record<string, string> = {}, meta?: string): Promise<Outcome> {
  const startedAt = Date.now();
  const m = meta === undefined ? {} : { meta };
  try {
    const res = await fetch(`${stack.edgeUrl}${path}`, { method, headers, ...(body === undefined ? {} : { body: typeof body === 'string' ? body : new Uint8Array(body) }) });
    const text = await res.text();
    const id = res.headers.get('x-request-id');
    return { kind, status: res.status, startedAt, endedAt: Date.now(), json: (res.headers.get('content-type') ?? '').startsWith('application/json'), body: text.slice(0, 300), ...(id === null ? {} : { requestId: id }), ...m };
  } catch (err) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    return { kind, status: 0, startedAt, endedAt: Date.now(), json: false, body: `transport error: ${cause?.code ?? ''} ${cause?.message ?? String(err)}`.slice(0, 300), ...m };
  }
}

/** Envoy's access-log lines (JSON, envoy/render/access-log.ts) by request id. */
function accessLogLines(stack: Stack, ids: ReadonlySet<string>): Map<string, Record<string, unknown>> {
  const found = new Map<string, Record<string, unknown>>();
  for (const raw of stack.logs().split('\n')) {
    const line = raw.replace(/^\[[a-z]+\] /, '');
    if (!line.startsWith('{"')) continue;
    try {
      const l = JSON.parse(line) as Record<string, unknown>;
      if (typeof l['request_id'] === 'string' && ids.has(l['request_id'])) found.set(l['request_id'], l);
    } catch { /* a line cut by the pipe, or not JSON */ }
  }
  return found;
}

/**
 * What went wrong, for an assertion message: every failed outcome grouped by its status, body
 * (request id removed) and Envoy's access-log flags, details, upstream host and attempts. Waits
 * for the lines up to `waitMs`: Envoy flushes its access log every 10 s by default
 * (--file-flush-interval-msec), so the margin is that interval plus 2 s. Only on the failure path.
 * With `from` (the fault's time), each group also says when its requests started relative to it.
 */
export async function explainFailures(stack: Stack, failed: readonly Outcome[], from?: number, waitMs = 12_000): Promise<string> {
  const ids = new Set(failed.flatMap((o) => (o.requestId === undefined ? [] : [o.requestId])));
  let lines = accessLogLines(stack, ids);
  for (const end = Date.now() + waitMs; lines.size < ids.size && Date.now() < end; lines = accessLogLines(stack, ids)) await sleep(250);
  const groups = new Map<string, Outcome[]>();
  for (const o of failed) {
    const l = o.requestId === undefined ? undefined : lines.get(o.requestId);
    const log = l === undefined ? 'no access-log line' : ['flags', 'details', 'upstream_host', 'upstream_attempts'].map((k) => `${k}=${String(l[k])}`).join(' ');
    const key = `${o.kind} ${o.status} ${o.body.replace(o.requestId ?? '\u0000', '<id>')} | ${log}`;
    groups.set(key, [...(groups.get(key) ?? []), o]);
  }
  const span = (v: number[]): string => `${Math.min(...v)}…${Math.max(...v)} ms`;
  return [...groups].map(([k, os]) => `${os.length}× ${k} | took ${span(os.map((o) => o.endedAt - o.startedAt))}${from === undefined ? '' : `, started ${span(os.map((o) => o.startedAt - from))} after the fault`}`).join('\n');
}

/**
 * Runs `next()` requests from `concurrency` loops for `durationMs` (or `maxRequests`), at most
 * `rps` per second overall; with `until`, for as long as it returns false instead (`durationMs`
 * then is only the hard bound), so a phase that must see the stack recover is not cut short by a
 * slow restart on a busy host.
 */
export async function drive(next: () => Promise<Outcome>, opts: { concurrency: number; durationMs: number; rps?: number; maxRequests?: number; until?: () => boolean }): Promise<Outcome[]> {
  const out: Outcome[] = [];
  const end = Date.now() + opts.durationMs;
  const interval = opts.rps === undefined ? 0 : (1000 * opts.concurrency) / opts.rps;
  let issued = 0;
  await Promise.all(Array.from({ length: opts.concurrency }, async () => {
    while (Date.now() < end && !(opts.until?.() ?? false) && (opts.maxRequests === undefined || issued < opts.maxRequests)) {
      issued++;
      const t0 = Date.now();
      out.push(await next());
      if (interval > 0) {
        const wait = interval - (Date.now() - t0);
        if (wait > 0) await sleep(wait);
      }
    }
  }));
  return out;
}

export function count(outcomes: readonly Outcome[]): Record<string, number> {
  const c: Record<string, number> = {};
  for (const o of outcomes) c[`${o.kind}:${o.status}`] = (c[`${o.kind}:${o.status}`] ?? 0) + 1;
  return c;
}

/** A fresh signed ingest for a unique market (so "stored" is observable per request). */
export function uniqueIngest(stack: Stack, prefix: string): { id: string; body: Buffer; headers: Record<string, string> } {
  const id = `${prefix}-${randomBytes(6).toString('hex')}`;
  const s = signed(stack, demoDocument(id, 1), id);
  return { id, body: s.body, headers: s.headers };
}

export function orderFor(market: string): string {
  return orderBody(market, randomBytes(48));
}

export function rssKb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m === null ? 0 : Number(m[1]);
}

export function openFds(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** First time (ms after `from`) at which an outcome of `kind` succeeded (status 200). */
export function recoveryMs(outcomes: readonly Outcome[], kind: string, from: number): number | undefined {
  const ok = outcomes.filter((o) => o.kind === kind && o.status === 200 && o.startedAt >= from).map((o) => o.endedAt);
  return ok.length === 0 ? undefined : Math.min(...ok) - from;
}

export async function metric(stack: Stack, name: string): Promise<number> {
  const text = await (await fetch(`${stack.authzAdmin}/metrics`)).text();
  let sum = 0;
  for (const line of text.split('\n')) if (line.startsWith(name)) sum += Number(line.split(' ').at(-1));
  return sum;
}
