/**
 * A JSON object read without building it: one pass over the raw bytes that checks the whole text
 * is JSON as JSON.parse would accept it (after Buffer's UTF-8 decoding), refuses it as soon as
 * arrays and objects nest past a bound, and hands back only the named top-level members.
 *
 * Why not JSON.parse: its cost depends on what the text asks it to build, not only on its length.
 * A 64 KiB order body can hold ~7,000 distinct member names, each of which V8 gives a hidden-class
 * transition of its own, or 32,000 nested arrays: 1.2-3 ms and 2.2 ms of JSON.parse in-process,
 * against under 1 µs for an ordinary order (docs/benchmarks.md "Costly requests"). This scan
 * allocates nothing per member (0.2-0.4 ms for any 64 KiB body), and stops at the first level
 * past the bound. Only the members the caller names are decoded, and only when they are strings
 * or numbers, which are all an order envelope has.
 *
 * Agreement with JSON.parse is what a property test holds (authz/test/json-scan.test.ts): a text
 * is `ok` exactly when JSON.parse accepts it, its value is an object and it nests at most
 * `maxDepth` levels, and the members are the values JSON.parse gives (the last of duplicates).
 * Byte-level checking is enough because UTF-8 never uses a byte below 0x80 inside a multi-byte
 * character and Buffer's decoder never folds an ASCII byte into a replacement character: JSON's
 * structure is all ASCII, and any other byte is allowed inside strings only, as JSON.parse allows.
 */

/** What a named member holds: a string, a number, or `null` for any other JSON value (object, array, boolean, null). */
export type MemberValue = string | number | null;

export type JsonScan<K extends string> =
  | { readonly ok: true; readonly members: { readonly [P in K]?: MemberValue } }
  | { readonly ok: false; readonly reason: 'syntax' | 'not_object' | 'depth' };

const QUOTE = 0x22;
const COMMA = 0x2c;
const MINUS = 0x2d;
const PLUS = 0x2b;
const DOT = 0x2e;
const ZERO = 0x30;
const COLON = 0x3a;
const BACKSLASH = 0x5c;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const LOWER_E = 0x65;
const UPPER_E = 0x45;
const LOWER_U = 0x75;

/** Byte classes: JSON whitespace, digits, hex digits, and the characters a backslash may escape. */
const WHITESPACE = 1;
const DIGIT = 2;
const CLASS = new Uint8Array(256);
for (const c of ' \t\n\r') CLASS[c.charCodeAt(0)] = WHITESPACE;
for (const c of '0123456789') CLASS[c.charCodeAt(0)] = DIGIT;
const HEX = new Uint8Array(256);
for (const c of '0123456789abcdefABCDEF') HEX[c.charCodeAt(0)] = 1;
/** Bytes a string may hold as they are: anything but a control character, `"` and `\\`. */
const PLAIN = new Uint8Array(256).fill(1, 0x20);
PLAIN[QUOTE] = 0;
PLAIN[BACKSLASH] = 0;
const SIMPLE_ESCAPE = new Uint8Array(256);
for (const c of '"\\/bfnrt') SIMPLE_ESCAPE[c.charCodeAt(0)] = 1;
const TRUE = Buffer.from('true', 'latin1');
const FALSE = Buffer.from('false', 'latin1');
const NULL = Buffer.from('null', 'latin1');

/** What the scanner expects next. FIRST_*: just inside `[` or `{`, where the closing bracket may come at once. */
const VALUE = 0;
const FIRST_VALUE = 1;
const KEY = 2;
const FIRST_KEY = 3;
const COLON_NEXT = 4;
const AFTER_VALUE = 5;

/** On the container stack. */
const IN_OBJECT = 1;
const IN_ARRAY = 2;

const SYNTAX = { ok: false, reason: 'syntax' } as const;
const NOT_OBJECT = { ok: false, reason: 'not_object' } as const;
const DEPTH = { ok: false, reason: 'depth' } as const;

/** Set by scanString: whether the string it last scanned had a backslash escape. */
let escaped = false;

/** The index after the string whose opening quote is at `i`, or -1 when it is not a JSON string. */
function scanString(b: Uint8Array, i: number): number {
  const n = b.length;
  escaped = false;
  for (i++; ;) {
    // Most bytes of a string need no attention: one table look-up each.
    while (i < n && PLAIN[b[i]!] === 1) i++;
    if (i >= n) return -1;
    const c = b[i]!;
    if (c === QUOTE) return i + 1;
    if (c !== BACKSLASH) return -1; // a control character
    escaped = true;
    const e = b[i + 1];
    if (e === LOWER_U) {
      if (i + 5 >= n || HEX[b[i + 2]!] === 0 || HEX[b[i + 3]!] === 0 || HEX[b[i + 4]!] === 0 || HEX[b[i + 5]!] === 0) return -1;
      i += 6;
    } else if (e !== undefined && SIMPLE_ESCAPE[e] === 1) {
      i += 2;
    } else {
      return -1;
    }
  }
}

function skipDigits(b: Uint8Array, i: number): number {
  const n = b.length;
  while (i < n && CLASS[b[i]!] === DIGIT) i++;
  return i;
}

/** The index after the number at `i`, or -1 (JSON's grammar: no `+`, no leading zeros, no bare `.`). */
function scanNumber(b: Uint8Array, i: number): number {
  const n = b.length;
  if (b[i] === MINUS) i++;
  if (i >= n) return -1;
  if (b[i] === ZERO) i++;
  else if (CLASS[b[i]!] === DIGIT) i = skipDigits(b, i + 1);
  else return -1;
  if (i < n && b[i] === DOT) {
    const j = skipDigits(b, i + 1);
    if (j === i + 1) return -1;
    i = j;
  }
  if (i < n && (b[i] === LOWER_E || b[i] === UPPER_E)) {
    i++;
    if (i < n && (b[i] === PLUS || b[i] === MINUS)) i++;
    const j = skipDigits(b, i);
    if (j === i) return -1;
    i = j;
  }
  return i;
}

/** The index after `word` if the bytes at `i` are it, else -1. */
function scanWord(b: Uint8Array, i: number, word: Uint8Array): number {
  for (let k = 1; k < word.length; k++) if (b[i + k] !== word[k]) return -1;
  return i + word.length;
}

/** Which of `names` the key at [start, end) (quotes included) is, or -1. */
function keyIndex(b: Buffer, start: number, end: number, hadEscape: boolean, names: readonly Uint8Array[], texts: readonly string[]): number {
  if (hadEscape) return texts.indexOf(JSON.parse(b.toString('utf8', start, end)) as string);
  const len = end - start - 2;
  next: for (let k = 0; k < names.length; k++) {
    const name = names[k]!;
    if (name.length !== len) continue;
    for (let j = 0; j < len; j++) if (b[start + 1 + j] !== name[j]) continue next;
    return k;
  }
  return -1;
}

/** A scalar member's value at [start, end): strings and numbers decoded (as JSON.parse would), anything else null. */
function memberValue(b: Buffer, start: number, end: number, hadEscape: boolean): MemberValue {
  const c = b[start]!;
  if (c === QUOTE) return hadEscape ? (JSON.parse(b.toString('utf8', start, end)) as string) : b.toString('utf8', start + 1, end - 1);
  if (c === MINUS || CLASS[c] === DIGIT) return Number(b.toString('latin1', start, end));
  return null;
}

/**
 * A reader of JSON objects for the member names `names` (ASCII) with at most `maxDepth` levels of
 * nesting: see the file header.
 */
export function jsonObjectScanner<K extends string>(names: readonly K[], maxDepth: number): (text: Buffer) => JsonScan<K> {
  const s: Scratch = {
    encoded: names.map((name) => Buffer.from(name, 'latin1')),
    starts: new Int32Array(names.length), ends: new Int32Array(names.length), escapes: new Uint8Array(names.length),
    stack: new Uint8Array(maxDepth + 1),
  };
  return (b) => scan(b, maxDepth, names, s);
}

/**
 * A scanner's working memory, allocated once: a scan runs to its end synchronously, so one set
 * per scanner serves every call. Per wanted member: where its last value starts and ends (-1:
 * absent; end === start: not a scalar) and whether that string had escapes, decoded only once the
 * whole text is valid; stack[d] is the container at depth d (1 = the outermost).
 */
interface Scratch {
  readonly encoded: readonly Uint8Array[];
  readonly starts: Int32Array;
  readonly ends: Int32Array;
  readonly escapes: Uint8Array;
  readonly stack: Uint8Array;
}

function scan<K extends string>(b: Buffer, maxDepth: number, names: readonly K[], scratch: Scratch): JsonScan<K> {
  const n = b.length;
  const { encoded, starts, ends, escapes, stack } = scratch;
  starts.fill(-1);
  let depth = 0;
  let state = VALUE;
  /** The wanted member whose value comes next (a top-level key was just read), else -1. */
  let member = -1;
  let i = 0;
  while (i < n) {
    const c = b[i]!;
    if (CLASS[c] === WHITESPACE) {
      i++;
      continue;
    }
    switch (state) {
      case FIRST_VALUE:
        if (c === CLOSE_ARRAY) {
          depth--;
          i++;
          state = AFTER_VALUE;
          break;
        }
      // falls through
      case VALUE: {
        const start = i;
        if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
          if (depth === maxDepth) return DEPTH;
          stack[++depth] = c === OPEN_OBJECT ? IN_OBJECT : IN_ARRAY;
          state = c === OPEN_OBJECT ? FIRST_KEY : FIRST_VALUE;
          i++;
        } else {
          if (c === QUOTE) i = scanString(b, i);
          else if (c === MINUS || CLASS[c] === DIGIT) i = scanNumber(b, i);
          else if (c === TRUE[0]) i = scanWord(b, i, TRUE);
          else if (c === FALSE[0]) i = scanWord(b, i, FALSE);
          else if (c === NULL[0]) i = scanWord(b, i, NULL);
          else return SYNTAX;
          if (i === -1) return SYNTAX;
          state = AFTER_VALUE;
        }
        if (member !== -1) {
          // A wanted top-level member: a scalar is kept by position, a container as "not a scalar".
          starts[member] = start;
          ends[member] = state === AFTER_VALUE ? i : start;
          escapes[member] = c === QUOTE && escaped ? 1 : 0;
          member = -1;
        }
        break;
      }
      case FIRST_KEY:
        if (c === CLOSE_OBJECT) {
          depth--;
          i++;
          state = AFTER_VALUE;
          break;
        }
      // falls through
      case KEY: {
        if (c !== QUOTE) return SYNTAX;
        const end = scanString(b, i);
        if (end === -1) return SYNTAX;
        if (depth === 1) member = keyIndex(b, i, end, escaped, encoded, names);
        i = end;
        state = COLON_NEXT;
        break;
      }
      case COLON_NEXT:
        if (c !== COLON) return SYNTAX;
        i++;
        state = VALUE;
        break;
      default: {
        // AFTER_VALUE: a comma, or the closing bracket of the container the value was in.
        if (depth === 0) return SYNTAX;
        const inObject = stack[depth] === IN_OBJECT;
        if (c === COMMA) state = inObject ? KEY : VALUE;
        else if (c === (inObject ? CLOSE_OBJECT : CLOSE_ARRAY)) depth--;
        else return SYNTAX;
        i++;
      }
    }
  }
  if (state !== AFTER_VALUE || depth !== 0) return SYNTAX;
  if (firstNonWhitespace(b) !== OPEN_OBJECT) return NOT_OBJECT;
  const members: { [P in K]?: MemberValue } = {};
  for (let k = 0; k < names.length; k++) {
    const s = starts[k]!;
    if (s !== -1) members[names[k]!] = ends[k] === s ? null : memberValue(b, s, ends[k]!, escapes[k] === 1);
  }
  return { ok: true, members };
}

function firstNonWhitespace(b: Uint8Array): number | undefined {
  let i = 0;
  while (CLASS[b[i]!] === WHITESPACE) i++;
  return b[i];
}
