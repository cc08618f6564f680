/**
 * The market service's request-target split (parseTarget) reads every target exactly as
 * `new URL(target, base)` and its `searchParams` do: the direct split of plain targets and the
 * URL fallback for everything else, checked on generated targets of plain and hostile characters.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { parseTarget } from '../../src/market/http.ts';

/** What a target reads as, or the error it throws (a target URL cannot parse). */
function viaUrl(raw: string): unknown {
  try {
    const url = new URL(raw, 'http://market.local');
    return { path: url.pathname, params: [...url.searchParams] };
  } catch (err) {
    return String(err);
  }
}

function viaTarget(raw: string): unknown {
  try {
    const t = parseTarget(raw);
    return { path: t.path, params: [...t.params()] };
  } catch (err) {
    return String(err);
  }
}

const CHARS = [...'abcXYZ019_.:,-=&/?+% #\\\'"<>é市🎲\t'];

test('parseTarget: path and (name, value) pairs as WHATWG URL and URLSearchParams give them', () => {
  const piece = fc.array(fc.constantFrom(...CHARS), { maxLength: 40 }).map((a) => a.join(''));
  fc.assert(fc.property(piece, piece, (p, q) => {
    const raw = `/${p}${q === '' ? '' : `?${q}`}`;
    assert.deepEqual(viaTarget(raw), viaUrl(raw), raw);
  }), { numRuns: 3000 });
  for (const raw of [
    '/v1/markets', '/v1/markets?', '/v1/markets?conditionId=a,b&limit=5', '/v1/markets?&&a=&=b&c', '/v1/../v1/markets?x=1',
    '/v1/markets?a=%41', '/v1/markets?a=b+c', '/v1/markets?a=1#frag', 'http://x/v1/markets?a=1', '*', '/v1//markets?limit=1=2', '//v1/markets?a=1', '//[/x',
  ]) assert.deepEqual(viaTarget(raw), viaUrl(raw), raw);
});
