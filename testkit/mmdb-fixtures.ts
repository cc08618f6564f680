/**
 * What the MaxMind-format test databases share: a generator script under testkit/fixtures/ run
 * with the project's .venv Python (PyPI mmdb_writer) into a fresh temporary directory, removed
 * when the process exits (temp-dir.ts). geo-fixtures.ts and anonymizer-fixtures.ts name the files.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { tempDir } from './temp-dir.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const PYTHON = join(ROOT, '.venv', 'bin', 'python');

/** Runs testkit/fixtures/`script` into a new temporary directory (`prefix…`); the directory and what the script printed. */
export function generateMmdbFixtures(script: string, prefix: string): { readonly dir: string; readonly out: string } {
  const dir = tempDir(prefix);
  const out = execFileSync(PYTHON, [fileURLToPath(new URL(`./fixtures/${script}`, import.meta.url)), dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  return { dir, out };
}
