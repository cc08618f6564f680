/**
 * `npm start`'s readiness probes: whether a child answers (an HTTP 200, an open TCP port, Redis's
 * PONG, or a sealed service's 503 sealed), each outcome worded for the one line that names a
 * component which does not come up.
 */
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { createRedis, neverSent } from '../../authz/src/common/adapters/redis.ts';
import { getOverSocket } from '../dev/unix-http.ts';
import type { Probe } from './supervisor.ts';

/** Why a connection or request failed, in a few words (`connection refused (nothing listening)`, `no answer within 2 s`). */
export function failure(err: unknown): string {
  const e = err as { name?: string; code?: string; cause?: { code?: string; message?: string }; message?: string };
  if (e.name === 'TimeoutError') return 'no answer within 2 s';
  const code = e.code ?? e.cause?.code;
  if (code === 'ECONNREFUSED') return 'connection refused (nothing listening)';
  return code ?? e.cause?.message ?? e.message ?? String(err);
}

/** GET `url`, through the Unix socket `socketPath` when given (MARKET_SOCKET: only the URL's path counts then). */
async function get(url: string, socketPath: string | undefined): Promise<{ status: number; body: string }> {
  if (socketPath !== undefined) return getOverSocket(socketPath, new URL(url).pathname);
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
  return { status: res.status, body: await res.text() };
}

/** GET `url`: ready on 200; else its status and the start of its body (one line). */
export const httpOk = (url: string, socketPath?: string) => async (): Promise<Probe> => {
  try {
    const res = await get(url, socketPath);
    const body = res.body.replace(/\s+/g, ' ').trim().slice(0, 200);
    const shownUrl = socketPath === undefined ? url : `${new URL(url).pathname} on ${socketPath}`;
    return { ok: res.status === 200, answer: `GET ${shownUrl} answered ${res.status}${body === '' ? '' : ` ${body}`}` };
  } catch (err) {
    return { ok: false, answer: `GET ${socketPath === undefined ? url : `${new URL(url).pathname} on ${socketPath}`}: ${failure(err)}` };
  }
};

/** 127.0.0.1:`port` accepts a TCP connection. */
export const tcpOpen = (port: number) => (): Promise<Probe> => new Promise((resolve) => {
  const sock = connect(port, '127.0.0.1', () => { sock.destroy(); resolve({ ok: true, answer: `127.0.0.1:${port} accepts connections` }); });
  sock.once('error', (err) => resolve({ ok: false, answer: `127.0.0.1:${port}: ${failure(err)}` }));
});

/** How messages show a REDIS_URL: without its password. */
export const redisShown = (url: string): string => url.replace(/^([a-z+]+:\/\/)[^@/]*@/, '$1…@');
/** How long a REDIS_URL given in the environment may take to answer before the stack gives up. */
export const REDIS_WAIT_MS = 30_000;

/**
 * A REDIS_URL given in the environment (not this stack's redis-server) answers PING before the
 * TS service starts: the service would start anyway and log a reconnect error after another,
 * and the stack would never become ready. One line while waiting; after `ms` the last error.
 * Returns undefined once it answers, else that error (also when `stopping()` turns true).
 */
export async function waitForRedis(url: string, ms: number, stopping: () => boolean, say: (msg: string) => void): Promise<string | undefined> {
  const client = createRedis(url, { connectTimeout: 1000 });
  let last = 'no answer';
  client.on('error', (err: Error) => { last = err.message; });
  const end = Date.now() + ms;
  let said = false;
  try {
    while (!stopping()) {
      try {
        if (await client.ping() === 'PONG') {
          if (said) say(`Redis at ${redisShown(url)} answers`);
          return undefined;
        }
      } catch (err) {
        if (!neverSent(err)) last = (err as Error).message; // else: not connected; the connection's error says why
      }
      if (Date.now() >= end) return last;
      if (!said) say(`waiting for Redis at ${redisShown(url)} (REDIS_URL): the TS service starts once it answers (at most ${ms / 1000} s)`);
      said = true;
      await sleep(250);
    }
    return last;
  } finally {
    client.disconnect();
  }
}

/** Whether `url` answers 503 `sealed` (docs/api.md "Seal"). */
const answersSealed = (url: string, socketPath?: string) => async (): Promise<boolean> => {
  try {
    const r = await get(url, socketPath);
    return r.status === 503 && (JSON.parse(r.body) as { error?: unknown }).error === 'sealed';
  } catch {
    return false;
  }
};

/** `probe`, or — while `sealed()` (AUTHZ_SEAL_FILE present) — `url` answering 503 sealed: a sealed service is up. */
export const orSealed = (sealed: () => boolean, probe: () => Promise<Probe>, url: string, socketPath?: string) => async (): Promise<Probe> => {
  const p = await probe();
  if (p.ok || !sealed()) return p;
  return (await answersSealed(url, socketPath)()) ? { ok: true, answer: `GET ${url} answered 503 sealed` } : p;
};
