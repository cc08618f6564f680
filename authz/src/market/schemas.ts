/**
 * JSON schemas of the market service's queries and responses: the single source the
 * service validates with (ajv) and that docs/openapi.yaml is built from.
 */
import { MARKET_DOCUMENT_SCHEMA } from '../common/feed/schema.ts';
import { LIMIT, PATTERN } from '../common/rules.ts';

export const ROOT_BODY = JSON.stringify({ service: 'edge-trading-proxy', version: '1.0.0', api: 'v1' });

/** Query parameters arrive as strings; ajv coerces `limit`. Unknown parameters are refused. */
export const MARKETS_QUERY_SCHEMA = {
  type: 'object',
  properties: {
    // LIMIT.queryIds ids of at most 128 characters and the commas between them.
    conditionId: { type: 'string', minLength: 1, maxLength: LIMIT.queryIds * 129 - 1 },
    active: { type: 'string', enum: ['true', 'false'] },
    limit: { type: 'integer', minimum: 1, maximum: 500 },
    cursor: { type: 'string', minLength: 1, maxLength: 200, pattern: PATTERN.cursor },
  },
  additionalProperties: false,
} as const;

export const QUOTES_QUERY_SCHEMA = {
  type: 'object',
  properties: {
    conditionId: MARKETS_QUERY_SCHEMA.properties.conditionId,
    limit: MARKETS_QUERY_SCHEMA.properties.limit,
    cursor: MARKETS_QUERY_SCHEMA.properties.cursor,
  },
  additionalProperties: false,
} as const;

export interface ListQuery {
  conditionId?: string;
  active?: 'true' | 'false';
  limit?: number;
  cursor?: string;
}

const decimalOrNull = { type: ['string', 'null'] } as const;

export const ENVELOPE_SCHEMA = {
  type: 'object',
  required: ['d', 's', 'k'],
  properties: { d: { type: 'string' }, s: { type: 'string', pattern: PATTERN.signatureHex }, k: { const: 'ed25519-sha256' } },
} as const;

export const MARKETS_RESPONSE_SCHEMA = {
  type: 'object',
  required: ['markets', 'nextCursor'],
  properties: {
    markets: {
      type: 'array',
      items: { ...MARKET_DOCUMENT_SCHEMA, $id: undefined, required: [...MARKET_DOCUMENT_SCHEMA.required, 'envelope'], properties: { ...MARKET_DOCUMENT_SCHEMA.properties, envelope: ENVELOPE_SCHEMA } },
    },
    nextCursor: { type: ['string', 'null'] },
  },
} as const;

export const QUOTE_SCHEMA = {
  type: 'object',
  required: ['conditionId', 'tokenId', 'outcome', 'bid', 'ask', 'last', 'seq', 'updatedAt'],
  properties: {
    conditionId: { type: 'string', pattern: PATTERN.conditionId },
    tokenId: { type: 'string' }, outcome: { type: 'string' },
    bid: decimalOrNull, ask: decimalOrNull, last: decimalOrNull,
    seq: { type: 'integer' }, updatedAt: { type: 'integer' },
  },
} as const;

export const QUOTES_RESPONSE_SCHEMA = {
  type: 'object',
  required: ['quotes', 'nextCursor'],
  properties: { quotes: { type: 'array', items: QUOTE_SCHEMA }, nextCursor: { type: ['string', 'null'] } },
} as const;
