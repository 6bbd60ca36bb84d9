// Operations: backlog and ETA, throughput, queue age per class, freshness lag per dataset,
// retry budgets, pools, workers and the scheduler with its liveness, sources waited for, staleness,
// and the alerts: every rule's episodes (firing first) and the silences in force.

import { h, fill, table, duration, plural, time } from './dom.js';
import { get } from './api.js';

export async function show(root, args, ctx) {
  const holder = h('div');
  fill(root, h('h1', {}, 'Operations'), holder);
  const draw = async () => {
    const [status, alerts, silences] = await Promise.all(
      [get('/api/status?limit=1'), get('/api/alerts'), get('/api/alerts/silences')]);
    fill(holder, renderAlerts(alerts, silences), render(status));
  };
  await draw();
  ctx.every(5000, () => draw().catch(() => {}));
}

function render(status) {
  const d = status.debt;
  const g = d.scheduler || null;
  const num = (v) => (v === null || v === undefined ? '—' : String(typeof v === 'number' ? Math.round(v * 100) / 100 : v));
  return h('div', {},
    h('div', { class: 'cards', id: 'ops-cards' },
      card('Scheduler', g ? (g.stale ? `idle (last drain ${duration(g.age_s)} ago)` : 'draining now') : 'never ran'),
      card('Backlog', g ? num(g.backlog) : '—'),
      card('Throughput', g && g.throughput_per_s !== undefined ? `${num(g.throughput_per_s)} steps/s` : '—'),
      card('Backlog ETA', g && g.eta_s !== undefined && g.eta_s !== null ? duration(g.eta_s) : '—'),
      card('Live workers', g && g.live_workers !== undefined ? num(g.live_workers) : '—')),
    h('h2', {}, 'Queues by class'),
    table({ id: 'queues' }, ['Class', 'Ready', 'Running', 'Oldest ready waited'],
      Object.entries(d.queues).map(([k, q]) => [k, q.ready, q.running, duration(q.oldest_ready_age_s) || '—'])),
    h('h2', {}, 'Freshness'),
    table({ id: 'freshness' }, ['Task', 'Newest published partition', 'Lag'],
      d.freshness.map((f) => [f.task, f.newest_published || 'none', duration(f.lag_s) || '—'])),
    h('h2', {}, 'Missed intervals (debt)'),
    d.missed.length === 0 ? h('p', { class: 'muted' }, 'None.') :
      table({ id: 'missed' }, ['Task', 'Missed', 'Oldest', 'Next'], d.missed.map((m) => [m.task, plural(m.n_missed, 'interval'), m.oldest || '', m.next || ''])),
    h('h2', {}, 'Waiting for sources'),
    d.waiting_for_source.length === 0 ? h('p', { class: 'muted' }, 'None.') :
      table({ id: 'waiting' }, ['Task', 'Steps', 'Oldest partition', 'Longest wait', 'Sources'],
        d.waiting_for_source.map((w) => [w.task, w.steps, w.oldest_partition, duration(w.longest_s), w.sources.join(', ')])),
    h('h2', {}, 'Stale partitions'),
    d.stale.length === 0 ? h('p', { class: 'muted' }, 'None.') :
      table({ id: 'stale-counts' }, ['Dataset', 'Partitions', 'Oldest'], d.stale.map((s) => [s.dataset, s.partitions, s.first])),
    h('h2', {}, 'Pools and retry budgets'),
    g && g.pools ? table({ id: 'pools' }, ['Pool', 'Details'],
      Object.entries(g.pools).map(([name, p]) => [name, typeof p === 'object' ? Object.entries(p).map(([k, v]) => `${k.replaceAll('_', ' ')}: ${num(v)}`).join(' · ') : String(p)]))
      : h('p', { class: 'muted' }, 'No scheduler gauge yet.'),
    g ? h('details', {}, h('summary', {}, 'The scheduler\'s last gauge'), h('pre', {}, JSON.stringify(g, null, 2))) : null);
}

// Firing first, then pending, then clear; each with its condition and whether it is silenced.
function renderAlerts(alerts, silences) {
  const order = { firing: 0, pending: 1, clear: 2 };
  const lines = [...alerts].sort((a, b) => order[a.state] - order[b.state] || a.rule.localeCompare(b.rule));
  const firing = lines.filter((l) => l.state === 'firing').length;
  return h('div', {},
    h('h2', {}, firing === 0 ? 'Alerts' : `Alerts: ${firing} firing`),
    lines.length === 0 ? h('p', { class: 'muted' }, 'No alert rules: declare them under [alerts] in tidegate.toml.') :
      table({ id: 'alerts' }, ['Rule', 'Subject', 'State', 'Since', 'Episodes', 'Condition'],
        lines.map((l) => [l.rule, l.subject, l.silenced ? `${l.state} (silenced)` : l.state,
          l.since ? time(l.since) : '', String(l.episodes), l.condition])),
    silences.length === 0 ? null :
      table({ id: 'silences' }, ['Silence', 'Rule', 'Subject', 'Until', 'By', 'Why'],
        silences.map((s) => [s.id, s.rule, s.subject || 'every subject', time(s.expires_at), s.actor, s.reason])));
}

function card(title, value) {
  return h('div', { class: 'card' }, h('div', { class: 'muted' }, title), h('div', { class: 'v' }, value));
}
