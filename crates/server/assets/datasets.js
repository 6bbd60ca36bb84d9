// A dataset: its versions (Delta commits with their run, release, spec hash and author), its
// schema as declared, its partitions with rows, bytes, input versions and code version, its
// lineage and consumers, and which partitions are stale and why.

import { h, fill, route, time, shortId, table, bytes } from './dom.js';
import { get } from './api.js';
import { staleReason } from './grid.js';

export async function show(root, [name]) {
  const base = `/api/datasets/${encodeURIComponent(name)}`;
  const [d, versions, sizes] = await Promise.all([
    get(base),
    get(`${base}/versions`).catch(() => []),
    get(`${base}/partitions`).catch(() => []),
  ]);
  const size = new Map(sizes.map((p) => [p.partition, p]));
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
      versions.slice().reverse().slice(0, 200).map((v) => [String(v.version), time(v.timestamp), v.operation || '',
        v.run_id ? h('a', { href: route('runs', v.run_id) }, shortId(v.run_id)) : '',
        v.release_id ? shortId(v.release_id) : '', v.spec_hash ? String(v.spec_hash).slice(0, 12) : '', v.actor || v.engine || ''])),
    h('h2', {}, 'Schema'),
    (spec.columns || []).length ? table({ id: 'schema' }, ['Column', 'Type', 'Nullable'],
      spec.columns.map((c) => [c.name, c.data_type, c.nullable ? 'yes' : 'no'])) : h('p', { class: 'muted' }, 'Not declared (taken from the first write).'),
    h('h2', {}, 'Partitions'),
    table({ id: 'partitions' }, ['Partition', 'Rows', 'Size', 'Visible since version', 'Built by step', 'Code version', 'Inputs'],
      d.builds.slice().reverse().map((b) => {
        const s = size.get(b.partition) || {};
        return { attrs: { 'data-partition': b.partition }, cells: [b.partition, s.rows ?? s.n_rows ?? '', s.bytes !== undefined ? bytes(s.bytes) : '',
          String(b.since_version), b.step_id ? shortId(b.step_id) : 'unknown', b.code_version ? String(b.code_version).slice(0, 12) : '',
          (Array.isArray(b.inputs) ? b.inputs : []).map((i) => h('div', { class: 'mono' }, `${i.dataset}${i.partition ? ':' + i.partition : ''} v${i.version ?? '?'}`))] };
      })),
    h('h2', {}, 'Releases'),
    table({ id: 'releases' }, ['Release', 'Kind', 'When', 'Run', 'Reason'],
      d.releases.map((r) => [shortId(r.id), r.kind, time(r.created_at), r.run_id ? h('a', { href: route('runs', r.run_id) }, shortId(r.run_id)) : '', r.reason || ''])),
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
