// The console's only way to the server: the public HTTP API, with the key the user signed in
// with as `Authorization: Bearer`, kept in this tab's sessionStorage (never a cookie, never
// in a URL). An operator's admin key is sent to /v1/admin/ paths only, a tenant's key never
// there: the role is fixed at sign-in.

const KEY = "splatq.key";
const ROLE = "splatq.role";
const WHO = "splatq.who";

export const session = {
  key: () => sessionStorage.getItem(KEY),
  role: () => sessionStorage.getItem(ROLE),
  who: () => sessionStorage.getItem(WHO),
  set(key, role, who) {
    sessionStorage.setItem(KEY, key);
    sessionStorage.setItem(ROLE, role);
    sessionStorage.setItem(WHO, who);
  },
  clear() {
    for (const k of [KEY, ROLE, WHO]) sessionStorage.removeItem(k);
  },
};

export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail || code || `HTTP ${status}`);
    this.status = status;
    this.code = code || `http_${status}`;
  }
}

function allowed(path, role) {
  const admin = path.startsWith("/v1/admin/");
  return role === "operator" ? admin : role === "tenant" && !admin;
}

async function problem(response) {
  let body = {};
  try {
    body = await response.json();
  } catch {
    // not JSON: the status says it
  }
  return new ApiError(response.status, body.code, body.detail);
}

// fetch() with the session's key. `json` sends a JSON body, `form` a FormData; `raw` returns
// the Response itself (artifacts, event streams).
export async function api(path, { method = "GET", json, form, signal, raw = false, key, role,
  headers = {} } = {}) {
  key = key || session.key();
  role = role || session.role();
  if (!key || !allowed(path, role)) throw new ApiError(0, "not_signed_in", "not signed in for this");
  const init = { method, signal, credentials: "omit", cache: "no-store",
    headers: { Authorization: `Bearer ${key}`, ...headers } };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (form) {
    init.body = form;
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    const error = await problem(response);
    if (response.status === 401 && key === session.key()) window.dispatchEvent(new Event("splatq:signed-out"));
    throw error;
  }
  if (raw) return response;
  return response.status === 204 ? null : response.json();
}

// Sign in: the key is checked against the role's own endpoint before it is kept.
export async function signIn(key, role) {
  if (role === "tenant") {
    const usage = await api("/v1/usage", { key, role });
    session.set(key, role, usage.tenant);
    return usage.tenant;
  }
  await api("/v1/admin/stats", { key, role });
  session.set(key, role, "operator");
  return "operator";
}

// An artifact's bytes (the request carries the key; a redirect to presigned storage drops it).
export async function artifact(jobId, name, { quick = false, signal } = {}) {
  const query = quick ? "?variant=quick" : "";
  const response = await api(`/v1/jobs/${encodeURIComponent(jobId)}/artifacts/${name}${query}`,
    { raw: true, signal });
  return response.blob();
}
