// A dataset: its versions (Delta commits with their run, release, spec hash and author), its
// schema as declared, its partitions with rows, bytes, input versions and code version, its
// lineage and consumers, and which partitions are stale and why.

import { h, fill, route, time, shortId, table, bytes } from './dom.js';
import { get, act } from './api.js';
import { may, showError, confirmDialog } from './app.js';
import { staleReason } from './grid.js';

export async function show(root, [name], ctx) {
  const base = `/api/datasets/${encodeURIComponent(name)}`;
  // The dataset first: a name that is not one (a mistyped or hostile address) is one refusal,
  // not three requests whose late answers land on the next screen.
  const d = await get(base);
  const [versions, sizes] = await Promise.all([
    get(`${base}/versions`).catch(() => []),
    get(`${base}/partitions`).catch(() => []),
  ]);
  const size = new Map(sizes.map((p) => [p.partition, p]));
  // Which release made each table version: its author, run and kind.
  const byVersion = new Map();
  for (const r of d.releases) for (const item of r.items || []) if (item.dataset === d.name) byVersion.set(item.delta_version, r);
  const spec = d.spec || {};
  const kind = spec.kind || {};
  fill(root,
    h('h1', {}, 'Dataset ', d.name),
    h('p', {}, d.task ? ['written by task ', h('strong', {}, d.task)] : 'read only (external)', ' · ',
      kind.write ? `write mode ${kind.write.mode}` : '', ' · consumers: ', (spec.consumers || []).join(', ') || 'none declared'),
    h('h2', {}, 'Lineage'),
    h('div', { id: 'lineage' },
      h('p', {}, 'Upstream: ', d.upstream.length ? d.upstream.map((u, i) => [i ? ', ' : '', h('a', { href: route('datasets', u) }, u)]) : 'none'),
      h('p', {}, 'Downstream: ', d.downstream.length ? d.downstream.map((u, i) => [i ? ', ' : '', h('a', { href: route('datasets', u) }, u)]) : 'none')),
    h('h2', {}, 'Stale partitions'),
    h('div', { id: 'stale' }, d.stale.length === 0 ? h('p', { class: 'muted' }, 'None.') : staleGroups(d.stale)),
    h('h2', {}, 'Versions'),
    table({ id: 'versions' }, ['Version', 'When', 'Operation', 'Run', 'Release', 'Spec', 'Author'],
      versions.slice().reverse().slice(0, 200).map((v) => {
        const m = v.metadata || {};
        const r = byVersion.get(v.version);
        const run = m['tidegate.run_id'] || (r && r.run_id);
        const release = m['tidegate.release_id'] || (r && r.id);
        return { attrs: { 'data-version': v.version }, cells: [String(v.version),
          v.timestamp_ms ? time(new Date(v.timestamp_ms).toISOString()) : '',
          m['tidegate.operation'] || v.operation || '',
          run ? h('a', { href: route('runs', run) }, shortId(run)) : '',
          release ? shortId(release) : '',
          m['tidegate.spec_hash'] ? String(m['tidegate.spec_hash']).slice(0, 12) : '',
          r ? r.created_by : 'another writer'] };
      })),
    h('h2', {}, 'Schema'),
    (spec.columns || []).length ? table({ id: 'schema' }, ['Column', 'Type', 'Nullable'],
      spec.columns.map((c) => [c.name, c.data_type, c.nullable ? 'yes' : 'no'])) : h('p', { class: 'muted' }, 'Not declared (taken from the first write).'),
    h('h2', {}, 'Partitions'),
    table({ id: 'partitions' }, ['Partition', 'Rows', 'Size', 'Visible since version', 'Built by step', 'Code version', 'Inputs'],
      d.builds.slice().reverse().map((b) => {
        const s = size.get(b.partition) || {};
        return { attrs: { 'data-partition': b.partition }, cells: [b.partition, s.n_rows ?? '', s.n_bytes !== undefined ? bytes(s.n_bytes) : '',
          String(b.since_version), b.step_id ? shortId(b.step_id) : 'unknown', b.code_version ? String(b.code_version).slice(0, 12) : '',
          (Array.isArray(b.inputs) ? b.inputs : []).map((i) => h('div', { class: 'mono' }, `${i.dataset}${i.partition ? ':' + i.partition : ''} v${i.version ?? '?'}`))] };
      })),
    h('h2', {}, 'Releases'),
    table({ id: 'releases' }, ['Release', 'Kind', 'When', 'By', 'Run', ''],
      d.releases.map((r) => ({ attrs: { 'data-release': r.id }, cells: [shortId(r.id), r.kind, time(r.created_at), r.created_by,
        r.run_id ? h('a', { href: route('runs', r.run_id) }, shortId(r.run_id)) : '',
        may('operator') && r.kind === 'publish' ? h('button', { type: 'button', 'data-action': 'rollback-release', class: 'danger',
          onclick: () => rollbackRelease(r, ctx) }, 'Roll back') : ''] }))),
    h('details', {}, h('summary', {}, 'Declaration'), h('pre', {}, JSON.stringify(spec, null, 2))));
}

/** Stale partitions grouped by their reasons: `31 partitions (2024-01-01 … 2024-01-31): code changed…`. */
function staleGroups(stale) {
  const groups = new Map();
  for (const s of stale) {
    const why = s.reasons.map(staleReason).join('; ');
    if (!groups.has(why)) groups.set(why, []);
    groups.get(why).push(s.partition);
  }
  return h('ul', {}, [...groups].map(([why, keys]) => {
    keys.sort();
    const which = keys.length === 1 ? keys[0] : `${keys.length} partitions (${keys[0]} … ${keys[keys.length - 1]})`;
    return h('li', { 'data-partitions': keys.join(' ') }, h('strong', {}, which), ': ', why);
  }));
}

/** Rolls back one release after showing what it would restore (its dry run). */
async function rollbackRelease(r, ctx) {
  const path = `/api/releases/${encodeURIComponent(r.id)}/rollback`;
  let dry;
  try {
    dry = await act(`release-rollback-dry:${r.id}:${Date.now()}`, 'POST', path, { reason: 'dry run from the web UI', dry_run: true });
  } catch (e) { showError(e); return; }
  const ok = await confirmDialog(`Roll back release ${String(r.id).slice(0, 8)}?`,
    h('div', {}, h('p', {}, 'What the rollback would restore (dry run):'), h('pre', {}, JSON.stringify(dry, null, 2))));
  if (!ok) return;
  try {
    await act(`release-rollback:${r.id}`, 'POST', path, { reason: ok.reason || 'rolled back from the web UI' });
    ctx.reload();
  } catch (e) { showError(e); }
}
