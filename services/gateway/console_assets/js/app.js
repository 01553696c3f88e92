// The console's shell: sign-in, navigation by the URL's fragment (#/jobs, #/ops/...), the
// theme switch. Each page is a module with `render(main, params)`, which may return a
// cleanup function (aborting its requests and timers) called when the page is left.

import { ApiError, session, signIn } from "./api.js";
import { field, h, heading, replace, toast } from "./dom.js";
import * as jobs from "./jobs.js";
import * as job from "./job.js";
import * as submit from "./submit.js";
import * as usage from "./usage.js";
import * as webhooks from "./webhooks.js";
import * as opsStreams from "./ops_streams.js";
import * as opsWorkers from "./ops_workers.js";
import * as opsTenants from "./ops_tenants.js";
import * as opsDeadLetters from "./ops_dead_letters.js";
import * as opsTasks from "./ops_tasks.js";

const TENANT_PAGES = [
  ["#/jobs", "Jobs"], ["#/submit", "Submit"], ["#/usage", "Usage"], ["#/webhooks", "Webhooks"],
];
const OPERATOR_PAGES = [
  ["#/ops", "Streams"], ["#/ops/workers", "Workers"], ["#/ops/tenants", "Tenants"],
  ["#/ops/dead-letters", "Dead letters"], ["#/ops/tasks", "Tasks"],
];
// [pattern, module, role]; a pattern's groups are the page's params.
const ROUTES = [
  [/^#\/jobs\/([^/?]+)$/, job, "tenant"],
  [/^#\/jobs(?:\?(.*))?$/, jobs, "tenant"],
  [/^#\/submit$/, submit, "tenant"],
  [/^#\/usage$/, usage, "tenant"],
  [/^#\/webhooks$/, webhooks, "tenant"],
  [/^#\/ops$/, opsStreams, "operator"],
  [/^#\/ops\/workers$/, opsWorkers, "operator"],
  [/^#\/ops\/tenants(?:\/([^/?]+))?$/, opsTenants, "operator"],
  [/^#\/ops\/dead-letters(?:\/(jobs|webhooks))?(?:\/(\d+)\/(\d+-\d+))?$/, opsDeadLetters, "operator"],
  [/^#\/ops\/tasks$/, opsTasks, "operator"],
];

const main = document.getElementById("main");
let cleanup = null;

function home() {
  return session.role() === "operator" ? "#/ops" : "#/jobs";
}

function renderNav() {
  const nav = document.getElementById("nav");
  const role = session.role();
  const pages = role === "operator" ? OPERATOR_PAGES : role === "tenant" ? TENANT_PAGES : [];
  const here = location.hash || home();
  replace(nav, h("ul", {}, pages.map(([href, label]) => {
    const current = here === href || (here.startsWith(`${href}/`) && href !== "#/ops")
      || (here.startsWith(`${href}?`));
    return h("li", {}, h("a", { href, text: label, "aria-current": current ? "page" : null }));
  })));
  const who = document.getElementById("who");
  who.textContent = role ? `${role === "operator" ? "Operator" : "Tenant"}: ${session.who()}` : "";
  document.getElementById("signout").hidden = !role;
}

function renderSignIn() {
  const key = h("input", { type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const roles = h("fieldset", {},
    h("legend", { text: "Sign in as" }),
    h("label", {}, h("input", { type: "radio", name: "role", value: "tenant", checked: true }),
      " a tenant (an API key)"),
    h("label", {}, h("input", { type: "radio", name: "role", value: "operator" }),
      " the operator (the admin key)"));
  const error = h("p", { class: "error", role: "alert" });
  const form = h("form", { class: "card signin" },
    roles,
    field("signin-key", "Key", key,
      "Kept in this browser tab only (sessionStorage) and sent as an Authorization header."),
    error,
    h("button", { type: "submit", text: "Sign in" }));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const role = form.querySelector("input[name=role]:checked").value;
    error.textContent = "";
    try {
      const who = await signIn(key.value.trim(), role);
      toast(`Signed in: ${who}`);
      location.hash = home();
      route();
    } catch (err) {
      error.textContent = err instanceof ApiError && err.status === 401
        ? "That key is not known." : `Cannot sign in: ${err.message}`;
    }
  });
  replace(main, heading("Sign in to the splatq console"), form);
  key.focus();
}

function route() {
  if (cleanup) {
    cleanup();
    cleanup = null;
  }
  renderNav();
  const role = session.role();
  if (!role) {
    renderSignIn();
    return;
  }
  const hash = location.hash || home();
  for (const [pattern, page, pageRole] of ROUTES) {
    const match = hash.match(pattern);
    if (!match) continue;
    if (pageRole !== role) break;
    replace(main);
    const params = match.slice(1).map((p) => (p === undefined ? null : decodeURIComponent(p)));
    const result = page.render(main, params);
    cleanup = typeof result === "function" ? result : null;
    main.querySelector("h1")?.focus({ preventScroll: true });
    return;
  }
  if (hash !== home()) {
    location.hash = home();
    return;
  }
  replace(main, heading("Not found"));
}

function setTheme(theme) {
  document.documentElement.dataset.theme = theme;
  localStorage.setItem("splatq.theme", theme);
  const button = document.getElementById("theme");
  button.setAttribute("aria-pressed", String(theme === "dark"));
  button.textContent = theme === "dark" ? "Light mode" : "Dark mode";
}

function start() {
  const saved = localStorage.getItem("splatq.theme");
  const dark = saved ? saved === "dark" : window.matchMedia("(prefers-color-scheme: dark)").matches;
  setTheme(dark ? "dark" : "light");
  document.getElementById("theme").addEventListener("click", () => {
    setTheme(document.documentElement.dataset.theme === "dark" ? "light" : "dark");
  });
  document.getElementById("signout").addEventListener("click", () => {
    session.clear();
    location.hash = "";
    route();
  });
  window.addEventListener("splatq:signed-out", () => {
    session.clear();
    toast("The key was refused: signed out.", "error");
    route();
  });
  window.addEventListener("hashchange", route);
  route();
}

start();
