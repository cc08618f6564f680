/**
 * The held-bodies attack (issue 26, "No unauthenticated megabytes"): requests whose headers
 * pass every check the headers alone allow, that announce a large body, send all of it but the
 * last byte, and stall, so that whatever buffers bodies holds each one for as long as it waits.
 * Also a reader of a process's resident memory (/proc/<pid>/status VmRSS).
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';

/** What the attack sends: request line and headers (no content-length), the announced body size, how much of it is sent. */
export interface HeldRequest {
  readonly port: number;
  readonly method?: string;
  readonly path: string;
  /** Header lines besides host, content-length and connection. */
  readonly headers: () => Record<string, string>;
  /** The announced content-length. */
  readonly contentLength: number;
  /** Body bytes actually sent (default contentLength - 1: one byte short, so the request never completes). */
  readonly sendBytes?: number;
}

export interface HeldConnection {
  readonly socket: Socket;
  /** The status line's code once an answer arrived (the whole head), else undefined. */
  status: number | undefined;
  /** The answer's bytes so far (head and body). */
  answer: string;
  /** When the first byte of the answer arrived (ms since the epoch). */
  answeredAt: number | undefined;
  /** When the connection was opened and, once it closed, when (ms since the epoch). */
  readonly openedAt: number;
  closedAt: number | undefined;
}

/** Opens one connection, sends the request minus its last body byte(s), and keeps reading whatever comes back. */
export function holdOne(req: HeldRequest): HeldConnection {
  const socket = connect(req.port, '127.0.0.1');
  const held: HeldConnection = { socket, status: undefined, answer: '', answeredAt: undefined, openedAt: Date.now(), closedAt: undefined };
  const headers = { host: 'edge', ...req.headers(), 'content-length': String(req.contentLength) };
  const head = `${req.method ?? 'POST'} ${req.path} HTTP/1.1\r\n${Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`;
  const send = req.sendBytes ?? req.contentLength - 1;
  socket.on('connect', () => {
    socket.write(head);
    if (send > 0) socket.write(Buffer.alloc(send, 0x61));
  });
  socket.on('data', (d: Buffer) => {
    held.answeredAt ??= Date.now();
    held.answer += d.toString('latin1');
    const m = /^HTTP\/1\.1 (\d{3})/.exec(held.answer);
    if (m !== null) held.status = Number(m[1]);
  });
  const closed = (): void => { held.closedAt ??= Date.now(); };
  socket.on('close', closed);
  // The server closing or resetting an unfinished upload is an expected answer here.
  socket.on('error', closed);
  return held;
}

/** The headers of an ingest whose signature headers are well formed and whose timestamp is fresh; the HMAC is wrong. */
export function forgedIngestHeaders(ip: string): Record<string, string> {
  return {
    'x-forwarded-for': ip,
    'content-type': 'application/json',
    'x-edge-timestamp': String(Math.floor(Date.now() / 1000)),
    'x-edge-nonce': randomBytes(16).toString('hex'),
    'x-edge-signature': `v1=${'ab'.repeat(32)}`,
  };
}

/** Opens `ratePerSec` held requests a second for `durationMs`; resolves with every connection once the last one is open. */
export async function holdMany(req: HeldRequest, ratePerSec: number, durationMs: number): Promise<HeldConnection[]> {
  const out: HeldConnection[] = [];
  const start = Date.now();
  const total = Math.floor((ratePerSec * durationMs) / 1000);
  for (let i = 0; i < total; i++) {
    const due = start + (i * 1000) / ratePerSec;
    const wait = due - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    out.push(holdOne(req));
  }
  return out;
}

/** Connections still open (no answer, not closed). */
export function stillHeld(conns: readonly HeldConnection[]): number {
  return conns.filter((c) => c.closedAt === undefined && c.status === undefined).length;
}

/** Closes every connection. */
export function release(conns: readonly HeldConnection[]): void {
  for (const c of conns) c.socket.destroy();
}

/** A process's resident set size in MB (VmRSS of /proc/<pid>/status). */
export function rssMb(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (m === null) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) / 1024;
}
