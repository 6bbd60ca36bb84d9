// Runs: the list (with a form to submit one), and one run: its steps, a timeline of attempts
// with waits, retries and publication, its failures with their reasons, and a log viewer that
// follows a live attempt.

import { h, fill, route, badge, time, shortId, table, duration, plural } from './dom.js';
import { get, act } from './api.js';
import { may, showError, confirmDialog } from './app.js';

export async function list(root, args, ctx) {
  const [page, graph] = await Promise.all([get('/api/runs?limit=100'), get('/api/graph').catch(() => null)]);
  const tasks = graph ? graph.nodes.filter((n) => n.kind === 'task').map((n) => n.name) : [];
  const rows = h('div');
  const draw = (p) => fill(rows, table({ id: 'runs' }, ['Run', 'Target', 'Partitions', 'Trigger', 'Status', 'Steps', 'Created'],
    p.items.map((r) => ({
      attrs: { 'data-run': r.id },
      cells: [
        h('a', { href: route('runs', r.id) }, shortId(r.id)),
        r.request.target,
        span(r.request.partitions),
        r.request.trigger,
        badge(r.status),
        Object.entries(r.steps).map(([s, n]) => h('span', {}, badge(s), ` ${n} `)),
        time(r.created_at),
      ],
    }))));
  fill(root, h('h1', {}, 'Runs'), may('operator') ? submitForm(tasks) : null, rows);
  draw(page);
  ctx.every(5000, async () => draw(await get('/api/runs?limit=100')));
}

function span(keys) {
  if (!keys || keys.length === 0) return '';
  return keys.length === 1 ? keys[0] : `${keys[0]} … ${keys[keys.length - 1]} (${keys.length})`;
}

function submitForm(tasks) {
  const task = h('select', { id: 'submit-task', required: true }, tasks.map((t) => h('option', { value: t }, t)));
  const from = h('input', { id: 'submit-from', type: 'text', placeholder: '2024-01-01', size: 12 });
  const to = h('input', { id: 'submit-to', type: 'text', placeholder: '2024-01-07', size: 12 });
  const go = h('button', { type: 'submit', class: 'primary' }, 'Submit run');
  const out = h('div', { 'aria-live': 'polite' });
  const form = h('form', { id: 'submit-run', class: 'filters panel' },
    h('label', {}, 'Task', task), h('label', {}, 'From partition', from), h('label', {}, 'To partition', to), go, out);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    go.disabled = true;
    const body = { target: task.value };
    if (from.value.trim() || to.value.trim()) { body.from = from.value.trim(); body.to = to.value.trim() || from.value.trim(); }
    try {
      const r = await act(`submit:${JSON.stringify(body)}`, 'POST', '/api/runs', body);
      const id = r.run_id || (r.run && r.run.id);
      fill(out, h('p', { class: 'ok' }, 'Submitted ', id ? h('a', { href: route('runs', id) }, shortId(id)) : ''));
    } catch (err) {
      fill(out, h('p', { class: 'error' }, err.message));
    } finally {
      go.disabled = false;
    }
  });
  return form;
}

export async function show(root, [id], ctx) {
  const base = `/api/runs/${encodeURIComponent(id)}`;
  // The parts a live run refreshes; the log viewer is left alone so that it keeps following.
  const head = h('div');
  const failuresBox = h('div');
  const timelineBox = h('div');
  const stepsBox = h('div');
  const viewer = h('section', { id: 'log-viewer' });
  fill(root, head, h('h2', {}, 'Failures'), failuresBox, h('h2', {}, 'Timeline'), timelineBox,
    h('h2', {}, 'Steps'), stepsBox, viewer);
  let finished = false;
  const load = async () => {
    const [run, steps, attempts, failures] = await Promise.all([
      get(base), get(`${base}/steps`), get(`${base}/attempts`), get(`${base}/failures`),
    ]);
    if (!ctx.current()) return;
    const byName = new Map(steps.map((s) => [s.name, s]));
    const openLog = (step, attempt) => followLog(viewer, step, attempt, ctx);
    finished = ['succeeded', 'failed', 'cancelled', 'partially_failed'].includes(run.status);
    fill(head,
      h('h1', {}, 'Run ', h('span', { class: 'mono' }, run.id)),
      h('p', {}, h('span', { id: 'run-state' }, badge(run.status)), ' ', run.request.target, ' · ',
        span(run.request.partitions), ' · ', run.request.trigger, ' · requested by ', run.request.requester,
        ' · ', time(run.created_at)),
      actions(run, finished, () => ctx.reload(), failures.length > 0));
    fill(failuresBox, failures.length === 0 ? h('p', { class: 'muted' }, 'None.') :
      h('ul', { id: 'failures' }, failures.map((f) => {
        const step = byName.get(f.step);
        const tail = h('pre', { class: 'log-tail', hidden: true });
        if (step && step.state.attempt > 0) showTail(step, tail);
        return h('li', { 'data-step': step ? step.id : f.step },
          h('strong', {}, f.step), ` (${plural(f.attempts, 'attempt')}): `, h('span', { class: 'reason' }, f.reason), ' ',
          step ? h('a', { class: 'log-link', href: '#log-viewer', onclick: (e) => { e.preventDefault(); openLog(step, null); } }, 'whole log') : null,
          tail);
      })));
    fill(timelineBox, timeline(run, steps, attempts));
    fill(stepsBox, table({ id: 'steps' }, ['Step', 'Partition', 'Status', 'Attempts', 'Pool', 'Updated', 'Log'],
      steps.map((s) => ({
        attrs: { 'data-step': s.id, 'data-status': s.state.status },
        cells: [s.task, s.partition, badge(s.state.status), String(s.state.attempt), s.pool, time(s.updated_at),
          s.state.attempt > 0 ? h('button', { type: 'button', class: 'log-button', onclick: () => openLog(s, null) }, 'log') : ''],
      }))));
  };
  await load();
  ctx.every(3000, () => { if (!finished) load().catch(() => {}); });
}

function actions(run, finished, ctxReload, failed) {
  if (!may('operator')) return null;
  const buttons = [];
  if (finished && failed) {
    buttons.push(h('button', { type: 'button', 'data-action': 'rerun', class: 'primary', onclick: async () => {
      const downstream = h('input', { type: 'checkbox', id: 'rerun-downstream' });
      const ok = await confirmDialog('Re-run the failed steps?', h('div', {},
        h('p', {}, 'A new run, linked to this one, rebuilds the partitions whose steps failed.'),
        h('label', { for: 'rerun-downstream' }, downstream, ' also rebuild what reads them (downstream)')), { yes: 'Re-run' });
      if (!ok) return;
      try {
        const r = await act(`rerun:${run.id}:${downstream.checked}`, 'POST', `/api/runs/${encodeURIComponent(run.id)}/rerun`,
          { failed: true, downstream: downstream.checked, reason: ok.reason || null });
        const id = r && r.submitted && r.submitted.run && r.submitted.run.id;
        if (id) location.hash = route('runs', id); else ctxReload();
      } catch (e) { showError(e); }
    } }, 'Re-run failed'));
  }
  if (!finished) {
    buttons.push(h('button', { type: 'button', 'data-action': 'cancel', class: 'danger', onclick: async () => {
      const ok = await confirmDialog('Cancel this run?', h('p', {}, 'Steps not yet published stop; what is published stays.'));
      if (!ok) return;
      try { await act(`cancel:${run.id}`, 'POST', `/api/runs/${encodeURIComponent(run.id)}/cancel`, { reason: ok.reason || null }); ctxReload(); } catch (e) { showError(e); }
    } }, 'Cancel run'));
  }
  buttons.push(h('button', { type: 'button', 'data-action': 'rollback', class: 'danger', onclick: async () => {
    let dry;
    try { dry = await act(`rollback-dry:${run.id}:${Date.now()}`, 'POST', `/api/runs/${encodeURIComponent(run.id)}/rollback`, { reason: 'dry run from the web UI', dry_run: true }); } catch (e) { showError(e); return; }
    const ok = await confirmDialog('Roll back this run?', h('div', {}, h('p', {}, 'What the rollback would do (dry run):'), h('pre', {}, JSON.stringify(dry, null, 2))));
    if (!ok) return;
    try { await act(`rollback:${run.id}`, 'POST', `/api/runs/${encodeURIComponent(run.id)}/rollback`, { reason: ok.reason || 'rolled back from the web UI' }); ctxReload(); } catch (e) { showError(e); }
  } }, 'Roll back run'));
  return h('div', { class: 'actions' }, buttons);
}

/** A Gantt chart: per step, the wait from the run's creation to its first attempt, each attempt coloured by its outcome, and publication marked. */
function timeline(run, steps, attempts) {
  const t0 = Date.parse(run.created_at);
  const now = Date.now();
  const ends = attempts.map((a) => Date.parse(a.ended_at || new Date(now).toISOString()));
  const t1 = Math.max(t0 + 1000, ...ends, ...steps.map((s) => Date.parse(s.updated_at)));
  const rowH = 18;
  const left = 220;
  const width = 900;
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (width - left - 10);
  const shown = steps.slice(0, 200);
  const height = shown.length * rowH + 24;
  const svg = h('svg:svg', { id: 'timeline', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': `Timeline of ${steps.length} steps over ${duration((t1 - t0) / 1000)}` });
  svg.append(h('svg:line', { class: 'axis', x1: left, x2: left, y1: 0, y2: height }));
  shown.forEach((s, i) => {
    const y = i * rowH + 4;
    const mine = attempts.filter((a) => a.step_id === s.id);
    svg.append(h('svg:text', { x: 4, y: y + 11 }, s.name.length > 32 ? s.name.slice(0, 31) + '…' : s.name));
    if (mine.length) {
      const start = Date.parse(mine[0].started_at);
      svg.append(h('svg:rect', { x: x(t0), y: y + 6, width: Math.max(0, x(start) - x(t0)), height: 2, fill: '#b0bec5' },
        h('svg:title', {}, `waited ${duration((start - t0) / 1000)}`)));
    }
    for (const a of mine) {
      const a0 = Date.parse(a.started_at);
      const a1 = a.ended_at ? Date.parse(a.ended_at) : now;
      const outcome = a.outcome || 'running';
      svg.append(h('svg:rect', { class: `bar-${outcome}`, x: x(a0), y, width: Math.max(2, x(a1) - x(a0)), height: 12 },
        h('svg:title', {}, `attempt ${a.attempt}: ${outcome}, ${duration((a1 - a0) / 1000)}${a.reason ? ' — ' + a.reason : ''}`)));
    }
    if (s.state.status === 'published') {
      const p = Date.parse(s.updated_at);
      svg.append(h('svg:path', { d: `M${x(p)} ${y} l4 6 l-4 6 l-4 -6 z`, fill: '#1b5e20' }, h('svg:title', {}, `published ${new Date(p).toLocaleString()}`)));
    }
  });
  const more = steps.length > shown.length ? h('p', { class: 'muted' }, `The first ${shown.length} of ${steps.length} steps.`) : null;
  return h('div', { class: 'timeline' }, svg, more,
    h('p', { class: 'muted' }, 'Grey: waiting to start. Bars: attempts (green succeeded, red failed, blue running). Diamond: published.'));
}

/** The end of a failed step's standard error, under its reason. */
async function showTail(step, pre) {
  try {
    const piece = await get(`/api/steps/${encodeURIComponent(step.id)}/log?stream=stderr&tail=1024`);
    if (piece.text) {
      pre.textContent = (piece.from > 0 ? '…' : '') + piece.text;
      pre.hidden = false;
    }
  } catch (e) {
    // The reason stays; the log's end is a convenience.
  }
}

/** Shows a step's log, attempt by attempt, and follows it while the step runs. */
async function followLog(viewer, step, attempt, ctx) {
  const n = attempt || step.state.attempt;
  const stream = h('select', { id: 'log-stream' }, h('option', { value: 'stderr' }, 'stderr'), h('option', { value: 'stdout' }, 'stdout'));
  const pre = h('pre', { id: 'log', tabindex: '0', 'aria-label': `log of ${step.name}` });
  const status = h('p', { class: 'muted', id: 'log-status', 'aria-live': 'polite' });
  const choose = h('select', { id: 'log-attempt' },
    Array.from({ length: step.state.attempt }, (_, i) => i + 1).map((i) => h('option', { value: i, selected: i === n }, `attempt ${i}`)));
  fill(viewer, h('h2', {}, 'Log of ', step.name), h('div', { class: 'filters' },
    h('label', {}, 'Attempt', choose), h('label', {}, 'Stream', stream)), status, pre);
  let offset = 0;
  let token = 0;
  const read = async (mine) => {
    const q = new URLSearchParams({ attempt: choose.value, stream: stream.value, from: String(offset) });
    const piece = await get(`/api/steps/${encodeURIComponent(step.id)}/log?${q}`);
    if (mine !== token) return true;
    if (piece.text) pre.append(document.createTextNode(piece.text));
    offset = piece.next;
    status.textContent = `${piece.size} bytes · step ${piece.status.replaceAll('_', ' ')}${piece.finished ? '' : ' · following'}`;
    return piece.finished && piece.next >= piece.size;
  };
  const restart = async () => {
    token += 1;
    const mine = token;
    offset = 0;
    pre.replaceChildren();
    try {
      while (ctx.current() && mine === token) {
        if (await read(mine)) break;
        await new Promise((r) => setTimeout(r, 1000));
      }
    } catch (e) {
      status.textContent = e.message;
    }
  };
  choose.addEventListener('change', restart);
  stream.addEventListener('change', restart);
  viewer.scrollIntoView();
  await restart();
}
