// The journal: a run's, a step's or a partition's history as intended, happened and visible,
// with the hash chain's verification and the lake's anchors.

import { h, fill, route, time, shortId, table } from './dom.js';
import { get } from './api.js';

export async function show(root, [subject]) {
  const input = h('input', { id: 'journal-subject', type: 'search', size: 40, value: subject || '',
    placeholder: 'run id, step id, task@partition or dataset:partition' });
  const form = h('form', { class: 'filters', role: 'search', onsubmit: (e) => {
    e.preventDefault();
    location.hash = input.value.trim() ? route('journal', input.value.trim()) : '#/journal';
  } }, h('label', {}, 'Subject', input), h('button', { type: 'submit' }, 'Show'));
  const q = new URLSearchParams({ limit: '300' });
  if (subject) q.set('subject', subject);
  const story = await get(`/api/journal?${q}`);
  const chain = story.chain.break_at
    ? h('p', { class: 'error', id: 'chain' }, `The journal's hash chain is broken at entry ${story.chain.break_at.seq}: ${story.chain.break_at.problem}`)
    : h('p', { class: 'ok', id: 'chain' }, `Hash chain verified over ${story.chain.n_entries} entries.`);
  const anchors = story.anchors.length
    ? h('ul', { class: 'error', id: 'anchors' }, story.anchors.map((m) => h('li', {}, `${m.dataset} version ${m.version} (entry ${m.journal_seq}): ${m.problem}`)))
    : h('p', { class: 'ok', id: 'anchors' }, 'Every table commit that vouches for an entry agrees with the journal.');
  fill(root, h('h1', {}, 'Journal', subject ? [': ', h('span', { class: 'mono' }, subject)] : ''), form, chain, anchors,
    section('Intended', 'journal-intended', story.intended),
    section('Happened', 'journal', story.happened),
    section('Visible to readers', 'journal-visible', story.visible));
}

function section(title, id, entries) {
  return [h('h2', {}, `${title} (${entries.length})`),
    entries.length === 0 ? h('p', { class: 'muted' }, 'None.') :
      table({ id }, ['#', 'When', 'Kind', 'Actor', 'Run', 'Step', 'Change', 'Reason'],
        entries.map((e) => ({ attrs: { 'data-seq': e.seq }, cells: [String(e.seq), time(e.at), e.kind, e.actor,
          e.run_id ? h('a', { href: route('runs', e.run_id) }, shortId(e.run_id)) : '',
          e.task ? `${e.task}@${e.partition || ''}` : '',
          e.from_status || e.to_status ? `${e.from_status || ''} → ${e.to_status || ''}` : '', e.reason] })))];
}
