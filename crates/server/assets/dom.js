// Building the page. Everything shown is put in as text (createTextNode, textContent) or as an
// attribute set one by one: nothing from the server is ever parsed as HTML, so a log line, a
// reason or a partition value that holds markup shows as the characters it is.

const SVG = 'http://www.w3.org/2000/svg';

/** An element: `h('a', {href: '#/runs'}, 'Runs')`; `svg:rect` for SVG. Children may be nested arrays. */
export function h(tag, attrs, ...children) {
  const svg = tag.startsWith('svg:');
  const el = svg ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'href' && !/^(#|\/)/.test(String(v))) continue; // only this page's own links
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces `el`'s children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A link to a screen: `#/runs/ID`, each part encoded. */
export function route(...parts) {
  return '#/' + parts.map((p) => encodeURIComponent(String(p))).join('/');
}

/** A table with a header row; `rows` are arrays of cells or `[attrs, cells]`. */
export function table(attrs, headers, rows) {
  return h('table', { class: 'list', ...attrs },
    h('thead', {}, h('tr', {}, headers.map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, rows.map((r) => {
      const [rowAttrs, cells] = Array.isArray(r) ? [{}, r] : [r.attrs, r.cells];
      return h('tr', rowAttrs, cells.map((c) => h('td', {}, c)));
    })));
}

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** Bytes in binary units, as the CLI prints them: `53.0 KiB`. */
export function bytes(n) {
  if (n === null || n === undefined) return '';
  let v = Number(n);
  let u = 0;
  while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u += 1; }
  return u === 0 ? `${v} B` : `${v.toFixed(1)} ${UNITS[u]}`;
}

/** Seconds as `850 ms`, `12.3 s`, `4m 05s`, `2h 03m`, `3d 4h`. */
export function duration(s) {
  if (s === null || s === undefined || Number.isNaN(Number(s))) return '';
  s = Number(s);
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(Math.floor(s % 60)).padStart(2, '0')}s`;
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return `${hrs}h ${String(m % 60).padStart(2, '0')}m`;
  return `${Math.floor(hrs / 24)}d ${hrs % 24}h`;
}

/** An RFC 3339 time as the reader's local date and time, with the exact one in its title. */
export function time(t) {
  if (!t) return '';
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return String(t);
  return h('time', { datetime: t, title: t }, d.toLocaleString());
}

/** `1 retry`, `2 retries`. */
export function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many || one + 's'}`;
}

/** A state in a coloured badge, its word in text. */
export function badge(state) {
  const word = String(state || 'none');
  const cls = {
    published: 'published', succeeded: 'published', approved: 'published', stale: 'stale',
    failed: 'failed', upstream_failed: 'failed', rejected: 'failed', lease_expired: 'failed',
    running: 'running', staged: 'running', validating: 'running', validated: 'running', started: 'running',
    pending: 'queued', ready: 'queued', retry_wait: 'queued', queued: 'queued', planned: 'queued',
    waiting: 'waiting', waiting_for_source: 'waiting', awaiting_approval: 'waiting', compared: 'waiting',
    missed: 'missed', cancelled: 'missed', paused: 'missed', rolled_back: 'missed',
  }[word] || 'none';
  return h('span', { class: `badge s-${cls}` }, word.replaceAll('_', ' '));
}

/** A short id: its first 8 characters, the whole in the title. */
export function shortId(id) {
  return h('span', { class: 'mono', title: id }, String(id).slice(0, 8));
}
