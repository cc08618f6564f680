/**
 * A JSON object read without building it: one pass over the raw bytes that checks the whole text
 * is JSON as JSON.parse would accept it (after Buffer's UTF-8 decoding), refuses it as soon as
 * arrays and objects nest past a bound, and hands back only the named top-level members.
 *
 * Why not JSON.parse: its cost depends on what the text asks it to build, not only on its length.
 * A 64 KiB order body can hold ~7,000 distinct member names, each of which V8 gives a hidden-class
 * transition of its own, or 32,000 nested arrays: 1.2-3 ms and 2.2 ms of JSON.parse in-process,
 * against under 1 µs for an ordinary order (docs/benchmarks.md "Costly requests"). This scan
 * allocates nothing per member and stops at the first level past the bound. It is a table-driven
 * pushdown automaton: one look-up per byte in a transition table built at start-up, code only
 * where a container opens or closes and for the top-level object's keys and values (see "The
 * automaton" below). Only the members the caller names are decoded, and only when they are
 * strings or numbers, which are all an order envelope has.
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

/** Where a named member's string value lies in the text: its content between the quotes, [start, end), and whether it has escapes. */
export interface StringSpan {
  readonly start: number;
  readonly end: number;
  readonly escaped: boolean;
}

export type JsonScan<K extends string> =
  | { readonly ok: true; readonly members: { readonly [P in K]?: MemberValue }; readonly spans: { readonly [P in K]?: StringSpan } }
  | { readonly ok: false; readonly reason: 'syntax' | 'not_object' | 'depth' };

const QUOTE = 0x22;
const MINUS = 0x2d;
const PLUS = 0x2b;
const DOT = 0x2e;
const ZERO = 0x30;
const BACKSLASH = 0x5c;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const CLOSE_OBJECT = 0x7d;
const OPEN_OBJECT = 0x7b;
const LOWER_E = 0x65;
const UPPER_E = 0x45;
const LOWER_U = 0x75;

/** Byte classes: JSON whitespace, digits, hex digits, and the characters a backslash may escape. */
const WHITESPACE_BYTES = ' \t\n\r';
const DIGIT = new Uint8Array(256);
for (const c of '0123456789') DIGIT[c.charCodeAt(0)] = 1;
const HEX = new Uint8Array(256);
for (const c of '0123456789abcdefABCDEF') HEX[c.charCodeAt(0)] = 1;
/** Bytes a string may hold as they are: anything but a control character, `"` and `\\`. */
const PLAIN = new Uint8Array(256).fill(1, 0x20);
PLAIN[QUOTE] = 0;
PLAIN[BACKSLASH] = 0;
const SIMPLE_ESCAPES = '"\\/bfnrt';
const SIMPLE_ESCAPE = new Uint8Array(256);
for (const c of SIMPLE_ESCAPES) SIMPLE_ESCAPE[c.charCodeAt(0)] = 1;
const TRUE = Buffer.from('true', 'latin1');
const FALSE = Buffer.from('false', 'latin1');
const NULL = Buffer.from('null', 'latin1');

const SYNTAX = { ok: false, reason: 'syntax' } as const;
const NOT_OBJECT = { ok: false, reason: 'not_object' } as const;
const DEPTH = { ok: false, reason: 'depth' } as const;

// ---------------------------------------------------------------------------------------------
// The automaton. One table look-up per byte: `state = NEXT[state << 8 | byte]`. A state below
// FIRST_ACTION is an ordinary state; FIRST_ACTION and above are the few steps that need code:
// opening and closing a container (the depth bound, the stack), the top-level object's keys and
// values (the wanted members), and a value at the top (not an object: still checked). Strings,
// numbers, literals, commas, colons and whitespace inside containers never leave the table, so a
// body costs the same per byte whatever shape it has.
//
// Where a value ends depends on the container it is in, so the states that read values come in
// two copies: one for arrays (A) and one for objects below the top level (O). The top-level
// object (P) and the top (T) read their values in code (`VALUE`), which keeps the members.
// ---------------------------------------------------------------------------------------------

let states = 0;
const state = (): number => states++;

/** Ordinary states per container kind. */
interface Kind {
  /** A value is expected (after `,` in an array, after `:` in an object). */
  readonly value: number;
  /** After a value: `,`, the closing bracket or whitespace. */
  readonly after: number;
  readonly string: number;
  readonly escape: number;
  readonly unicode: readonly [number, number, number, number];
  /** Numbers: after `-`; after a leading `0`; in the integer digits; after `.`; in the fraction; after `e`; after its sign; in the exponent. */
  readonly minus: number;
  readonly zero: number;
  readonly int: number;
  readonly dot: number;
  readonly frac: number;
  readonly exp: number;
  readonly expSign: number;
  readonly expDigits: number;
  /** The literals, by the letters still expected. */
  readonly literals: readonly { readonly word: Uint8Array; readonly states: readonly number[] }[];
}

function kind(): Kind {
  return {
    value: state(), after: state(), string: state(), escape: state(), unicode: [state(), state(), state(), state()],
    minus: state(), zero: state(), int: state(), dot: state(), frac: state(), exp: state(), expSign: state(), expDigits: state(),
    literals: [TRUE, FALSE, NULL].map((word) => ({ word, states: Array.from({ length: word.length - 1 }, state) })),
  };
}

const A = kind();
const O = kind();
/** After `[`: a value or `]`. */
const A_FIRST = state();
/** In an object below the top level: after `{` (a key or `}`), after `,` (a key), in a key, after a key. */
const O_FIRST_KEY = state();
const O_KEY = state();
const O_KEY_STRING = state();
const O_KEY_ESCAPE = state();
const O_KEY_UNICODE = [state(), state(), state(), state()] as const;
const O_COLON = state();
/** In the top-level object: the same, its keys and values read in code. */
const P_FIRST_KEY = state();
const P_KEY = state();
const P_COLON = state();
const P_VALUE = state();
const P_AFTER = state();
/** At the top: before the value, after it. */
const T_VALUE = state();
const T_AFTER = state();

/** Steps that need code (see `scan`). */
const FIRST_ACTION = 200;
const ERROR = 255;
const OPEN_ARRAY_ACTION = 200;
const OPEN_OBJECT_ACTION = 201;
const CLOSE_ARRAY_ACTION = 202;
const CLOSE_OBJECT_ACTION = 203;
/** A key of the top-level object starts. */
const KEY_ACTION = 204;
/** A value of the top-level object, or the value at the top, starts. */
const VALUE_ACTION = 205;
if (states > FIRST_ACTION) throw new Error('json-scan: too many states');

const NEXT = new Uint8Array(states << 8).fill(ERROR);
const bytes = (chars: string): number[] => [...chars].map((c) => c.charCodeAt(0));
function on(from: number, on: readonly number[] | string, to: number): void {
  for (const c of typeof on === 'string' ? bytes(on) : on) NEXT[(from << 8) | c] = to;
}
/** Every byte `from` accepts leads where it leads from `like`. */
function copyRow(from: number, like: number): void {
  for (let c = 0; c < 256; c++) if (NEXT[(like << 8) | c] !== ERROR) NEXT[(from << 8) | c] = NEXT[(like << 8) | c]!;
}
const PLAIN_BYTES = Array.from({ length: 256 }, (_, c) => c).filter((c) => PLAIN[c] === 1);

/** A string's bytes from `string` on; `end` after its closing quote. */
function stringStates(string: number, escape: number, unicode: readonly number[], end: number): void {
  on(string, PLAIN_BYTES, string);
  on(string, '"', end);
  on(string, '\\', escape);
  on(escape, SIMPLE_ESCAPES, string);
  on(escape, 'u', unicode[0]!);
  for (let k = 0; k < 4; k++) on(unicode[k]!, '0123456789abcdefABCDEF', k === 3 ? string : unicode[k + 1]!);
}

/** The states of values inside a container of kind `k`; `after` is already filled in (what may follow a value). */
function valueStates(k: Kind): void {
  on(k.value, WHITESPACE_BYTES, k.value);
  on(k.value, '"', k.string);
  on(k.value, '-', k.minus);
  on(k.value, '0', k.zero);
  on(k.value, '123456789', k.int);
  on(k.value, '[', OPEN_ARRAY_ACTION);
  on(k.value, '{', OPEN_OBJECT_ACTION);
  stringStates(k.string, k.escape, k.unicode, k.after);
  // A number ends at the first byte that is not part of it, which must be one that may follow a value.
  for (const end of [k.zero, k.int, k.frac, k.expDigits]) copyRow(end, k.after);
  on(k.minus, '0', k.zero);
  on(k.minus, '123456789', k.int);
  on(k.int, '0123456789', k.int);
  for (const s of [k.zero, k.int]) {
    on(s, '.', k.dot);
    on(s, 'eE', k.exp);
  }
  on(k.dot, '0123456789', k.frac);
  on(k.frac, '0123456789', k.frac);
  on(k.frac, 'eE', k.exp);
  on(k.exp, '+-', k.expSign);
  on(k.exp, '0123456789', k.expDigits);
  on(k.expSign, '0123456789', k.expDigits);
  on(k.expDigits, '0123456789', k.expDigits);
  for (const { word, states: rest } of k.literals) {
    on(k.value, [word[0]!], rest[0]!);
    for (let j = 0; j < rest.length; j++) on(rest[j]!, [word[j + 1]!], j + 1 < rest.length ? rest[j + 1]! : k.after);
  }
}

on(A.after, WHITESPACE_BYTES, A.after);
on(A.after, ',', A.value);
on(A.after, ']', CLOSE_ARRAY_ACTION);
valueStates(A);
copyRow(A_FIRST, A.value);
on(A_FIRST, WHITESPACE_BYTES, A_FIRST);
on(A_FIRST, ']', CLOSE_ARRAY_ACTION);

on(O.after, WHITESPACE_BYTES, O.after);
on(O.after, ',', O_KEY);
on(O.after, '}', CLOSE_OBJECT_ACTION);
valueStates(O);
on(O_FIRST_KEY, WHITESPACE_BYTES, O_FIRST_KEY);
on(O_FIRST_KEY, '"', O_KEY_STRING);
on(O_FIRST_KEY, '}', CLOSE_OBJECT_ACTION);
on(O_KEY, WHITESPACE_BYTES, O_KEY);
on(O_KEY, '"', O_KEY_STRING);
stringStates(O_KEY_STRING, O_KEY_ESCAPE, O_KEY_UNICODE, O_COLON);
on(O_COLON, WHITESPACE_BYTES, O_COLON);
on(O_COLON, ':', O.value);

on(P_FIRST_KEY, WHITESPACE_BYTES, P_FIRST_KEY);
on(P_FIRST_KEY, '"', KEY_ACTION);
on(P_FIRST_KEY, '}', CLOSE_OBJECT_ACTION);
on(P_KEY, WHITESPACE_BYTES, P_KEY);
on(P_KEY, '"', KEY_ACTION);
on(P_COLON, WHITESPACE_BYTES, P_COLON);
on(P_COLON, ':', P_VALUE);
for (const s of [P_VALUE, T_VALUE]) {
  for (let c = 0; c < 256; c++) NEXT[(s << 8) | c] = VALUE_ACTION;
  on(s, WHITESPACE_BYTES, s);
}
on(P_AFTER, WHITESPACE_BYTES, P_AFTER);
on(P_AFTER, ',', P_KEY);
on(P_AFTER, '}', CLOSE_OBJECT_ACTION);
on(T_AFTER, WHITESPACE_BYTES, T_AFTER);

/** What is open, on the container stack and in `scan`'s `inside`. */
const TOP = 0;
const IN_ARRAY = 1;
const IN_OBJECT = 2;
/** The top-level object. */
const IN_ENVELOPE = 3;
/** The byte that closes what the scan is inside (none at the top). */
const CLOSER = [-1, CLOSE_ARRAY, CLOSE_OBJECT, CLOSE_OBJECT];
/** Where a value leaves the automaton, by what it is inside. */
const AFTER = [T_AFTER, A.after, O.after, P_AFTER];

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
  while (i < n && DIGIT[b[i]!] === 1) i++;
  return i;
}

/** The index after the number at `i`, or -1 (JSON's grammar: no `+`, no leading zeros, no bare `.`). */
function scanNumber(b: Uint8Array, i: number): number {
  const n = b.length;
  if (b[i] === MINUS) i++;
  if (i >= n) return -1;
  if (b[i] === ZERO) i++;
  else if (DIGIT[b[i]!] === 1) i = skipDigits(b, i + 1);
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

/** The index after the scalar value at `i` (string, number, literal), or -1. */
function scanScalar(b: Uint8Array, i: number): number {
  const c = b[i]!;
  if (c === QUOTE) return scanString(b, i);
  escaped = false;
  if (c === MINUS || DIGIT[c] === 1) return scanNumber(b, i);
  if (c === TRUE[0]) return scanWord(b, i, TRUE);
  if (c === FALSE[0]) return scanWord(b, i, FALSE);
  if (c === NULL[0]) return scanWord(b, i, NULL);
  return -1;
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
  if (c === MINUS || DIGIT[c] === 1) return Number(b.toString('latin1', start, end));
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
 * whole text is valid; stack[d] is what encloses the container at depth d + 1 (TOP for the outermost).
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
  /** The container the scan is in: TOP, IN_ARRAY, IN_OBJECT or IN_ENVELOPE. */
  let inside = TOP;
  let rootIsObject = false;
  /** The wanted member whose value comes next (a top-level key was just read), else -1. */
  let member = -1;
  let s = T_VALUE;
  for (let i = 0; i < n; i++) {
    s = NEXT[(s << 8) | b[i]!]!;
    if (s < FIRST_ACTION) continue;
    // The actions, the commonest first.
    if (s === CLOSE_ARRAY_ACTION || s === CLOSE_OBJECT_ACTION) {
      inside = stack[--depth]!;
      // A run of closing brackets (deep nests end in one): popped here, not one action each.
      while (b[i + 1] === CLOSER[inside]) {
        inside = stack[--depth]!;
        i++;
      }
      s = AFTER[inside]!;
      continue;
    }
    if (s === VALUE_ACTION) {
      // A value of the top-level object (a wanted member's kept by position) or the value at the top.
      const c = b[i]!;
      if (c === OPEN_ARRAY || c === OPEN_OBJECT) {
        if (member !== -1) {
          starts[member] = i;
          ends[member] = i; // a container: not a scalar
          member = -1;
        }
        s = c === OPEN_ARRAY ? OPEN_ARRAY_ACTION : OPEN_OBJECT_ACTION;
      } else {
        const end = scanScalar(b, i);
        if (end === -1) return SYNTAX;
        if (member !== -1) {
          starts[member] = i;
          ends[member] = end;
          escapes[member] = escaped ? 1 : 0;
          member = -1;
        }
        i = end - 1;
        s = AFTER[inside]!;
        continue;
      }
    }
    if (s === OPEN_ARRAY_ACTION) {
      if (depth === maxDepth) return DEPTH;
      stack[depth++] = inside;
      inside = IN_ARRAY;
      // A run of `[` (deep nests start with one): pushed here, not one action each.
      while (b[i + 1] === OPEN_ARRAY) {
        if (depth === maxDepth) return DEPTH;
        stack[depth++] = IN_ARRAY;
        i++;
      }
      s = A_FIRST;
    } else if (s === OPEN_OBJECT_ACTION) {
      if (depth === maxDepth) return DEPTH;
      stack[depth++] = inside;
      if (depth === 1) {
        inside = IN_ENVELOPE;
        rootIsObject = true;
        s = P_FIRST_KEY;
      } else {
        inside = IN_OBJECT;
        s = O_FIRST_KEY;
      }
    } else if (s === KEY_ACTION) {
      const end = scanString(b, i);
      if (end === -1) return SYNTAX;
      member = keyIndex(b, i, end, escaped, encoded, names);
      i = end - 1;
      s = P_COLON;
    } else {
      return SYNTAX;
    }
  }
  if (s !== T_AFTER) return SYNTAX;
  if (!rootIsObject) return NOT_OBJECT;
  const members: { [P in K]?: MemberValue } = {};
  const spans: { [P in K]?: StringSpan } = {};
  for (let k = 0; k < names.length; k++) {
    const st = starts[k]!;
    if (st === -1) continue;
    const end = ends[k]!;
    members[names[k]!] = end === st ? null : memberValue(b, st, end, escapes[k] === 1);
    if (end !== st && b[st] === QUOTE) spans[names[k]!] = { start: st + 1, end: end - 1, escaped: escapes[k] === 1 };
  }
  return { ok: true, members, spans };
}
