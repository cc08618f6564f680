/**
 * Validates a response received through Envoy against docs/openapi.yaml: the status must be
 * documented for the operation, and a JSON body must match the documented schema (ajv, JSON
 * Schema 2020-12 as OpenAPI 3.1 uses). Throws with a clear message otherwise.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import YAML from 'yaml';

interface Op { responses: Record<string, { content?: Record<string, { schema?: object }> }> }
const doc = YAML.parse(readFileSync(fileURLToPath(new URL('../../docs/openapi.yaml', import.meta.url)), 'utf8')) as { paths: Record<string, Record<string, Op>> } & Record<string, unknown>;
const ajv = new Ajv2020({ strict: false, allErrors: false, validateFormats: false });
ajv.addSchema({ ...doc, $id: 'openapi' });
const cache = new Map<string, ValidateFunction>();
const pointer = (s: string): string => s.replace(/~/g, '~0').replace(/\//g, '~1');

export function validateResponse(method: string, url: string, status: number, contentType: string | null, body: string): void {
  const path = new URL(url, 'http://x').pathname;
  const m = method.toLowerCase();
  const op = doc.paths[path]?.[m];
  if (op === undefined) return; // undocumented paths answer 404/405 JSON; checked by their tests
  // An exact status wins over its range key ('2XX', as OpenAPI allows).
  const documented = op.responses[String(status)] !== undefined ? String(status) : `${String(status)[0]}XX`;
  const res = op.responses[documented];
  if (res === undefined) throw new Error(`${method} ${path}: status ${status} is not documented (${Object.keys(op.responses).join(', ')})`);
  if (status === 304) return;
  const media = res.content?.['application/json'];
  if (media === undefined) return; // pass-through bodies (orders) have no schema
  if (!(contentType ?? '').startsWith('application/json')) throw new Error(`${method} ${path} ${status}: content-type ${contentType}, documented application/json`);
  const key = `${path}|${m}|${documented}`;
  let v = cache.get(key);
  if (v === undefined) {
    v = ajv.compile({ $ref: `openapi#/paths/${pointer(path)}/${m}/responses/${documented}/content/application~1json/schema` });
    cache.set(key, v);
  }
  const parsed: unknown = JSON.parse(body);
  if (!v(parsed)) throw new Error(`${method} ${path} ${status}: body does not match docs/openapi.yaml: ${JSON.stringify(v.errors?.slice(0, 3))} body=${body.slice(0, 200)}`);
}
