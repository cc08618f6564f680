/**
 * The error tables of README.md ("Errors") and docs/api.md ("Errors") against the one error table,
 * authz/src/common/errors.ts: every code listed once with its HTTP status, none missing, none that
 * the service does not answer; and the statuses `bad_request` keeps (BAD_REQUEST_MESSAGE_BY_STATUS)
 * named in its row.
 *
 *   scripts/node --test authz/test/error-tables.test.ts
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { BAD_REQUEST_MESSAGE_BY_STATUS, ERROR_STATUS } from '../src/common/errors.ts';
import { REPO_ROOT } from '../../envoy/envoy-bin.ts';

interface Row { readonly line: number; readonly status: number; readonly code: string; readonly when: string }

/** The rows of the table whose header is `| status | \`error\` | …` (the first one in `markdown`). */
function errorTableRows(markdown: string): Row[] {
  const lines = markdown.split('\n');
  const head = lines.findIndex((l) => /^\|\s*status\s*\|\s*`error`\s*\|/.test(l));
  if (head < 0) return [];
  const rows: Row[] = [];
  for (let i = head + 2; i < lines.length && lines[i]!.startsWith('|'); i++) {
    const m = /^\|\s*(\d{3})\s*\|\s*`([^`]+)`\s*\|(.*)\|\s*$/.exec(lines[i]!);
    if (m === null) throw new Error(`line ${i + 1}: not a "| status | \`code\` | when |" row: ${lines[i]}`);
    rows.push({ line: i + 1, status: Number(m[1]), code: m[2]!, when: m[3]! });
  }
  return rows;
}

/** Where a table disagrees with errors.ts, one sentence each (empty: it agrees). */
function tableProblems(rows: readonly Row[], table: Readonly<Record<string, number>> = ERROR_STATUS): string[] {
  const problems: string[] = [];
  const seen = new Map<string, number>();
  for (const r of rows) {
    const first = seen.get(r.code);
    if (first !== undefined) problems.push(`line ${r.line}: \`${r.code}\` listed again (first on line ${first})`);
    seen.set(r.code, first ?? r.line);
    const status = table[r.code];
    if (status === undefined) problems.push(`line ${r.line}: \`${r.code}\` is not a code of authz/src/common/errors.ts`);
    else if (status !== r.status) problems.push(`line ${r.line}: \`${r.code}\` listed as ${r.status}, errors.ts answers ${status}`);
  }
  for (const [code, status] of Object.entries(table)) if (!seen.has(code)) problems.push(`\`${code}\` (${status}) missing`);
  const badRequest = rows.find((r) => r.code === 'bad_request');
  for (const kept of Object.keys(BAD_REQUEST_MESSAGE_BY_STATUS)) {
    if (badRequest !== undefined && !badRequest.when.includes(kept)) problems.push(`line ${badRequest.line}: \`bad_request\` does not say it keeps status ${kept}`);
  }
  return problems;
}

for (const file of ['README.md', 'docs/api.md']) {
  test(`error tables – ${file} lists every code of errors.ts once, with its status, and nothing else`, () => {
    const rows = errorTableRows(readFileSync(join(REPO_ROOT, file), 'utf8'));
    assert.ok(rows.length > 0, `${file}: no "| status | \`error\` | …" table`);
    const problems = tableProblems(rows);
    assert.ok(problems.length === 0, `${file} disagrees with authz/src/common/errors.ts:\n  ${problems.join('\n  ')}`);
  });
}

test('error tables – the check fails on a wrong status, an unknown, a repeated or a missing code, and a bad_request row that drops a kept status', () => {
  const md = [
    '| status | `error` | when |',
    '|---|---|---|',
    '| 400 | `bad_request` | malformed HTTP; also 403, 408 and 431 |',
    '| 404 | `invalid_json` | wrong status |',
    '| 418 | `teapot` | unknown code |',
    '| 400 | `bad_request` | again |',
    '',
    '| 400 | `not_found` | after the table: not read |',
  ].join('\n');
  const rows = errorTableRows(md);
  assert.deepEqual(rows.map((r) => r.code), ['bad_request', 'invalid_json', 'teapot', 'bad_request']);
  assert.deepEqual(tableProblems(rows, { bad_request: 400, invalid_json: 400, sealed: 503 }), [
    'line 4: `invalid_json` listed as 404, errors.ts answers 400',
    'line 5: `teapot` is not a code of authz/src/common/errors.ts',
    'line 6: `bad_request` listed again (first on line 3)',
    '`sealed` (503) missing',
    'line 3: `bad_request` does not say it keeps status 426',
  ]);
  assert.throws(() => errorTableRows('| status | `error` | when |\n|---|---|---|\n| 4xx | bad | row |\n'), /line 3: not a/);
  assert.deepEqual(errorTableRows('no table here'), []);
});
