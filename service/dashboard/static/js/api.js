// The public REST API (/api/v1) with the user's bearer token, and where that token is kept.
//
// The token lives in localStorage under TOKEN_KEY (this browser, this server's origin). A page
// opened as /dashboard/#token=<token> stores it and removes it from the address bar; the
// fragment never reaches the server or its logs.

export const API = "/api/v1";
const TOKEN_KEY = "tunehub.token";

/** A 401 from the API: the token is missing, unknown or revoked. */
export class AuthError extends Error {}

/** Any other error answer: `status`, and the API's `{detail, code}`. */
export class ApiError extends Error {
  constructor(status, detail, code) {
    super(detail);
    this.status = status;
    this.code = code;
  }
}

export function getToken() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  localStorage.setItem(TOKEN_KEY, token.trim());
}

export function forgetToken() {
  localStorage.removeItem(TOKEN_KEY);
}

/** Take a token from the URL fragment (#token=...), if any, and clean the address bar. */
export function adoptTokenFromFragment() {
  const match = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!match) return;
  setToken(decodeURIComponent(match[1]));
  history.replaceState(history.state, "", location.pathname + location.search);
}

/** The answer js/prefetch.js started for this GET, once, if made with the current token. */
function takePrefetched(path, token) {
  const started = window.tunehubPrefetch;
  if (!started || !started.has(path)) return null;
  const response = started.get(path);
  started.delete(path);
  return token && token === started.token ? response : null;
}

async function errorFrom(response) {
  let detail = `${response.status} ${response.statusText}`;
  let code = "http_error";
  try {
    const body = await response.json();
    if (body && typeof body.detail === "string") detail = body.detail;
    if (body && typeof body.code === "string") code = body.code;
  } catch (_) {
    // not JSON: keep the status line
  }
  if (response.status === 401) return new AuthError(detail);
  return new ApiError(response.status, detail, code);
}

/**
 * Call the API and return the parsed JSON body.
 * `path` starts after /api/v1; `options` are fetch's (`json` sends a JSON body).
 * Throws AuthError on 401, ApiError on any other non-2xx answer.
 */
export async function api(path, options = {}) {
  const { json, ...init } = options;
  const headers = new Headers(init.headers || {});
  const token = getToken();
  if (token) headers.set("Authorization", `Bearer ${token}`);
  if (json !== undefined) {
    headers.set("Content-Type", "application/json");
    init.body = JSON.stringify(json);
  }
  const prefetched = !init.method && json === undefined ? takePrefetched(path, token) : null;
  const response = await (prefetched ?? fetch(API + path, { ...init, headers }));
  if (!response.ok) throw await errorFrom(response);
  if (response.status === 204) return null;
  return response.json();
}

/** Download an authenticated file (an artifact) and hand it to the browser as `filename`. */
export async function download(path, filename) {
  const response = await fetch(API + path, {
    headers: { Authorization: `Bearer ${getToken()}` },
  });
  if (!response.ok) throw await errorFrom(response);
  const url = URL.createObjectURL(await response.blob());
  const link = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
