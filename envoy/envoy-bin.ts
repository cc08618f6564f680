/**
 * Where the Envoy binary lives, and a thin wrapper around `envoy --mode validate`.
 *
 * `ENVOY_BIN` overrides the binary; otherwise the pinned Envoy 1.40.0 that
 * `scripts/setup.sh` installs into the project's `.venv`.
 */
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Repository root (this file lives in `<root>/envoy/`). */
export const REPO_ROOT = dirname(dirname(fileURLToPath(import.meta.url)));

/** The Envoy binary to run: `ENVOY_BIN` if set (and non-empty), else `<repo>/.venv/bin/envoy`. */
export function envoyBinary(env: Readonly<Record<string, string | undefined>> = process.env): string {
  const fromEnv = env['ENVOY_BIN']?.trim();
  return fromEnv !== undefined && fromEnv !== '' ? fromEnv : join(REPO_ROOT, '.venv', 'bin', 'envoy');
}

export interface ValidateResult {
  /** True when Envoy printed OK and exited 0. */
  readonly ok: boolean;
  readonly exitCode: number | null;
  /** stdout + stderr, for error messages. */
  readonly output: string;
}

/**
 * Runs `envoy --mode validate -c <bootstrapPath>`: parses the bootstrap (unknown fields and
 * proto constraint violations are errors), builds clusters, listeners and filter factories,
 * and reads every referenced file (CA, certificate, key). It opens no sockets and sends no
 * traffic. It cannot tell whether the SDS file's certificate paths exist: a broken SDS file
 * is only a warning there (docs/envoy.md §6), so callers check those files themselves.
 */
export function validateBootstrap(bootstrapPath: string, bin: string = envoyBinary()): ValidateResult {
  const r = spawnSync(bin, ['--mode', 'validate', '-c', bootstrapPath, '--log-level', 'warn'], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  const output = `${r.stdout ?? ''}${r.stderr ?? ''}${r.error === undefined ? '' : String(r.error)}`;
  return { ok: r.status === 0, exitCode: r.status, output };
}
