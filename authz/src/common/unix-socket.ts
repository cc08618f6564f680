/**
 * Unix domain sockets between Envoy and the TS service where they share a host or a pod
 * (AUTHZ_GRPC_SOCKET, MARKET_SOCKET; docs/envoy.md "Unix domain sockets").
 *
 * - The path is absolute and fits sockaddr_un's sun_path (107 bytes and a NUL on Linux).
 * - Before listening (`prepareSocket`): the directory is created (0750) when missing; a socket file
 *   left by a process that crashed (nothing accepts on it) is removed; one something still accepts
 *   on is "in use" (two services on one path would split Envoy's traffic), and a path that is not a
 *   socket is never removed.
 * - After listening (`ownSocket`): the file is made 0660 (owner and group: in the pod Envoy reaches it
 *   through the shared fsGroup; under npm start both run as one user), and its inode and change time are recorded
 *   so that it is removed at exit (`removeOwnSocket`) only while it is still the one this process made.
 */
import { chmodSync, lstatSync, mkdirSync, unlinkSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname, isAbsolute } from 'node:path';

/** sockaddr_un.sun_path is 108 bytes on Linux, NUL included. */
export const SOCKET_PATH_MAX_BYTES = 107;
/** The socket file's mode: read/write (connect) for its owner and group, nothing for others. */
export const SOCKET_MODE = 0o660;
/** The mode of a socket directory this process creates. */
export const SOCKET_DIR_MODE = 0o750;

/** Why a socket path is unusable, or undefined when it is fine. */
export function socketPathProblem(path: string): string | undefined {
  if (!isAbsolute(path)) return 'an absolute path';
  if (Buffer.byteLength(path) > SOCKET_PATH_MAX_BYTES) return `a path of at most ${SOCKET_PATH_MAX_BYTES} bytes (the limit of a Unix socket address)`;
  if (path.endsWith('/')) return 'a file path, not a directory';
  return undefined;
}

/** Thrown when a socket path cannot be listened on; the message names the path and why. */
export class SocketPathError extends Error {
  constructor(path: string, why: string) {
    super(`${path}: ${why}`);
    this.name = 'SocketPathError';
  }
}

function accepts(path: string, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect({ path });
    const done = (ok: boolean): void => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(timeoutMs, () => done(true));
    sock.once('connect', () => done(true));
    sock.once('error', () => done(false));
  });
}

/**
 * Makes `path` ready to listen on: its directory exists, and no socket file is left there by a
 * process that is gone. Returns true when a stale socket was removed.
 */
export async function prepareSocket(path: string): Promise<boolean> {
  mkdirSync(dirname(path), { recursive: true, mode: SOCKET_DIR_MODE });
  let st;
  try {
    st = lstatSync(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
  if (!st.isSocket()) throw new SocketPathError(path, 'exists and is not a socket (not removed: choose another path or remove it)');
  if (await accepts(path)) throw new SocketPathError(path, 'another process accepts connections on this socket (a second stack on the same path? stop it or choose another path)');
  unlinkSync(path);
  return true;
}

/** The file each socket path had when this process made it: inode and change time (an inode number alone can be reused at once). */
const owned = new Map<string, string>();
const identity = (path: string): string => {
  const st = lstatSync(path, { bigint: true });
  return `${st.dev}:${st.ino}:${st.ctimeNs}`;
};

/** After listening: 0660, and (with `remove`) remembered for removal at exit. */
export function ownSocket(path: string, remove = true): void {
  chmodSync(path, SOCKET_MODE);
  if (remove) owned.set(path, identity(path));
}

/** The configured sockets with the setting naming each (for messages). */
export function socketSettings(config: { readonly authzGrpcSocket: string | undefined; readonly marketSocket: string | undefined }): [string, string][] {
  const out: [string, string][] = [];
  if (config.authzGrpcSocket !== undefined) out.push(['AUTHZ_GRPC_SOCKET', config.authzGrpcSocket]);
  if (config.marketSocket !== undefined) out.push(['MARKET_SOCKET', config.marketSocket]);
  return out;
}

/** Runs `listen`, turning its failure into one line naming the setting and the path (like listen-error.ts for ports). */
export async function listenAtSocket<T>(setting: string, path: string, listen: () => Promise<T>): Promise<T> {
  try {
    return await listen();
  } catch (err) {
    const why = err instanceof SocketPathError ? err.message : `${path}: ${err instanceof Error ? err.message : String(err)}`;
    throw new SocketListenError(`${setting}: cannot listen on ${why}`);
  }
}

/** A socket the service could not listen on (start-up fails with this one line). */
export class SocketListenError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ListenError';
  }
}

/** Removes the socket file at `path` if it is still the one `ownSocket` recorded (never another process's). */
export function removeOwnSocket(path: string): void {
  const id = owned.get(path);
  if (id === undefined) return;
  owned.delete(path);
  try {
    if (identity(path) === id) unlinkSync(path);
  } catch { /* already gone */ }
}

let exitHook = false;
/** Removes every socket this process made when it exits, however it exits (process.exit included; not SIGKILL: prepareSocket handles that one at the next start). */
export function removeOwnSocketsAtExit(): void {
  if (exitHook) return;
  exitHook = true;
  process.on('exit', () => {
    for (const path of [...owned.keys()]) removeOwnSocket(path);
  });
}
