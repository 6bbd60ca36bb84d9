// The API, as the page calls it: the session cookie authenticates (sent by the browser, never
// readable here), each change carries the session's CSRF token and an Idempotency-Key, and a
// refusal becomes an ApiError with the problem's words.

let csrf = null;

export function setCsrf(token) { csrf = token; }

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem && problem.detail ? problem.detail : `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

async function answer(response) {
  if (response.status === 401) window.dispatchEvent(new CustomEvent('tidegate:signed-out'));
  if (response.status === 204) return null;
  const type = response.headers.get('content-type') || '';
  const body = type.includes('json') ? await response.json().catch(() => null) : await response.text();
  if (!response.ok) throw new ApiError(response.status, typeof body === 'object' ? body : { detail: body });
  return body;
}

/** GET a JSON answer. */
export async function get(path) {
  return answer(await fetch(path, { headers: { accept: 'application/json' }, credentials: 'same-origin' }));
}

/**
 * A change: `method` on `path` with a JSON `body`, under `key` (an Idempotency-Key: the same key
 * for a retried or double-clicked change, so it is done once).
 */
export async function change(method, path, body, key) {
  const headers = { accept: 'application/json', 'x-csrf-token': csrf || '' };
  if (key) headers['idempotency-key'] = key;
  const init = { method, headers, credentials: 'same-origin' };
  if (body !== undefined) {
    headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  return answer(await fetch(path, init));
}

/**
 * The Idempotency-Key of one intended change (`what`: the action and its target), kept in this
 * tab's session storage until the change is answered, so a reloaded page that sends it again
 * is answered with the first answer instead of doing it twice.
 */
export function intent(what) {
  const slot = `tidegate:intent:${what}`;
  let key = sessionStorage.getItem(slot);
  if (!key) {
    key = crypto.randomUUID();
    sessionStorage.setItem(slot, key);
  }
  return { key, done() { sessionStorage.removeItem(slot); } };
}

const inflight = new Map();

/**
 * Does `what` once per intent: sends the change under its key and forgets the key once answered.
 * The same intent asked again while its request is in flight (a double click, a form submitted
 * twice) gets that request's answer instead of a second request.
 */
export function act(what, method, path, body) {
  if (inflight.has(what)) return inflight.get(what);
  const p = send(what, method, path, body).finally(() => inflight.delete(what));
  inflight.set(what, p);
  return p;
}

async function send(what, method, path, body) {
  const i = intent(what);
  try {
    const result = await change(method, path, body, i.key);
    i.done();
    return result;
  } catch (e) {
    // A refusal is an answer too: the same key would only be refused again (or answered 422).
    if (e instanceof ApiError && e.status < 500 && e.status !== 409) i.done();
    throw e;
  }
}
