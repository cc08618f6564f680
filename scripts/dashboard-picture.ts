/**
 * Draws docs/images/edge-dashboard.svg: the dashboard's panels (deploy/grafana/dashboard.ts) as
 * a real Prometheus answered their queries over a short scripted run of the real stack (Envoy,
 * the TS service, Redis, the demo mTLS backend, e2e/lib/). Not Grafana (none can be installed
 * here): the same queries, drawn by this script, and the picture says so.
 *
 * The run (~100 s): reads from many client addresses throughout; requests from a blocked
 * country (451); bursts from one address past the local limit (429); orders, with the backend
 * slow (504) for a while, then down (502), then back.
 *
 *   npm run dashboard:picture        (PICTURE_SECONDS=20 for a quick look; the committed picture: 100 s)
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { geoFixtures } from '../testkit/geo-fixtures.ts';
import { ROWS, RATE_WINDOW, type Panel } from '../deploy/grafana/dashboard.ts';
import { ROOT } from '../deploy/paths.ts';
import { startStack, type Stack } from '../e2e/lib/driver.ts';
import { allowedIp, ingest, KP_IP, orderBody, request, uniqueId } from '../e2e/lib/client.ts';
import { startPrometheus, type PromSeries } from '../e2e/lib/prometheus.ts';

export const PICTURE = join(ROOT, 'docs/images/edge-dashboard.svg');
const WINDOW = '10s';
const STEP = 2;

async function load(stack: Stack, seconds: number): Promise<void> {
  const market = uniqueId('0xpic');
  await ingest(stack, market, 1);
  const order = (): Promise<unknown> => request(stack, 'POST', '/v1/orders', { ip: allowedIp(), body: orderBody(market, Buffer.from('picture')), headers: { 'content-type': 'application/json' } });
  const start = Date.now();
  const phase = (): number => (Date.now() - start) / 1000;
  const inflight: Promise<unknown>[] = [];
  // One allowed client that bursts past the local limit (RPS_PER_IP, RATE_BURST below).
  const burster = allowedIp();
  for (let tick = 0; phase() < seconds; tick++) {
    const t = phase();
    const f = t / seconds;
    // Backend slow from 35 % to 50 % of the run, down from 60 % to 75 %.
    stack.backend.mode = f > 0.35 && f < 0.5 ? 'slow' : 'ok';
    stack.backend.delayMs = 2500;
    if (f > 0.6 && f < 0.75 && tick % 40 === 0) await stack.swapBackend('down');
    if (f >= 0.75 && f < 0.8 && tick % 40 === 0) await stack.swapBackend('good');
    for (let i = 0; i < 4; i++) inflight.push(request(stack, 'GET', '/v1/markets', { ip: allowedIp() }));
    if (tick % 5 === 0) inflight.push(order());
    if (tick % 3 === 0) inflight.push(request(stack, 'GET', '/v1/quotes', { ip: KP_IP }));
    if (f > 0.15 && f < 0.3) for (let i = 0; i < 3; i++) inflight.push(request(stack, 'GET', '/healthz', { ip: burster }));
    await sleep(100);
    if (inflight.length > 200) await Promise.allSettled(inflight.splice(0));
  }
  await Promise.allSettled(inflight);
  await stack.swapBackend('good');
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf'];
const esc = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const legendOf = (fmt: string, labels: Record<string, string>): string => fmt.replace(/\{\{\s*(\w+)\s*\}\}/g, (_, k: string) => labels[k] ?? '');

function fmt(v: number, unit: string): string {
  if (!Number.isFinite(v)) return '–';
  if (unit === 's') return v >= 86400 ? `${(v / 86400).toFixed(1)} d` : v >= 1 ? `${v.toFixed(2)} s` : `${(v * 1000).toFixed(v < 0.001 ? 3 : 1)} ms`;
  if (unit === 'ms') return `${v.toFixed(v < 1 ? 2 : 1)} ms`;
  const suffix = unit === 'reqps' ? '/s' : unit === 'ops' ? '/s' : '';
  return `${Number(v.toPrecision(3))}${suffix}`;
}

interface Drawn { legend: string; points: [number, number][] }

function panelSvg(p: Panel, series: Drawn[], x: number, y: number, w: number, h: number, t0: number, t1: number): string {
  const out = [`<g transform="translate(${x},${y})">`, `<rect width="${w}" height="${h}" rx="4" fill="#fff" stroke="#ccc"/>`,
    `<text x="10" y="20" font-size="13" font-weight="bold">${esc(p.title)}</text>`];
  const shown = series.filter((s) => s.points.some(([, v]) => Number.isFinite(v) && v > 0));
  if (p.kind === 'stat') {
    const last = series[0]?.points.at(-1)?.[1];
    out.push(`<text x="${w / 2}" y="${h / 2 + 15}" font-size="34" text-anchor="middle" fill="#1f77b4">${esc(last === undefined ? 'no data' : fmt(last, p.unit))}</text>`);
    return [...out, '</g>'].join('');
  }
  const plot = { x: 55, y: 32, w: w - 70, h: h - 52 - 14 * Math.min(shown.length, 4) };
  const max = Math.max(1e-12, ...shown.flatMap((s) => s.points.map(([, v]) => (Number.isFinite(v) ? v : 0))));
  out.push(`<rect x="${plot.x}" y="${plot.y}" width="${plot.w}" height="${plot.h}" fill="#fafafa" stroke="#eee"/>`);
  for (const f of shown.length === 0 ? [0] : [0, 0.5, 1]) {
    const yy = plot.y + plot.h * (1 - f);
    out.push(`<text x="${plot.x - 4}" y="${yy + 4}" font-size="10" text-anchor="end" fill="#666">${esc(fmt(max * f, p.unit))}</text>`);
  }
  out.push(`<text x="${plot.x}" y="${plot.y + plot.h + 12}" font-size="10" fill="#666">0 s</text>`,
    `<text x="${plot.x + plot.w}" y="${plot.y + plot.h + 12}" font-size="10" text-anchor="end" fill="#666">${Math.round(t1 - t0)} s</text>`);
  if (shown.length === 0) out.push(`<text x="${plot.x + plot.w / 2}" y="${plot.y + plot.h / 2}" font-size="12" text-anchor="middle" fill="#888">0 throughout</text>`);
  shown.slice(0, 8).forEach((s, i) => {
    const pts = s.points.filter(([, v]) => Number.isFinite(v)).map(([t, v]) => `${(plot.x + ((t - t0) / (t1 - t0)) * plot.w).toFixed(1)},${(plot.y + plot.h * (1 - v / max)).toFixed(1)}`);
    out.push(`<polyline fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="1.5" points="${pts.join(' ')}"/>`);
  });
  const legend = shown.slice(0, 8);
  legend.forEach((s, i) => {
    const col = i % 2;
    const row = Math.floor(i / 2);
    const lx = 10 + col * (w / 2);
    const ly = plot.y + plot.h + 28 + row * 14;
    if (row < 4) out.push(`<rect x="${lx}" y="${ly - 8}" width="10" height="3" fill="${COLORS[i % COLORS.length]}"/><text x="${lx + 14}" y="${ly - 3}" font-size="10">${esc(s.legend.slice(0, 42))}</text>`);
  });
  return [...out, '</g>'].join('');
}

async function main(): Promise<void> {
  const seconds = Number(process.env['PICTURE_SECONDS'] ?? 100);
  const stack = await startStack({
    env: { XFF_NUM_TRUSTED_HOPS: '1', BLOCKED_COUNTRIES: 'KP', RPS_PER_IP: '10', RATE_BURST: '20', ORDER_BACKEND_TIMEOUT_MS: '1000', LOG_DECISIONS: 'off' },
    geoipDb: geoFixtures().geoip2,
  });
  const prom = await startPrometheus(stack);
  try {
    await prom.waitForScrapes(2);
    const t0 = Math.floor(Date.now() / 1000);
    await load(stack, seconds);
    await prom.waitForScrapes(3);
    const t1 = Math.floor(Date.now() / 1000);
    const W = 1200;
    const PH = 230;
    const parts: string[] = [];
    let y = 70;
    for (const row of ROWS) {
      parts.push(`<text x="10" y="${y + 16}" font-size="15" font-weight="bold" fill="#333">${esc(row.title)}</text>`);
      y += 26;
      for (let i = 0; i < row.panels.length; i += 2) {
        for (const [k, p] of row.panels.slice(i, i + 2).entries()) {
          const drawn: Drawn[] = [];
          for (const t of p.targets) {
            const expr = t.expr.replaceAll(RATE_WINDOW, WINDOW);
            const res: PromSeries[] = await prom.queryRange(expr, t0, t1, STEP);
            for (const s of res) drawn.push({ legend: legendOf(t.legend, s.metric), points: (s.values ?? []).map(([ts, v]) => [ts, Number(v)]) });
          }
          parts.push(panelSvg(p, drawn, 10 + k * (W / 2), y, W / 2 - 20, PH, t0, t1));
        }
        y += PH + 10;
      }
    }
    const header = `<text x="10" y="24" font-size="18" font-weight="bold">Edge trading proxy — deploy/grafana/edge-dashboard.json, drawn from real data</text>`
      + `<text x="10" y="44" font-size="12" fill="#555">Not a Grafana screenshot: each panel is its dashboard query, answered by a real Prometheus 2.42 (1-s scrapes, rate window ${WINDOW}) `
      + `over a ${Math.round(t1 - t0)}-s scripted run of the real stack</text>`
      + `<text x="10" y="60" font-size="12" fill="#555">(scripts/dashboard-picture.ts: reads, a blocked country, a burst past the local limit, orders with the backend slow then down). Series at 0 throughout are left out.</text>`;
    const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${y + 10}" font-family="sans-serif" viewBox="0 0 ${W} ${y + 10}">`
      + `<rect width="100%" height="100%" fill="#f4f5f7"/>${header}${parts.join('')}</svg>\n`;
    mkdirSync(dirname(PICTURE), { recursive: true });
    writeFileSync(PICTURE, svg);
    process.stdout.write(`wrote ${PICTURE}\n`);
  } finally {
    await prom.stop();
    await stack.stop();
  }
}

if (import.meta.main) await main();
