// The overview: datasets (rows) by partitions (columns, newest first), each cell coloured by
// the partition's state and named in text for screen readers; a cell opens the partition's
// steps, their attempts and versions.

import { h, fill, route, badge, time, shortId, table } from './dom.js';
import { get } from './api.js';

export const STATES = ['published', 'stale', 'failed', 'running', 'queued', 'waiting', 'missed', 'none'];
const WORDS = {
  published: 'published', stale: 'stale', failed: 'failed', running: 'running', queued: 'queued',
  waiting: 'waiting for source', missed: 'missed (debt)', none: 'never built',
};

export async function show(root, args, ctx) {
  const q = { axis: '', dataset: '', task: '', state: '', from: '', to: '', before: '' };
  const axisSelect = h('select', { id: 'filter-axis' });
  const activity = h('input', { id: 'filter-activity', type: 'checkbox', checked: true });
  const datasetInput = h('input', { id: 'filter-dataset', type: 'search', placeholder: 'name contains' });
  const taskInput = h('input', { id: 'filter-task', type: 'search', placeholder: 'the task that writes it', size: 14 });
  const stateSelect = h('select', { id: 'filter-state' },
    h('option', { value: '' }, 'any state'), STATES.map((s) => h('option', { value: s }, WORDS[s])));
  const fromInput = h('input', { id: 'filter-from', type: 'text', placeholder: 'e.g. 2024-01-01', size: 12 });
  const toInput = h('input', { id: 'filter-to', type: 'text', placeholder: 'e.g. 2024-12-31', size: 12 });
  const older = h('button', { id: 'grid-older', type: 'button' }, 'Older partitions');
  const newest = h('button', { id: 'grid-newest', type: 'button' }, 'Newest');
  const wrap = h('div', { class: 'grid-wrap' });
  const summary = h('p', { id: 'grid-summary', class: 'muted' });
  const detail = h('section', { id: 'cell-detail', 'aria-live': 'polite' });
  fill(root,
    h('h1', {}, 'Overview'),
    h('form', { class: 'filters', role: 'search', onsubmit: (e) => { e.preventDefault(); load(); } },
      h('label', {}, 'Partitioning', axisSelect), h('label', {}, 'Dataset', datasetInput), h('label', {}, 'Task', taskInput),
      h('label', {}, 'State', stateSelect),
      h('label', {}, 'From partition', fromInput), h('label', {}, 'To partition', toInput),
      h('label', { class: 'check' }, h('span', {}, activity, ' Only partitions with data or work')),
      h('button', { type: 'submit' }, 'Apply'), newest, older),
    legend(), summary, wrap, detail);

  let answer = null;
  async function load() {
    q.dataset = datasetInput.value.trim();
    q.task = taskInput.value.trim();
    q.from = fromInput.value.trim();
    q.to = toInput.value.trim();
    q.axis = axisSelect.value;
    const params = new URLSearchParams({ columns: '90', activity: activity.checked ? 'true' : 'false' });
    for (const k of ['axis', 'dataset', 'task', 'from', 'to', 'before']) if (q[k]) params.set(k, q[k]);
    answer = await get(`/api/grid?${params}`);
    if (axisSelect.options.length !== answer.axes.length) {
      fill(axisSelect, answer.axes.map((a) => h('option', { value: a.name, selected: a.name === answer.axis },
        `${a.name} (${a.datasets} ${a.datasets === 1 ? 'dataset' : 'datasets'})`)));
    }
    draw();
  }
  function draw() {
    q.state = stateSelect.value;
    older.disabled = !answer.older;
    newest.disabled = !q.before;
    const counts = Object.entries(answer.counts || {}).filter(([, n]) => n > 0)
      .map(([s, n]) => `${n} ${WORDS[s] || s}`).join(', ');
    fill(summary, `${answer.rows.length} datasets × ${answer.columns.length} partitions`,
      answer.columns.length ? ` (${answer.columns[answer.columns.length - 1]} to ${answer.columns[0]})` : '',
      counts ? `: ${counts}` : '',
      answer.hidden_missed ? `. ${answer.hidden_missed} owed intervals nothing has touched are hidden (untick "Only partitions with data or work"; the Operations screen lists the debt).` : '');
    fill(wrap, gridTable(answer, q.state, openCell));
  }
  async function openCell(dataset, partition) {
    fill(detail, h('p', { class: 'muted' }, `Loading ${dataset} ${partition}…`));
    try {
      const p = await get(`/api/datasets/${encodeURIComponent(dataset)}/partitions/${encodeURIComponent(partition)}`);
      fill(detail, cellDetail(p));
    } catch (e) {
      fill(detail, h('p', { class: 'error' }, e.message));
    }
  }
  stateSelect.addEventListener('change', () => answer && draw());
  axisSelect.addEventListener('change', () => { q.before = ''; load(); });
  activity.addEventListener('change', () => { q.before = ''; load(); });
  older.addEventListener('click', () => { q.before = answer.older; load(); });
  newest.addEventListener('click', () => { q.before = ''; load(); });
  await load();
  ctx.every(5000, () => load().catch(() => {}));
}

function legend() {
  return h('div', { id: 'legend', 'aria-label': 'Legend' },
    STATES.map((s) => h('span', {}, h('span', { class: `sw s-${s}` }), WORDS[s])));
}

function gridTable(answer, onlyState, open) {
  const head = h('tr', {}, h('th', { scope: 'col' }, h('span', { class: 'sr' }, 'Dataset')),
    answer.columns.map((k) => h('th', { scope: 'col', title: k }, h('span', { class: 'k' }, k))));
  const rows = answer.rows
    .filter((r) => !onlyState || r.cells.includes(onlyState))
    .map((r) => h('tr', { 'data-dataset': r.dataset },
      h('th', { scope: 'row' }, h('a', { href: route('datasets', r.dataset) }, r.dataset)),
      r.cells.map((state, i) => {
        const key = answer.columns[i];
        const label = `${r.dataset} ${key}: ${WORDS[state] || state}`;
        const dim = onlyState && state !== onlyState ? ' dim' : '';
        return h('td', { 'data-partition': key, 'data-state': state },
          h('button', { type: 'button', class: `s-${state}${dim}`, title: label, 'aria-label': label,
            onclick: () => open(r.dataset, key) }));
      })));
  return h('table', { id: 'grid' }, h('caption', { class: 'sr' }, 'Datasets by partition, newest first'),
    h('thead', {}, head), h('tbody', {}, rows));
}

function cellDetail(p) {
  return h('div', { class: 'panel' },
    h('h2', {}, p.dataset, ' ', p.partition, ' ', badge(p.state)),
    p.stale.length ? h('ul', { class: 'stale-reasons' }, p.stale.map((r) => h('li', {}, staleReason(r)))) : null,
    p.steps.length === 0 ? h('p', { class: 'muted' }, 'No step has built this partition.') :
      table({ id: 'cell-steps' }, ['Step', 'Run', 'Status', 'Attempts', 'Versions staged', 'Updated'],
        p.steps.map((s) => ({
          attrs: { 'data-step-row': s.step.id },
          cells: [
            h('a', { 'data-step': s.step.id, href: route('runs', s.step.run_id) }, s.step.name),
            h('a', { href: route('runs', s.step.run_id) }, shortId(s.step.run_id)),
            badge(s.step.state.status),
            s.attempts.map((a) => h('div', {}, `#${a.attempt} `, badge(a.outcome || 'running'),
              a.reason ? h('span', { class: 'muted' }, ' ', a.reason) : null)),
            s.versions.map((v) => h('div', { class: 'mono' }, `${v.n_rows ?? '?'} rows`)),
            time(s.step.updated_at),
          ],
        }))));
}

export function staleReason(r) {
  if (r.kind === 'input') {
    const what = r.partition ? `${r.dataset}:${r.partition}` : r.dataset;
    const read = r.read_version === null || r.read_version === undefined ? 'before it had a table' : `at version ${r.read_version}`;
    return `${what} read ${read}, changed at version ${r.changed_at_version}`;
  }
  if (r.kind === 'code') {
    return `built by code version ${String(r.built_with).slice(0, 12)}, the task's code is now ${String(r.now).slice(0, 12)}`;
  }
  return JSON.stringify(r);
}
