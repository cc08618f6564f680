/**
 * deploy/grafana: the committed dashboard is what `npm run dashboard` generates, a Grafana JSON
 * model whose panels do not overlap, and every panel query is PromQL the real `promtool check
 * rules` accepts (each query a recording rule). That each query names series the service and
 * Envoy really export, with an answer from a real Prometheus: e2e/dashboard.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import YAML from 'yaml';
import { allTargets, DASHBOARD_FILE, dashboardText, RATE_WINDOW } from '../grafana/dashboard.ts';
import { promtool } from './tools.ts';
import { tempDir } from '../../testkit/temp-dir.ts';

interface GridPanel { id: number; type: string; title: string; gridPos: { x: number; y: number; w: number; h: number }; targets?: { expr: string; datasource: unknown }[]; description?: string }

/** Every panel query as a recording rule (Grafana's rate window replaced by a fixed one). */
function rulesFile(exprs: readonly string[]): string {
  return YAML.stringify({ groups: [{ name: 'dashboard', rules: exprs.map((expr, i) => ({ record: `edge:dashboard_query:${i}`, expr: expr.replaceAll(RATE_WINDOW, '5m') })) }] });
}

function checkRules(text: string): { status: number; output: string } {
  const dir = tempDir('edge-grafana-');
  try {
    writeFileSync(join(dir, 'queries.yaml'), text);
    const r = promtool(['check', 'rules', join(dir, 'queries.yaml')], dir);
    return { status: r.status, output: r.stdout + r.stderr };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('grafana – the committed dashboard is the generated one (npm run dashboard)', async () => {
  assert.equal(readFileSync(DASHBOARD_FILE, 'utf8'), await dashboardText());
});

test('grafana – every panel query passes promtool check rules', () => {
  const exprs = allTargets().map((t) => t.target.expr);
  assert.ok(exprs.length >= 20);
  const r = checkRules(rulesFile(exprs));
  assert.equal(r.status, 0, r.output);
  assert.match(r.output, new RegExp(`SUCCESS: ${exprs.length} rules found`));
});

test('grafana – promtool refuses a broken query (the check can fail)', () => {
  const r = checkRules(rulesFile(['sum by (route (rate(edge_authz_decisions_total[5m]))']));
  assert.notEqual(r.status, 0);
  assert.match(r.output, /FAILED|error/i);
});

test('grafana – the JSON model: unique ids, panels inside the 24-column grid and not overlapping, every query on the datasource variable, every panel described', () => {
  const model = JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8')) as { panels: GridPanel[]; templating: { list: { name: string; type: string }[] } };
  assert.deepEqual(model.templating.list.map((v) => [v.name, v.type]), [['datasource', 'datasource']]);
  const ids = model.panels.map((p) => p.id);
  assert.equal(new Set(ids).size, ids.length);
  const cells = new Set<string>();
  for (const p of model.panels) {
    const { x, y, w, h } = p.gridPos;
    assert.ok(x >= 0 && x + w <= 24, `${p.title} inside the grid`);
    for (let i = x; i < x + w; i++) for (let j = y; j < y + h; j++) {
      assert.ok(!cells.has(`${i},${j}`), `${p.title} overlaps another panel at ${i},${j}`);
      cells.add(`${i},${j}`);
    }
    if (p.type === 'row') continue;
    assert.ok((p.description ?? '').length > 20, `${p.title} is described`);
    assert.ok((p.targets ?? []).length > 0);
    for (const t of p.targets ?? []) assert.deepEqual(t.datasource, { type: 'prometheus', uid: '${datasource}' });
  }
});
