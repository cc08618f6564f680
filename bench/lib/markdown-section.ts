/**
 * Rewrites one `## ` section of a shared Markdown file, leaving every other section as it
 * is, so several benchmarks (each owning a section) can report into one docs page.
 * The file is read right before it is written to keep the window for a concurrent writer
 * as small as possible.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';

/**
 * Replaces the section whose heading line is exactly `heading` (through the line before the
 * next `## ` heading) with `body`, or appends it. Creates the file with `intro` if missing.
 */
export function writeSection(file: string, heading: string, body: string, intro: string): void {
  if (!heading.startsWith('## ')) throw new Error(`not a level-2 heading: ${heading}`);
  const section = `${heading}\n\n${body.trim()}\n`;
  mkdirSync(dirname(file), { recursive: true });
  const text = existsSync(file) ? readFileSync(file, 'utf8') : `${intro.trim()}\n`;
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.trimEnd() === heading);
  let out: string;
  if (start === -1) {
    out = `${text.trimEnd()}\n\n${section}`;
  } else {
    let end = lines.findIndex((l, i) => i > start && /^## /.test(l));
    if (end === -1) end = lines.length;
    const before = lines.slice(0, start).join('\n').trimEnd();
    const after = lines.slice(end).join('\n').trim();
    out = `${before}\n\n${section}${after === '' ? '' : `\n${after}\n`}`;
  }
  writeFileSync(file, out);
}
