// Backfills: the list, and the review a second person reads and approves: the frozen spec and
// reason, the blast radius, the comparison per dataset (flags, slices, distributions as bars,
// sample changed rows), and the actions of the flow. Buttons show by role and state; the server
// refuses whatever the page would not offer (the requester approving their own backfill, say).

import { h, fill, route, badge, time, shortId, table, duration, plural } from './dom.js';
import { get, act } from './api.js';
import { me, may, showError, confirmDialog } from './app.js';

export async function list(root, args, ctx) {
  const draw = (page) => table({ id: 'backfills' }, ['Backfill', 'Status', 'Reason', 'Requester', 'Datasets', 'Created'],
    page.items.map((b) => ({
      attrs: { 'data-backfill': b.id },
      cells: [h('a', { href: route('backfills', b.id) }, shortId(b.id)), badge(b.status), b.reason, b.requester,
        Object.entries(b.footprint || {}).map(([d, keys]) => h('div', {}, `${d}: ${plural(keys.length, 'partition')}`)),
        time(b.created_at)],
    })));
  const holder = h('div');
  fill(root, h('h1', {}, 'Backfills'),
    h('p', { class: 'muted' }, 'Plan one with ', h('code', {}, 'tidegate backfill plan'), ' or POST /api/backfills.'), holder);
  fill(holder, draw(await get('/api/backfills?limit=200')));
  ctx.every(5000, async () => fill(holder, draw(await get('/api/backfills?limit=200'))));
}

export async function show(root, [id], ctx) {
  const path = `/api/backfills/${encodeURIComponent(id)}`;
  const [report, record] = await Promise.all([get(path), findRecord(id)]);
  const comparison = record && record.comparison;
  const requester = me.actor && report.requester && sameName(me.actor, report.requester);
  const buttons = actions(report, path, requester, ctx);
  fill(root,
    h('h1', {}, 'Backfill ', h('span', { class: 'mono' }, report.id)),
    h('p', {}, h('span', { id: 'backfill-state' }, badge(report.status)), ' ', report.reason,
      ' · requested by ', h('strong', {}, report.requester),
      report.approval ? [' · approved by ', h('strong', {}, report.approval.by), ' ', time(report.approval.at)] : null),
    h('p', { class: 'muted', id: 'backfill-next' }, report.next),
    buttons,
    h('div', { class: 'cards' },
      card('Steps', `${report.n_done} / ${report.n_steps}`),
      card('Rate', report.steps_per_s ? `${report.steps_per_s.toFixed(2)} steps/s` : '—'),
      card('ETA', report.eta_s ? duration(report.eta_s) : '—'),
      card('Comparison', report.comparison_hash ? String(report.comparison_hash).slice(0, 12) : 'not compared')),
    report.run_id ? h('p', {}, 'Its run: ', h('a', { href: route('runs', report.run_id) }, shortId(report.run_id))) : null,
    h('h2', {}, 'Blast radius'),
    record ? blastRadius(record) : h('p', { class: 'muted' }, 'Unknown.'),
    h('h2', {}, 'Frozen spec'),
    h('details', {}, h('summary', {}, `spec ${String(report.spec_hash).slice(0, 12)}`),
      h('pre', { id: 'backfill-spec' }, JSON.stringify(record ? record.spec : {}, null, 2))),
    h('h2', {}, 'Comparison'),
    h('div', { id: 'comparison' }, comparison ? review(comparison) : h('p', { class: 'muted' }, 'Not compared yet.')),
    report.failures && report.failures.length ? [h('h2', {}, 'Failures'),
      h('ul', {}, report.failures.map((f) => h('li', {}, h('strong', {}, f.step), ': ', f.reason)))] : null);
  if (['running', 'planned'].includes(report.status)) ctx.every(3000, () => ctx.reload());
}

function sameName(a, b) {
  return String(a).trim().normalize('NFKC').toLowerCase() === String(b).trim().normalize('NFKC').toLowerCase();
}

async function findRecord(id) {
  let cursor = '';
  for (let i = 0; i < 20; i += 1) {
    const page = await get(`/api/backfills?limit=1000${cursor ? '&cursor=' + encodeURIComponent(cursor) : ''}`);
    const found = page.items.find((b) => b.id === id);
    if (found) return found;
    if (!page.next_cursor) return null;
    cursor = page.next_cursor;
  }
  return null;
}

function card(title, value) {
  return h('div', { class: 'card' }, h('div', { class: 'muted' }, title), h('div', { class: 'v' }, value));
}

function blastRadius(record) {
  return table({ id: 'blast-radius' }, ['Dataset', 'Partitions'],
    Object.entries(record.footprint || {}).map(([d, keys]) => [h('a', { href: route('datasets', d) }, d),
      keys.length > 6 ? `${keys[0]} … ${keys[keys.length - 1]} (${keys.length})` : keys.join(', ')]));
}

function actions(report, path, requester, ctx) {
  const s = report.status;
  const buttons = [];
  const comment = h('textarea', { id: 'comment', rows: 2, cols: 60, placeholder: 'Why (recorded in the journal)' });
  const run = (name, method, url, body, question) => async (event) => {
    const button = event.currentTarget;
    if (question) {
      const ok = await confirmDialog(question.title, question.body, { reason: false, yes: question.yes });
      if (!ok) return;
    }
    button.disabled = true;
    try {
      await act(`${name}:${report.id}:${report.comparison_hash || ''}`, method, url, body());
      ctx.reload();
    } catch (e) {
      showError(e);
      button.disabled = false;
    }
  };
  const reason = () => ({ reason: comment.value.trim() || null });
  const button = (action, label, handler, cls) => h('button', { type: 'button', 'data-action': action, class: cls || '', onclick: handler }, label);
  if (may('operator')) {
    if (s === 'planned') buttons.push(button('start', 'Start', run('start', 'POST', `${path}/start`, () => undefined), 'primary'));
    if (s === 'running') buttons.push(button('pause', 'Pause', run('pause', 'POST', `${path}/pause`, reason)));
    if (s === 'paused') buttons.push(button('start', 'Resume', run('resume', 'POST', `${path}/resume`, () => undefined), 'primary'));
    if (s === 'staged' || s === 'approved') buttons.push(button('compare', 'Compare again', run('compare', 'POST', `${path}/compare`, () => undefined)));
  }
  if (may('approver') && !requester && s === 'staged' && report.comparison_hash) {
    buttons.push(button('approve', 'Approve', run('approve', 'POST', `${path}/approve`, () => ({ comparison: report.comparison_hash, comment: comment.value.trim() || null }),
      { title: 'Approve this backfill?', body: h('p', {}, `You approve comparison ${String(report.comparison_hash).slice(0, 12)} as reviewed. Publication stays a separate step.`), yes: 'Approve' }), 'primary'));
    buttons.push(button('reject', 'Reject', run('reject', 'POST', `${path}/cancel`, () => ({ reason: `rejected in review by ${me.actor}: ${comment.value.trim() || 'no comment'}` }),
      { title: 'Reject this backfill?', body: h('p', {}, 'It is cancelled and its staged output discarded; the published data stays as it is.'), yes: 'Reject' }), 'danger'));
  }
  if (may('operator')) {
    if (s === 'approved') buttons.push(button('publish', 'Publish', run('publish', 'POST', `${path}/publish`, () => undefined,
      { title: 'Publish this backfill?', body: h('p', {}, 'Its staged output replaces the published partitions of its blast radius in one atomic release per dataset.'), yes: 'Publish' }), 'primary'));
    if (s === 'published') buttons.push(button('rollback', 'Roll back', run('rollback', 'POST', `${path}/rollback`, () => ({ reason: comment.value.trim() || 'rolled back from the web UI' }),
      { title: 'Roll back this backfill?', body: h('p', {}, 'Every partition it published returns to the version before it, as one rollback release.'), yes: 'Roll back' }), 'danger'));
    if (['planned', 'running', 'paused', 'staged', 'approved'].includes(s) && !buttons.some((b) => b.dataset.action === 'reject')) {
      buttons.push(button('cancel', 'Cancel', run('cancel', 'POST', `${path}/cancel`, reason,
        { title: 'Cancel this backfill?', body: h('p', {}, 'Its steps stop and what it staged is discarded.'), yes: 'Cancel backfill' }), 'danger'));
    }
  }
  if (requester && s === 'staged') buttons.push(h('p', { class: 'muted', id: 'two-person' }, 'You requested this backfill: another person approves it.'));
  if (buttons.length === 0) return h('div', { class: 'actions' }, h('span', { class: 'muted' }, may('operator') ? 'No action now.' : 'Read only.'));
  return h('div', {}, h('label', { for: 'comment' }, 'Comment'), h('div', {}, comment), h('div', { class: 'actions' }, buttons));
}

function review(c) {
  const datasets = c.datasets || [];
  return datasets.map((d) => h('section', { class: 'panel', 'data-dataset': d.dataset },
    h('h3', {}, d.dataset),
    h('p', {}, `${d.totals.rows_before} rows before, ${d.totals.rows_after} after: ${d.totals.n_added} added, ${d.totals.n_removed} removed, ${d.totals.n_changed} changed; ${plural(d.totals.n_flagged, 'partition')} flagged`),
    d.schema_changes && d.schema_changes.length ? h('ul', {}, d.schema_changes.map((s) => h('li', {}, s))) : null,
    table({ class: 'list partitions' }, ['Partition', 'Rows before', 'Rows after', 'Added', 'Removed', 'Changed', 'Flags'],
      d.partitions.map((p) => ({ attrs: { 'data-partition': p.partition, class: p.flagged.length ? 'flagged' : '' },
        cells: [p.partition, p.rows_before, p.rows_after, p.n_added, p.n_removed, p.n_changed, p.flagged.join('; ')] }))),
    d.partitions.slice(0, 3).map((p) => partitionDetail(p))));
}

function partitionDetail(p) {
  const numeric = p.columns.filter((c) => c.mean_before !== null || c.mean_after !== null);
  return h('details', {}, h('summary', {}, `Partition ${p.partition}: distributions, slices, sample rows`),
    numeric.length ? h('div', { class: 'bars', role: 'list', 'aria-label': 'column means before and after' },
      numeric.map((c) => bars(c))) : null,
    p.slices.length ? table({ class: 'list' }, ['Slice', 'Value', 'Before', 'After', 'Added', 'Removed'],
      p.slices.slice(0, 50).map((s) => [s.column, s.value, s.rows_before, s.rows_after, s.n_added, s.n_removed])) : null,
    p.sample_changed.length ? [h('h4', {}, 'Sample changed rows'), h('pre', { class: 'sample' }, p.sample_changed.map((r) => JSON.stringify(r)).join('\n'))] : null);
}

function bars(c) {
  const before = Math.abs(c.mean_before || 0);
  const after = Math.abs(c.mean_after || 0);
  const top = Math.max(before, after) || 1;
  const bar = (label, v, raw) => h('div', { class: 'bar', role: 'listitem' }, h('span', { class: 'mono' }, `${c.column} ${label}`),
    h('span', { class: 'fill', style: null, 'data-w': Math.round((v / top) * 200) }), String(raw ?? '—'));
  const el = h('div', {}, bar('mean before', before, c.mean_before), bar('mean after', after, c.mean_after));
  // Widths through the CSSOM, which the Content-Security-Policy allows (style attributes it does not).
  for (const f of el.querySelectorAll('.fill')) f.style.width = `${f.dataset.w}px`;
  return el;
}
