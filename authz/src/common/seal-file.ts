/**
 * The seal marker (AUTHZ_SEAL_FILE; docs/api.md "Seal", docs/operations.md "Seal and unseal").
 *
 * POST /admin/seal writes it before the seal takes effect; a process that finds it at start starts
 * sealed: it loads no key, answers every request 503 `sealed`, reports NOT_SERVING, and says how
 * to unseal. Its presence is the seal: a marker that cannot be read or parsed still seals (fail
 * closed); its content (when, why, which process) is for the operator. A seal by SIGTERM/SIGINT (a
 * normal stop) writes nothing. Only an operator removes it.
 */
import { accessSync, closeSync, constants, fsyncSync, lstatSync, openSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { ConfigError, type Config } from './config.ts';

/** What the marker records. */
export interface SealRecord {
  /** ISO 8601 time of the seal. */
  readonly sealedAt: string;
  /** What sealed it (`admin`: POST /admin/seal). */
  readonly reason: string;
  readonly pid: number;
}

/** The marker found at start: undefined when there is none. */
export type SealMarker = { readonly record: SealRecord | undefined } | undefined;

/**
 * Whether `file` marks the service sealed, and its record when it parses. A path that exists in
 * any form, or that cannot be examined (EACCES), counts as sealed.
 */
export function readSealFile(file: string): SealMarker {
  try {
    lstatSync(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    return { record: undefined };
  }
  try {
    const r = JSON.parse(readFileSync(file, 'utf8')) as Partial<SealRecord>;
    const ok = typeof r.sealedAt === 'string' && typeof r.reason === 'string' && typeof r.pid === 'number';
    return { record: ok ? { sealedAt: r.sealedAt!, reason: r.reason!, pid: r.pid! } : undefined };
  } catch {
    return { record: undefined };
  }
}

/** Whether this process starts sealed: AUTHZ_SEAL_FILE is set and present. */
export function startsSealed(config: Config): boolean {
  return config.sealFile !== undefined && readSealFile(config.sealFile) !== undefined;
}

/**
 * Checked at start (AUTHZ_SEAL_FILE): its directory exists and this process may create the marker
 * there, so a seal never first finds out that it cannot be kept.
 */
export function checkSealFileWritable(file: string): void {
  try {
    accessSync(dirname(file), constants.W_OK | constants.X_OK);
  } catch (err) {
    throw new ConfigError('AUTHZ_SEAL_FILE', 'a path in an existing directory this process can write', `${file}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
  }
}

/**
 * Writes the marker durably: a temporary file (0600) written and flushed, renamed over the path,
 * the directory flushed. An existing marker is kept as it is (the first seal's record stays).
 */
export function writeSealFile(file: string, record: SealRecord): void {
  if (readSealFile(file) !== undefined) return;
  const tmp = `${file}.${process.pid}.tmp`;
  const fd = openSync(tmp, 'w', 0o600);
  try {
    writeSync(fd, `${JSON.stringify(record)}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  try {
    renameSync(tmp, file);
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  }
  try {
    const dir = openSync(dirname(file), 'r');
    try {
      fsyncSync(dir);
    } finally {
      closeSync(dir);
    }
  } catch { /* a directory that cannot be opened for fsync (some filesystems): the rename stands */ }
}

/** The one sentence every sealed start logs: how an operator lifts the seal. */
export function unsealHint(file: string): string {
  return `to unseal: remove ${file} and restart the service — npm start: stop it, rm the file, npm start; `
    + 'Kubernetes: delete the pod (its seal volume goes with it); docs/operations.md "Seal and unseal"';
}
