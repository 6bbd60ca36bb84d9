// The page's shell: sign-in, the header, the hash router, and the protocol every screen follows
// (a screen renders into its root; `main#main` gets data-ready="true" once it has its data, and
// a screen's refusal shows in #error).

import { h, fill } from './dom.js';
import { ApiError, get, change, setCsrf } from './api.js';
import * as grid from './grid.js';
import * as runs from './runs.js';
import * as backfills from './backfills.js';
import * as datasets from './datasets.js';
import * as graph from './graph.js';
import * as ops from './ops.js';
import * as journal from './journal.js';

/** Who is signed in: `{actor, role}`; screens show actions by it (the server decides anyway). */
export const me = { actor: null, role: null };

const ROLES = ['viewer', 'operator', 'approver', 'admin'];

/** Whether the signed-in person's role is at least `role`. */
export function may(role) {
  return ROLES.indexOf(me.role) >= ROLES.indexOf(role);
}

const SCREENS = {
  grid: { nav: 'grid', show: grid.show },
  graph: { nav: 'graph', show: graph.show },
  runs: { nav: 'runs', show: runs.list },
  run: { nav: 'runs', show: runs.show },
  backfills: { nav: 'backfills', show: backfills.list },
  backfill: { nav: 'backfills', show: backfills.show },
  dataset: { nav: 'grid', show: datasets.show },
  ops: { nav: 'ops', show: ops.show },
  journal: { nav: 'journal', show: journal.show },
};

/** The screen and its arguments a location hash names. */
function parse(hash) {
  const parts = hash.replace(/^#\/?/, '').split('/').filter((p) => p !== '').map(decodeURIComponent);
  const [first, ...rest] = parts;
  switch (first) {
    case undefined: case 'grid': return ['grid', rest];
    case 'runs': return rest.length ? ['run', rest] : ['runs', []];
    case 'backfills': return rest.length ? ['backfill', rest] : ['backfills', []];
    case 'datasets': return ['dataset', rest];
    case 'graph': case 'ops': case 'journal': return [first, rest];
    default: return ['grid', []];
  }
}

let generation = 0;
let timers = [];

/** What a screen is given besides its arguments. */
function context(token) {
  return {
    /** Calls `fn` every `ms` while this screen is shown (live updates). */
    every(ms, fn) {
      const id = setInterval(() => { if (token === generation) fn(); }, ms);
      timers.push(id);
    },
    /** Whether this screen is still the one shown. */
    current() { return token === generation; },
    /** Shows the screen again (after a change). */
    reload() { if (token === generation) render(); },
  };
}

async function render() {
  timers.forEach(clearInterval);
  timers = [];
  const token = ++generation;
  const main = document.getElementById('main');
  if (!me.actor) return;
  const [name, args] = parse(location.hash);
  const screen = SCREENS[name];
  main.removeAttribute('data-ready');
  main.dataset.screen = name;
  for (const a of document.querySelectorAll('nav#nav a')) {
    if (a.dataset.nav === screen.nav) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  const error = h('div', { id: 'error', role: 'alert' });
  const root = h('div', { class: 'screen' });
  fill(main, error, root);
  try {
    await screen.show(root, args, context(token));
  } catch (e) {
    if (token !== generation) return;
    error.textContent = e instanceof ApiError ? e.message : `Something went wrong: ${e.message || e}`;
    console.warn(e);
  }
  if (token === generation) {
    main.dataset.ready = 'true';
    // When the screen had its data, for whoever measures (BENCHMARKS.md, first render).
    performance.mark(`tidegate:ready:${name}`);
  }
}

/** Shows an error of an action (not of loading) in #error. */
export function showError(e) {
  const el = document.getElementById('error');
  if (el) el.textContent = e instanceof ApiError ? e.message : String(e.message || e);
}

function signInForm(message) {
  generation += 1;
  me.actor = null;
  document.getElementById('nav').hidden = true;
  document.getElementById('account').hidden = true;
  const main = document.getElementById('main');
  main.removeAttribute('data-ready');
  main.dataset.screen = 'sign-in';
  const failure = h('p', { id: 'sign-in-error', role: 'alert' }, message || '');
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'current-password', required: true, size: 50 });
  const submit = h('button', { id: 'sign-in-submit', type: 'submit', class: 'primary' }, 'Sign in');
  const form = h('form', { id: 'sign-in', class: 'panel' },
    h('h1', {}, 'Sign in to Tidegate'),
    h('p', { class: 'muted' }, 'Paste your token (an admin mints one with ', h('code', {}, 'tidegate token create'), '; ',
      h('code', {}, 'tidegate demo'), ' prints one).'),
    h('label', { for: 'token' }, 'Token'), ' ', input, ' ', submit, failure);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    submit.disabled = true;
    failure.textContent = '';
    try {
      const r = await fetch('/ui/session', {
        method: 'POST', credentials: 'same-origin',
        headers: { 'content-type': 'application/json', accept: 'application/json' },
        body: JSON.stringify({ token: input.value }),
      });
      const body = await r.json().catch(() => ({}));
      if (!r.ok) throw new Error(body.detail || `HTTP ${r.status}`);
      input.value = '';
      signedIn(body);
    } catch (e) {
      failure.textContent = e.message;
      submit.disabled = false;
    }
  });
  fill(main, form);
  main.dataset.ready = 'true';
  input.focus();
}

function signedIn(session) {
  me.actor = session.actor;
  me.role = session.role;
  setCsrf(session.csrf);
  document.getElementById('nav').hidden = false;
  document.getElementById('account').hidden = false;
  fill(document.getElementById('whoami'), session.actor, ' ', h('span', { class: 'muted' }, `(${session.role})`));
  render();
}

async function signOut() {
  try { await change('DELETE', '/ui/session'); } catch (e) { /* signed out either way */ }
  setCsrf(null);
  signInForm('Signed out.');
}

/**
 * Asks before a change: `body` (nodes: what will happen, a dry run) in the dialog; resolves to
 * `{reason}` when confirmed, `null` when not.
 */
export function confirmDialog(title, body, { reason = true, yes = 'Confirm' } = {}) {
  const dialog = document.getElementById('confirm');
  fill(document.getElementById('confirm-title'), title);
  fill(document.getElementById('confirm-body'), body);
  const input = document.getElementById('confirm-reason');
  input.value = '';
  input.hidden = !reason;
  document.getElementById('confirm-reason-label').hidden = !reason;
  const ok = document.getElementById('confirm-yes');
  ok.textContent = yes;
  return new Promise((resolve) => {
    const done = (value) => {
      ok.onclick = null;
      document.getElementById('confirm-no').onclick = null;
      dialog.onclose = null;
      if (dialog.open) dialog.close();
      resolve(value);
    };
    ok.onclick = () => done({ reason: input.value.trim() });
    document.getElementById('confirm-no').onclick = () => done(null);
    dialog.onclose = () => done(null);
    dialog.showModal();
  });
}

window.addEventListener('hashchange', render);
window.addEventListener('tidegate:signed-out', () => signInForm('Your session has ended: sign in again.'));
document.getElementById('sign-out').addEventListener('click', signOut);

(async () => {
  try {
    const session = await get('/ui/session');
    if (session && session.signed_in) signedIn(session); else signInForm('');
  } catch (e) {
    signInForm(`The server did not answer: ${e.message}`);
  }
})();
