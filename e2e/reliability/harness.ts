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

export interface Outcome { readonly kind: string; readonly status: number; readonly startedAt: number; readonly endedAt: number; readonly json: boolean; readonly body: string; readonly meta?: string }

/** One request through Envoy; never throws (a transport error is status 0). */
export async function hit(stack: Stack, kind: string, method: string, path: string, body?: Buffer | string, headers: Record<string, string> = {}, meta?: string): Promise<Outcome> {
  const startedAt = Date.now();
  try {
    const res = await fetch(`${stack.edgeUrl}${path}`, { method, headers, ...(body === undefined ? {} : { body: typeof body === 'string' ? body : new Uint8Array(body) }) });
    const text = await res.text();
    return { kind, status: res.status, startedAt, endedAt: Date.now(), json: (res.headers.get('content-type') ?? '').startsWith('application/json'), body: text.slice(0, 300), ...(meta === undefined ? {} : { meta }) };
  } catch {
    return { kind, status: 0, startedAt, endedAt: Date.now(), json: false, body: '', ...(meta === undefined ? {} : { meta }) };
  }
}

/** Runs `next()` requests from `concurrency` loops until `untilMs` (or `maxRequests`), at most `rps` per second overall. */
export async function drive(next: () => Promise<Outcome>, opts: { concurrency: number; durationMs: number; rps?: number; maxRequests?: number }): Promise<Outcome[]> {
  const out: Outcome[] = [];
  const end = Date.now() + opts.durationMs;
  const interval = opts.rps === undefined ? 0 : (1000 * opts.concurrency) / opts.rps;
  let issued = 0;
  await Promise.all(Array.from({ length: opts.concurrency }, async () => {
    while (Date.now() < end && (opts.maxRequests === undefined || issued < opts.maxRequests)) {
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
