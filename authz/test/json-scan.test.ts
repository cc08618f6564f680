/**
 * The order body's JSON scanner (authz/src/common/json-scan.ts, issue 26 "Costly requests
 * bounded"): nesting past the bound refused at the level that passes it, strings read right
 * whatever brackets and escapes they hold, and, held by properties against JSON.parse on
 * generated text (fast-check), the same verdict and the same members as JSON.parse gives.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { jsonObjectScanner, type JsonScan, type MemberValue } from '../src/common/json-scan.ts';
import { LIMIT } from '../src/common/rules.ts';

const NAMES = ['marketId', 'deadline', 'size', 'payload'] as const;
type Name = (typeof NAMES)[number];
const MAX = LIMIT.orderJsonDepth;
const scan = jsonObjectScanner(NAMES, MAX);
const scanText = (s: string): JsonScan<Name> => scan(Buffer.from(s, 'utf8'));
const verdict = (r: JsonScan<Name>): string => (r.ok ? 'ok' : r.reason);

/** `n` levels: the object, then arrays and objects in turn inside it. */
function nested(n: number, inner = '1'): string {
  let s = inner;
  for (let d = n; d >= 2; d--) s = d % 2 === 0 ? `[${s}]` : `{"k":${s}}`;
  return `{"marketId":"m","x":${s}}`;
}

// ---------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------
const cases: Record<string, [text: string, verdict: string]> = {
  '32 levels → fine': [nested(MAX), 'ok'],
  '33 levels → depth': [nested(MAX + 1), 'depth'],
  '32 levels of arrays → within the bound (refused only as not an object)': ['['.repeat(MAX) + ']'.repeat(MAX), 'not_object'],
  '33 levels of arrays → depth': ['['.repeat(MAX + 1) + ']'.repeat(MAX + 1), 'depth'],
  '32,700 [ → depth, read no further than level 33': ['['.repeat(32_700) + ']'.repeat(32_700), 'depth'],
  'stops at level 33: what follows is never read': [`${'['.repeat(MAX + 1)}\u0000garbage`, 'depth'],
  'brackets inside strings do not count': [`{"x":"${'['.repeat(100)}${'{'.repeat(100)}"}`, 'ok'],
  'brackets inside a key do not count': [`{"${'['.repeat(100)}":1}`, 'ok'],
  'an escaped quote does not end the string': [`{"x":"\\"${'['.repeat(40)}"}`, 'ok'],
  'an escaped backslash before the closing quote ends it': [`{"x":"\\\\",${'"y":[['.repeat(1)}1]]}`, 'ok'],
  'escaped backslash then 33 real levels → depth': [`{"x":"\\\\","y":${'['.repeat(MAX)}${']'.repeat(MAX)}}`, 'depth'],
  '\\u escapes of brackets and quotes': ['{"x":"\\u005b\\u007b\\u0022\\u005C"}', 'ok'],
  'whitespace everywhere': [' \t\n\r{ "a" : [ 1 , { } , [ ] ] , "b" : null } \n', 'ok'],
  'empty object': ['{}', 'ok'],
  'not JSON': ['marketId=1', 'syntax'],
  'trailing comma in an object': ['{"a":1,}', 'syntax'],
  'trailing comma in an array': ['{"a":[1,]}', 'syntax'],
  'missing comma': ['{"a":1 "b":2}', 'syntax'],
  'two values at the top': ['{} {}', 'syntax'],
  'unclosed object': ['{"a":1', 'syntax'],
  'unclosed string': ['{"a":"x}', 'syntax'],
  'mismatched brackets': ['{"a":[1}]', 'syntax'],
  'a key that is not a string': ['{a:1}', 'syntax'],
  'single quotes': ["{'a':1}", 'syntax'],
  'a raw control character in a string': ['{"a":"x\u0001y"}', 'syntax'],
  'a raw tab in a string': ['{"a":"x\ty"}', 'syntax'],
  'a bad escape': ['{"a":"\\x"}', 'syntax'],
  'a short \\u escape': ['{"a":"\\u12"}', 'syntax'],
  'a \\u escape with a non-hex digit': ['{"a":"\\u12g4"}', 'syntax'],
  'a lone surrogate escape (JSON.parse takes it)': ['{"a":"\\ud800"}', 'ok'],
  'a leading zero': ['{"a":01}', 'syntax'],
  'a leading plus': ['{"a":+1}', 'syntax'],
  'a bare dot': ['{"a":1.}', 'syntax'],
  'an exponent without digits': ['{"a":1e}', 'syntax'],
  'numbers JSON allows': ['{"a":[0,-0,1.5,-2e10,3E+2,4e-3,1e400]}', 'ok'],
  'NaN': ['{"a":NaN}', 'syntax'],
  'truncated literal': ['{"a":tru}', 'syntax'],
  'literal with a tail': ['{"a":nulll}', 'syntax'],
  'a top-level string': ['"x"', 'not_object'],
  'a top-level number': ['1', 'not_object'],
  'a top-level null': ['null', 'not_object'],
  'a byte-order mark (JSON.parse refuses it)': ['\ufeff{}', 'syntax'],
  'non-ASCII in a string': ['{"a":"zß水🙂"}', 'ok'],
  'non-ASCII outside a string': ['{"a":1}ß', 'syntax'],
  'U+2028 in a string': ['{"a":"\u2028"}', 'ok'],
  'empty text': ['', 'syntax'],
  'whitespace only': [' \n', 'syntax'],
  // Inside nested containers (the table's array and object states, not the top-level object's code).
  'an object closed by ]': ['{"a":{"b":1]}}', 'syntax'],
  'an array closed by }': ['{"a":[[1}]}', 'syntax'],
  'a truncated literal in an array': ['{"a":[tru]}', 'syntax'],
  'a truncated literal in an object': ['{"a":{"k":nul}}', 'syntax'],
  'literals in arrays and objects': ['{"a":[true,false,null,{"k":true,"l":false,"m":null}]}', 'ok'],
  'a short \\u escape in a nested key': ['{"a":{"\\u00":1}}', 'syntax'],
  'escapes in nested keys and values': ['{"a":{"\\u0041\\n":"\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9"},"b":["\\u005d"]}', 'ok'],
  'a raw control character in a nested key': ['{"a":{"k\u0001":1}}', 'syntax'],
  'two values without a comma in an array': ['{"a":[1 2]}', 'syntax'],
  'a key without a colon in a nested object': ['{"a":{"b" 1}}', 'syntax'],
  'a lone minus in an array': ['{"a":[-]}', 'syntax'],
  'a bare dot before the exponent in a nested object': ['{"a":{"b":1.e5}}', 'syntax'],
  'a leading zero in an array': ['{"a":[00]}', 'syntax'],
  'numbers ended by whitespace, commas and brackets': ['{"a":[0 ,-1\t, 2.5\n,3e7\r],"b":{"c":0 ,"d":1.5e-3 },"e":[0],"f":{"g":-0}}', 'ok'],
  'an exponent sign without digits in an array': ['{"a":[1e+]}', 'syntax'],
  'a comma after the last key of a nested object': ['{"a":{"b":1,}}', 'syntax'],
  'a colon in an array': ['{"a":[1:2]}', 'syntax'],
  'a string key in an array': ['{"a":["k":1]}', 'syntax'],
  'an empty array and object at every depth': ['{"a":[[],{},[{}],{"b":[]}]}', 'ok'],
  // Runs of brackets (opened and closed without a step per bracket).
  'a run of closers of both kinds': ['{"a":[[{"b":[[1]]}]],"c":{"d":{"e":[]}}}', 'ok'],
  'one closer too many in a run': ['{"a":[[1]]]}', 'syntax'],
  'an object closer too many in a run': ['{"a":{"b":{"c":1}}}}', 'syntax'],
  'a run closed by the wrong kind': ['{"a":[[[1]]}}', 'syntax'],
  'a run of arrays closing at the top': ['[[[]]]', 'not_object'],
  'a run of 32 arrays in the envelope': [`{"a":${'['.repeat(31)}${']'.repeat(31)}}`, 'ok'],
  'a run of 33 arrays in the envelope': [`{"a":${'['.repeat(32)}${']'.repeat(32)}}`, 'depth'],
};

for (const [name, [text, want]] of Object.entries(cases)) {
  test(`json scan – ${name} → ${want}`, () => {
    assert.equal(verdict(scanText(text)), want);
    // JSON.parse agrees wherever it has an opinion.
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      assert.notEqual(want, 'ok', 'JSON.parse refuses it');
      return;
    }
    if (want === 'syntax') assert.fail('JSON.parse accepts it');
    if (want === 'ok') assert.equal(depthOf(parsed) <= MAX, true);
  });
}

test('json scan – invalid UTF-8 inside a string is taken, as JSON.parse takes its replacement characters', () => {
  const body = Buffer.concat([Buffer.from('{"marketId":"a'), Buffer.from([0xff, 0xc3]), Buffer.from('b"}')]);
  const r = scan(body);
  assert.ok(r.ok);
  assert.equal(r.members.marketId, (JSON.parse(body.toString('utf8')) as { marketId: string }).marketId);
});

const memberCases: Record<string, [text: string, members: Partial<Record<Name, MemberValue>>]> = {
  'the four members': ['{"marketId":"0xm","deadline":1763700300,"size":"25.5","payload":"AAAA"}', { marketId: '0xm', deadline: 1763700300, size: '25.5', payload: 'AAAA' }],
  'absent members are absent': ['{"other":1}', {}],
  'the last of duplicates wins': ['{"marketId":"a","marketId":"b","size":"1","size":2}', { marketId: 'b', size: 2 }],
  'a duplicate that is a container wins as null': ['{"marketId":"a","marketId":{"x":1}}', { marketId: null }],
  'members of nested objects are not top-level members': ['{"x":{"marketId":"inner"},"y":[{"size":"1"}]}', {}],
  'escaped key names are the names': ['{"market\\u0049d":"m","\\u0073ize":"3"}', { marketId: 'm', size: '3' }],
  'escaped values are decoded': ['{"marketId":"a\\"b\\\\c\\u0041\\n"}', { marketId: 'a"b\\cA\n' }],
  'numbers as JSON.parse reads them': ['{"deadline":1e400,"size":-0,"payload":1.50}', { deadline: Infinity, size: -0, payload: 1.5 }],
  'other values are null': ['{"marketId":true,"deadline":null,"size":[],"payload":{}}', { marketId: null, deadline: null, size: null, payload: null }],
  'a key that only starts like a name': ['{"marketIdx":"a","marketI":"b"}', {}],
};

for (const [name, [text, members]] of Object.entries(memberCases)) {
  test(`json scan members – ${name}`, () => {
    const r = scanText(text);
    assert.ok(r.ok, verdict(r));
    assert.deepEqual(r.members, members);
    assert.deepEqual(r.members, oracleMembers(JSON.parse(text) as Record<string, unknown>));
  });
}

// ---------------------------------------------------------------------------------------
// Properties against JSON.parse
// ---------------------------------------------------------------------------------------
function depthOf(v: unknown): number {
  if (v === null || typeof v !== 'object') return 0;
  let inner = 0;
  for (const x of Object.values(v)) inner = Math.max(inner, depthOf(x));
  return inner + 1;
}

function oracleMembers(o: Record<string, unknown>): Partial<Record<Name, MemberValue>> {
  const out: Partial<Record<Name, MemberValue>> = {};
  for (const k of NAMES) {
    if (!Object.hasOwn(o, k)) continue;
    const v = o[k];
    out[k] = typeof v === 'string' || typeof v === 'number' ? v : null;
  }
  return out;
}

/** The scanner and JSON.parse (with the depth bound and the object check on top) give the same answer. */
function agrees(body: Buffer): void {
  const got = scan(body);
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    // Invalid text: refused, as a syntax error or at the level past the bound if it gets there first.
    assert.equal(got.ok, false, `JSON.parse refuses ${JSON.stringify(body.toString('utf8'))}`);
    return;
  }
  if (depthOf(parsed) > MAX) {
    assert.equal(verdict(got), 'depth');
    return;
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    assert.equal(verdict(got), 'not_object');
    return;
  }
  assert.ok(got.ok, `JSON.parse accepts ${JSON.stringify(body.toString('utf8'))} but the scan says ${verdict(got)}`);
  assert.deepEqual(got.members, oracleMembers(parsed as Record<string, unknown>));
}

/** Strings rich in what a scanner can get wrong: brackets, quotes, backslashes, escapes, control and non-ASCII characters. */
const trickyString = fc.string({ unit: fc.constantFrom('[', ']', '{', '}', '"', '\\', ':', ',', 'a', ' ', '\n', '\u0001', 'é', '🙂', '\u2028'), maxLength: 12 });
const key = fc.oneof(fc.constantFrom(...NAMES), trickyString);
const ws = fc.constantFrom('', '', ' ', '\n', '\t ', '\r\n');

/** JSON text (whitespace between tokens, duplicate keys, every escape form JSON.stringify writes) up to `depth` levels. */
const jsonText = (depth: number): fc.Arbitrary<string> => fc.letrec<{ value: string }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', maxDepth: depth },
    fc.oneof(trickyString.map((s) => JSON.stringify(s)), fc.double().map((d) => (Number.isFinite(d) ? JSON.stringify(d) : '1e400')), fc.integer().map(String), fc.constantFrom('true', 'false', 'null', '-0', '0.5e-3')),
    fc.tuple(ws, fc.array(fc.tuple(ws, tie('value'), ws), { maxLength: 4 })).map(([w, xs]) => `[${w}${xs.map(([a, v, b]) => `${a}${v}${b}`).join(',')}]`),
    fc.tuple(ws, fc.array(fc.tuple(key, ws, tie('value')), { maxLength: 4 })).map(([w, xs]) => `{${w}${xs.map(([k, a, v]) => `${JSON.stringify(k)}${a}:${a}${v}`).join(',')}}`),
  ),
})).value;

/** An object whose member `x` nests `levels` more containers around a value. */
const deepObject = fc.tuple(fc.integer({ min: 0, max: MAX + 3 }), fc.array(fc.boolean(), { minLength: MAX + 3, maxLength: MAX + 3 }), trickyString, jsonText(1)).map(([levels, kinds, s, inner]) => {
  let v = `[${JSON.stringify(s)},${inner}]`;
  for (let d = 0; d < levels; d++) v = kinds[d] ? `[${v}]` : `{${JSON.stringify(s)}:${v}}`;
  return `{"marketId":${JSON.stringify(s)},"x":${v}}`;
});

test('property – JSON text (3000): the scan and JSON.parse agree on the verdict and the members', () => {
  fc.assert(fc.property(fc.oneof(jsonText(4), jsonText(8)), (t) => agrees(Buffer.from(t, 'utf8'))), { numRuns: 3000 });
});

test('property – nesting around the bound (2000): refused exactly when JSON.parse\'s value is deeper than 32', () => {
  let deep = 0;
  let fine = 0;
  fc.assert(fc.property(deepObject, (t) => {
    agrees(Buffer.from(t, 'utf8'));
    if (depthOf(JSON.parse(t)) > MAX) deep++;
    else fine++;
  }), { numRuns: 2000 });
  assert.ok(deep > 100 && fine > 100, `both sides of the bound were reached (${deep} deeper, ${fine} not)`);
});

test('property – JSON text with one character inserted, removed or replaced (3000): still the same answer as JSON.parse', () => {
  const edit = fc.tuple(jsonText(4), fc.nat(), fc.constantFrom('insert', 'remove', 'replace'), fc.constantFrom('[', ']', '{', '}', '"', '\\', ':', ',', '0', '-', '.', 'e', 'u', 't', 'n', ' ', '\u0000', 'é'));
  fc.assert(fc.property(edit, ([t, at, how, c]) => {
    const i = t.length === 0 ? 0 : at % t.length;
    const edited = how === 'insert' ? t.slice(0, i) + c + t.slice(i) : how === 'remove' ? t.slice(0, i) + t.slice(i + 1) : t.slice(0, i) + c + t.slice(i + 1);
    agrees(Buffer.from(edited, 'utf8'));
  }), { numRuns: 3000 });
});

test('property – arbitrary bytes and token soup (3000): never ok where JSON.parse refuses', () => {
  const soup = fc.array(fc.constantFrom('{', '}', '[', ']', '"', '\\', ':', ',', '0', '1', '-', '.', 'e', '+', 'true', 'null', 'false', '"marketId"', '\\u0041', ' ', 'x', '\u0001'), { maxLength: 40 }).map((xs) => Buffer.from(xs.join(''), 'utf8'));
  fc.assert(fc.property(fc.oneof(soup, fc.uint8Array({ maxLength: 64 }).map((u) => Buffer.from(u))), agrees), { numRuns: 3000 });
});
