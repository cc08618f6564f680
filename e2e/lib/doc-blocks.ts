/**
 * The fenced blocks of README.md and docs/*.md, for the tests that run the documented commands as
 * written: a test takes a block's text from the Markdown at run time, never a copy of it.
 *
 * The convention (e2e/docs.test.ts checks it over every file):
 *   - every fence names its language: ```sh for commands a reader runs; ```text (diagrams, sample
 *     output), ```json, ```http, ```yaml for the rest;
 *   - the line before every ```sh fence is an HTML comment, invisible once rendered:
 *       <!-- doc-test: <id> -->             a test runs this block: it takes the text with
 *                                           docBlock(<file>, '<id>'); the id is unique across the
 *                                           docs and appears, quoted, in the test file that runs it
 *       <!-- doc-test: not run: <why> -->   no test runs it, and why (e.g. it needs a cluster)
 *   - a test may leave out whole lines that install the machine (apt-get, npm ci) or would stop
 *     what others share: it names each such line in full (withoutLines), so an edited line fails
 *     the test, and it checks what the line provides instead. Nothing else is left out.
 *   - what a test changes in a block's text is only where it must differ on a shared machine (a
 *     free port for 8080, the run's directory for .run/), by plain string replacement.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../deploy/paths.ts';

/** README.md and every docs/*.md, relative to the repository root. */
export function docFiles(): string[] {
  return ['README.md', ...readdirSync(join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`)];
}

export interface Fence {
  readonly file: string;
  /** 1-based line of the opening fence. */
  readonly line: number;
  /** The fence's language ('' when none is named). */
  readonly lang: string;
  /** The `doc-test:` comment on the line before the fence, without `<!--`/`-->` ('' when none). */
  readonly marker: string;
  /** The block's lines, the fence's indentation removed. */
  readonly text: string;
}

/** Every fenced block of `file` (a list item's fence is indented; its closing fence likewise). */
export function fences(file: string): Fence[] {
  const lines = readFileSync(join(ROOT, file), 'utf8').split('\n');
  const out: Fence[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^( *)```(\S*)\s*$/.exec(lines[i]!);
    if (open === null) continue;
    const indent = open[1]!;
    let end = i + 1;
    while (end < lines.length && lines[end] !== `${indent}\`\`\``) end++;
    if (end === lines.length) throw new Error(`${file}:${i + 1}: a fence that is never closed`);
    let before = i - 1;
    while (before >= 0 && lines[before]!.trim() === '') before--;
    const marker = /^\s*<!--\s*(doc-test:.*?)\s*-->\s*$/.exec(before >= 0 ? lines[before]! : '')?.[1] ?? '';
    out.push({ file, line: i + 1, lang: open[2]!, marker, text: lines.slice(i + 1, end).map((l) => l.slice(indent.length)).join('\n') });
    i = end;
  }
  return out;
}

/** The ```sh block of `file` marked `<!-- doc-test: <id> -->`, as written. */
export function docBlock(file: string, id: string): string {
  const found = fences(file).filter((f) => f.marker === `doc-test: ${id}`);
  if (found.length !== 1 || found[0]!.lang !== 'sh') throw new Error(`${file}: expected one sh block marked <!-- doc-test: ${id} -->, found ${found.length}`);
  return `${found[0]!.text}\n`;
}

/**
 * `block` without the lines named (each exactly as written, trailing spaces aside, and each must
 * be there once): the test says why in the value and checks what the line provides instead.
 */
export function withoutLines(block: string, lines: Readonly<Record<string, string>>): string {
  const have = block.split('\n');
  for (const l of Object.keys(lines)) {
    const n = have.filter((h) => h.trimEnd() === l).length;
    if (n !== 1) throw new Error(`the block has ${n} lines "${l}" (expected 1): the doc changed; update the test's list of lines it leaves out`);
  }
  return have.filter((h) => !(h.trimEnd() in lines)).join('\n');
}

/** `block` split before the line that starts with `first` (which must be there once). */
export function splitBefore(block: string, first: string): [string, string] {
  const have = block.split('\n');
  const at = have.flatMap((h, i) => (h.startsWith(first) ? [i] : []));
  if (at.length !== 1) throw new Error(`the block has ${at.length} lines starting "${first}" (expected 1)`);
  return [`${have.slice(0, at[0]).join('\n')}\n`, `${have.slice(at[0]).join('\n')}`];
}

/** `block` with every `from` replaced by `to`; each `from` must occur (else the doc changed). */
export function replacing(block: string, pairs: readonly (readonly [string, string])[]): string {
  let out = block;
  for (const [from, to] of pairs) {
    if (!out.includes(from)) throw new Error(`the block no longer contains "${from}": the doc changed; update the test`);
    out = out.replaceAll(from, to);
  }
  return out;
}
