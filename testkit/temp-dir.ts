/**
 * The tests' temporary directories: every one is removed, by the test that made it (after, or
 * finally) and at the latest when its process exits, whatever failed on the way; several hold
 * key material (HMAC and feed key files, development PKIs, Redis data). They are made under
 * os.tmpdir(), i.e. TMPDIR: `npm test` (scripts/test-tmpdir.sh) points it at a directory of its own run and
 * fails if anything is left there. With E2E_KEEP set, the removal at exit is skipped (the stacks
 * keep their directories then, for a look after a failed run).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const live = new Set<string>();
function removeAll(): void {
  if (process.env['E2E_KEEP'] !== undefined) return;
  for (const d of live) rmSync(d, { recursive: true, force: true });
}

/**
 * A new directory `<TMPDIR>/<prefix>XXXXXX` (mode 0700), removed at exit if nothing removed it
 * before: after the exit listeners registered before this call (e.g. one that kills the
 * redis-server writing into it).
 */
export function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  live.add(dir);
  process.removeListener('exit', removeAll);
  process.once('exit', removeAll);
  return dir;
}

/** Removes a directory of tempDir now. */
export function removeTempDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
  live.delete(dir);
}

/** Runs `fn` with a fresh temporary directory and removes it afterwards, failed or not. */
export async function withTempDir<T>(prefix: string, fn: (dir: string) => T | Promise<T>): Promise<T> {
  const dir = tempDir(prefix);
  try {
    return await fn(dir);
  } finally {
    removeTempDir(dir);
  }
}
