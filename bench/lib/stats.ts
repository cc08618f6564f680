/** Small statistics helpers for benchmark reports. */

/** The p-th percentile (0–100) of ascending `sorted`, nearest-rank; NaN when empty. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  const n = sorted.length;
  if (n === 0) return NaN;
  const rank = Math.ceil((p / 100) * n);
  return sorted[Math.min(n - 1, Math.max(0, rank - 1))] as number;
}

/** Ascending copy of `values` as a Float64Array (numeric sort, no string comparison). */
export function sortedCopy(values: ArrayLike<number>): Float64Array {
  return Float64Array.from(values).sort();
}

/** Median of `values` (mean of the middle two for an even count); NaN when empty. */
export function median(values: readonly number[]): number {
  if (values.length === 0) return NaN;
  const s = sortedCopy(values);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

/** Formats a number with thousands separators and `digits` decimals ("7,012", "0.43"). */
export function fmt(n: number, digits = 0): string {
  if (!Number.isFinite(n)) return '–';
  return n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

/** Renders a Markdown table; numbers should already be formatted. */
export function markdownTable(header: readonly string[], rows: readonly (readonly string[])[], align?: readonly ('l' | 'r')[]): string {
  const sep = header.map((_, i) => ((align?.[i] ?? 'l') === 'r' ? '---:' : '---'));
  return [header, sep, ...rows].map((r) => `| ${r.join(' | ')} |`).join('\n');
}

/**
 * Median over rounds of f(x, y), x and y the samples of `a` and `b` from the same round: a
 * ratio or a difference taken within a round, so drift of the machine between rounds cancels.
 */
export function pairedMedian<T extends { readonly round: number }>(a: readonly T[], b: readonly T[], f: (x: T, y: T) => number): number {
  return median(a.flatMap((x) => {
    const y = b.find((z) => z.round === x.round);
    return y === undefined ? [] : [f(x, y)];
  }));
}

/** '**yes**' / '**no**': whether a target is met, as the reports' tables show it. */
export const met = (ok: boolean): string => (ok ? '**yes**' : '**no**');
