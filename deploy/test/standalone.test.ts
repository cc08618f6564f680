/**
 * The repository stands alone: a plain clone builds, tests and documents itself. No tracked file
 * links, reads or runs anything beside the clone (the interface's reference copy that the
 * project was started from lives outside it; docs/api.md is the project's own description).
 * .ci/run on a fresh clone with nothing beside it is the end-to-end proof; this test catches a
 * new reference at once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../paths.ts';

test('standalone – no tracked file refers to a path outside the repository (a relative path climbing above the root)', () => {
  const files = execFileSync('git', ['ls-files'], { cwd: ROOT, encoding: 'utf8' }).split('\n').filter((f) => f !== '' && !f.endsWith('.mmdb'));
  assert.ok(files.length > 100, 'git ls-files lists the repository');
  const outside: string[] = [];
  for (const f of files) {
    // This file names what it looks for; a file deleted in the working tree has nothing to say.
    if (f === 'deploy/test/standalone.test.ts' || !existsSync(join(ROOT, f))) continue;
    const text = readFileSync(join(ROOT, f), 'utf8');
    // A relative path climbing more levels than the file sits below the root leaves the clone
    // (`../shared/…` from the root, `../../../x` from authz/test/): a reference outside it.
    const depth = f.split('/').length - 1;
    // In Markdown, a fenced block whose first line is `# <path of a file in the repository>` is that
    // file's text (a kustomization snippet): its relative paths are relative to that file.
    let blockDepth: number | undefined;
    let fenceOpen = false;
    text.split('\n').forEach((line, i) => {
      if (f.endsWith('.md') && line.startsWith('```')) {
        fenceOpen = !fenceOpen;
        blockDepth = undefined;
        return;
      }
      if (fenceOpen && blockDepth === undefined) {
        const named = /^# ((?:deploy|envoy|authz|scripts|docs)\/\S+)$/.exec(line.trim());
        blockDepth = named !== null && files.includes(named[1]!) ? named[1]!.split('/').length - 1 : -1;
      }
      const d = fenceOpen && blockDepth !== undefined && blockDepth >= 0 ? blockDepth : depth;
      for (const m of line.matchAll(/(?:^|[^.\w/])((?:\.\.\/)+)[\w.-]/g)) {
        if (m[1]!.length / 3 > d) outside.push(`${f}:${i + 1}: ${line.trim().slice(0, 120)}`);
      }
    });
  }
  assert.deepEqual(outside, [], `references outside the repository:\n${outside.join('\n')}`);
});

test('standalone – the interface page and the test vectors are in the repository', () => {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  assert.match(readme, /\]\(docs\/api\.md\)/, 'the README links the API page');
  const vectors = JSON.parse(readFileSync(join(ROOT, 'authz/test/fixtures/ingest-vectors.json'), 'utf8')) as { cases: unknown[] };
  assert.ok(vectors.cases.length >= 10, 'the ingest known-answer vectors');
});
