/**
 * The service as the image runs it: its TypeScript compiled to JavaScript by tsconfig.build.json
 * (the Dockerfile's build stage does the same in place). Written under .run/ so that node_modules
 * and the packaged GeoIP database resolve from the compiled files as they do from the sources.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Compiles the service into a fresh directory (removed at exit); returns its main.js. */
export function compileService(): string {
  mkdirSync(join(ROOT, '.run'), { recursive: true });
  const out = mkdtempSync(join(ROOT, '.run', 'bench-js-'));
  process.once('exit', () => rmSync(out, { recursive: true, force: true }));
  execFileSync(join(ROOT, 'node_modules', '.bin', 'tsc'), ['-p', join(ROOT, 'tsconfig.build.json'), '--outDir', out], { stdio: 'inherit' });
  return join(out, 'authz', 'src', 'main.js');
}
