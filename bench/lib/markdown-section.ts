/**
 * Rewrites one `## ` section of a shared Markdown file, leaving every other section as it
 * is, so several benchmarks (each owning a section) can report into one docs page.
 * A section's `### Findings…` subsections are written by hand, not by the script: what one-off
 * investigations found, each with the date it was measured. They are kept as they are, after
 * the new body (which must not have such a subsection itself).
 * The file is read right before it is written to keep the window for a concurrent writer
 * as small as possible.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The `### Findings…` subsections among `lines` (each through the line before the next `### `). */
function findings(lines: readonly string[]): string[] {
  const kept: string[] = [];
  let inFindings = false;
  for (const line of lines) {
    if (line.startsWith('### ')) inFindings = line.startsWith('### Findings');
    if (inFindings) kept.push(line);
  }
  return kept;
}

/**
 * Replaces the section whose heading line is exactly `heading` (through the line before the
 * next `## ` heading) with `body` and the section's findings, or appends it. Creates the file
 * with `intro` if missing.
 */
export function writeSection(file: string, heading: string, body: string, intro: string): void {
  if (!heading.startsWith('## ')) throw new Error(`not a level-2 heading: ${heading}`);
  mkdirSync(dirname(file), { recursive: true });
  const text = existsSync(file) ? readFileSync(file, 'utf8') : `${intro.trim()}\n`;
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.trimEnd() === heading);
  let out: string;
  if (start === -1) {
    out = `${text.trimEnd()}\n\n${heading}\n\n${body.trim()}\n`;
  } else {
    let end = lines.findIndex((l, i) => i > start && /^## /.test(l));
    if (end === -1) end = lines.length;
    const kept = findings(lines.slice(start + 1, end)).join('\n').trim();
    const section = `${heading}\n\n${body.trim()}\n${kept === '' ? '' : `\n${kept}\n`}`;
    const before = lines.slice(0, start).join('\n').trimEnd();
    const after = lines.slice(end).join('\n').trim();
    out = `${before}\n\n${section}${after === '' ? '' : `\n${after}\n`}`;
  }
  writeFileSync(file, out);
}

/** docs/benchmarks.md, where every benchmark script reports. */
export const BENCHMARKS_DOC = fileURLToPath(new URL('../../docs/benchmarks.md', import.meta.url));

/** The top of docs/benchmarks.md when a script is the first to write it. */
function benchmarksIntro(): string {
  return `# Benchmarks

Measured on the development machine: a shared cloud VM (${availableParallelism()} vCPUs), so absolute numbers
move with the neighbours. Each section is written by its benchmark script; the method is
stated with the numbers. Servers run as separate processes and their CPU time is read from
\`/proc/<pid>/stat\`, which stays meaningful when throughput does not. A section's \`### Findings\`
subsections are written by hand (one-off investigations, each with the date it was measured)
and kept as they are when the script rewrites the section.
`;
}

/** Rewrites `heading`'s section of docs/benchmarks.md, unless BENCH_NO_DOCS=1; says whether it did. */
export function writeBenchmarksSection(heading: string, body: string): boolean {
  if (process.env['BENCH_NO_DOCS'] === '1') return false;
  writeSection(BENCHMARKS_DOC, heading, body, benchmarksIntro());
  return true;
}
