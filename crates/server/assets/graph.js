// The dependency graph: tasks and datasets in layers left to right, edges from inputs to tasks
// to outputs, the critical path (by measured durations) in red, and per task its last hour.

import { h, fill, route, duration } from './dom.js';
import { get } from './api.js';

const W = 170;
const H = 54;
const GAP_X = 70;
const GAP_Y = 18;

export async function show(root, args, ctx) {
  const holder = h('div');
  fill(root, h('h1', {}, 'Graph'), holder);
  const draw = async () => fill(holder, render(await get('/api/graph')));
  await draw();
  ctx.every(10000, () => draw().catch(() => {}));
}

function render(g) {
  const layers = new Map();
  for (const n of g.nodes) {
    if (!layers.has(n.layer)) layers.set(n.layer, []);
    layers.get(n.layer).push(n);
  }
  const pos = new Map();
  let maxRows = 1;
  for (const [layer, nodes] of layers) {
    nodes.sort((a, b) => a.name.localeCompare(b.name));
    nodes.forEach((n, i) => pos.set(n.id, { x: 10 + layer * (W + GAP_X), y: 10 + i * (H + GAP_Y) }));
    maxRows = Math.max(maxRows, nodes.length);
  }
  const critical = new Set(g.critical_path);
  const width = 20 + Math.max(1, layers.size) * (W + GAP_X);
  const height = 20 + maxRows * (H + GAP_Y);
  // A group, not an image: its dataset nodes are links (an image's children are not focusable).
  const svg = h('svg:svg', { id: 'graph', width, height, viewBox: `0 0 ${width} ${height}`, role: 'group',
    'aria-label': `Dependency graph of ${g.nodes.length} tasks and datasets; critical path ${g.critical_path.join(' → ')}` });
  for (const e of g.edges) {
    const a = pos.get(e.from);
    const b = pos.get(e.to);
    if (!a || !b) continue;
    const onPath = critical.has(e.from) && critical.has(e.to);
    const x1 = a.x + W;
    const y1 = a.y + H / 2;
    const x2 = b.x;
    const y2 = b.y + H / 2;
    svg.append(h('svg:path', { class: `edge${onPath ? ' critical' : ''}`, d: `M${x1} ${y1} C${x1 + 35} ${y1} ${x2 - 35} ${y2} ${x2} ${y2}` }));
  }
  for (const n of g.nodes) {
    const p = pos.get(n.id);
    const s = n.stats;
    const bad = (s && s.failed > 0) || n.failed > 0;
    const cls = `node ${n.kind}${critical.has(n.id) ? ' critical' : ''}${bad ? ' bad' : ''}${n.stale > 0 ? ' stale' : ''}`;
    const line2 = s ? `${s.attempts} att/h · ${s.error_rate === null ? '—' : Math.round(s.error_rate * 100) + '% err'}`
      : `${n.kind}${n.stale ? ` · ${n.stale} stale` : ''}${n.failed ? ` · ${n.failed} failed` : ''}`;
    const line3 = s ? `p50 ${s.latency_p50_s === null ? '—' : duration(s.latency_p50_s)} · ${s.throughput_per_h.toFixed(0)}/h` : '';
    const g1 = h('svg:g', { class: cls, 'data-node': n.id, transform: `translate(${p.x} ${p.y})` },
      h('svg:title', {}, `${n.kind} ${n.name}`),
      h('svg:rect', { width: W, height: H, rx: 6 }),
      h('svg:text', { x: 8, y: 17, 'font-weight': 600 }, n.name.length > 24 ? n.name.slice(0, 23) + '…' : n.name),
      h('svg:text', { x: 8, y: 32 }, line2),
      h('svg:text', { x: 8, y: 46 }, line3));
    svg.append(n.kind === 'task' ? g1 : h('svg:a', { href: route('datasets', n.name) }, g1));
  }
  const tasks = g.nodes.filter((n) => n.kind === 'task');
  return h('div', {},
    h('p', {}, 'Critical path (by median measured durations): ', h('strong', { id: 'critical-path' }, g.critical_path.map((id) => id.split(':')[1]).join(' → ') || '—'),
      ` · ${duration(g.critical_path_s) || '0 ms'}`),
    h('div', { class: 'grid-wrap' }, svg),
    h('h2', {}, 'Tasks over the last hour'),
    h('table', { class: 'list', id: 'task-stats' },
      h('thead', {}, h('tr', {}, ['Task', 'Attempts', 'Succeeded', 'Failed', 'Running', 'Error rate', 'p50', 'p95', 'Median (recent)'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, tasks.map((n) => h('tr', {}, h('td', {}, n.name), h('td', {}, n.stats.attempts), h('td', {}, n.stats.succeeded),
        h('td', {}, n.stats.failed), h('td', {}, n.stats.running),
        h('td', {}, n.stats.error_rate === null ? '—' : `${(n.stats.error_rate * 100).toFixed(1)}%`),
        h('td', {}, duration(n.stats.latency_p50_s)), h('td', {}, duration(n.stats.latency_p95_s)), h('td', {}, duration(n.stats.median_s)))))));
}
