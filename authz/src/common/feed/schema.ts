/**
 * The market document schema (docs/api.md "Market data"), as JSON Schema, validated by ajv.
 * These schema objects are the single source of truth: the market service and (later)
 * docs/openapi.yaml are built from them.
 */
import { Ajv } from 'ajv';
import { PATTERN } from '../rules.ts';

/** Decimal strings: digits with up to 18 fractional digits (same rule as order sizes). */

const decimal = { type: 'string', pattern: PATTERN.decimal, maxLength: 64 } as const;
const unixSecs = { type: 'integer', minimum: 0, maximum: 253402300799 } as const;

export const OUTCOME_SCHEMA = {
  type: 'object',
  required: ['tokenId', 'name'],
  properties: {
    tokenId: { type: 'string', minLength: 1, maxLength: 128 },
    name: { type: 'string', minLength: 1, maxLength: 256 },
    bid: decimal,
    ask: decimal,
    last: decimal,
  },
  additionalProperties: true,
} as const;

export const MARKET_DOCUMENT_SCHEMA = {
  $id: 'MarketDocument',
  type: 'object',
  required: ['conditionId', 'seq', 'question', 'active', 'closed', 'outcomes', 'updatedAt'],
  properties: {
    conditionId: { type: 'string', pattern: PATTERN.conditionId },
    seq: { type: 'integer', minimum: 0, maximum: Number.MAX_SAFE_INTEGER },
    question: { type: 'string', maxLength: 4096 },
    active: { type: 'boolean' },
    closed: { type: 'boolean' },
    endTime: unixSecs,
    minSize: decimal,
    maxSize: decimal,
    tickSize: decimal,
    outcomes: { type: 'array', maxItems: 256, items: OUTCOME_SCHEMA },
    updatedAt: unixSecs,
  },
  additionalProperties: true,
} as const;

export interface Outcome {
  readonly tokenId: string;
  readonly name: string;
  readonly bid?: string;
  readonly ask?: string;
  readonly last?: string;
  readonly [extra: string]: unknown;
}

export interface MarketDocument {
  readonly conditionId: string;
  readonly seq: number;
  readonly question: string;
  readonly active: boolean;
  readonly closed: boolean;
  readonly endTime?: number;
  readonly minSize?: string;
  readonly maxSize?: string;
  readonly tickSize?: string;
  readonly outcomes: readonly Outcome[];
  readonly updatedAt: number;
  readonly [extra: string]: unknown;
}

const ajv = new Ajv({ allErrors: false, strict: true });
const validate = ajv.compile<MarketDocument>(MARKET_DOCUMENT_SCHEMA);

/** Compares two decimal strings that match PATTERN.decimal. Returns -1, 0 or 1. */
export function compareDecimal(a: string, b: string): number {
  const [ai = '', af = ''] = a.split('.');
  const [bi = '', bf = ''] = b.split('.');
  const aInt = ai.replace(/^0+(?=.)/, '');
  const bInt = bi.replace(/^0+(?=.)/, '');
  if (aInt.length !== bInt.length) return aInt.length < bInt.length ? -1 : 1;
  if (aInt !== bInt) return aInt < bInt ? -1 : 1;
  const width = Math.max(af.length, bf.length);
  const aF = af.padEnd(width, '0');
  const bF = bf.padEnd(width, '0');
  return aF === bF ? 0 : aF < bF ? -1 : 1;
}

export type SchemaResult =
  | { readonly ok: true; readonly document: MarketDocument }
  | { readonly ok: false; readonly message: string };

/** Validates a parsed document against the market schema plus minSize ≤ maxSize. */
export function validateDocument(doc: unknown): SchemaResult {
  if (!validate(doc)) {
    const e = validate.errors?.[0];
    const where = e === undefined ? '' : `${e.instancePath || '/'} ${e.message ?? ''}`.trim();
    return { ok: false, message: `document fails the market schema: ${where}` };
  }
  if (doc.minSize !== undefined && doc.maxSize !== undefined && compareDecimal(doc.minSize, doc.maxSize) > 0) {
    return { ok: false, message: 'document fails the market schema: minSize > maxSize' };
  }
  return { ok: true, document: doc };
}
