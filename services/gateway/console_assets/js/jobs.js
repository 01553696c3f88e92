// #/jobs: the tenant's jobs (GET /v1/jobs: filters by status and creation time, pages by
// cursor), each unfinished one kept live over its event stream (a few at a time; the page
// refreshes for the rest).

import { api } from "./api.js";
import { badge, field, fmtTime, h, heading, replace, table } from "./dom.js";
import { followEvents, isTerminal } from "./sse.js";

const STATUSES = ["queued", "processing", "retrying", "completed", "failed", "canceled"];
const LIVE_STREAMS = 6;
const REFRESH_MS = 5000;

function toRfc3339(local) {
  return local ? new Date(local).toISOString() : "";
}

function progressCell(job) {
  const pct = Math.round((job.progress || 0) * 100);
  return h("span", { class: "progress" },
    h("progress", { max: 100, value: pct, "aria-label": `progress of ${job.id}` }), ` ${pct}%`);
}

function row(job) {
  const meta = Object.keys(job.metadata || {}).length ? JSON.stringify(job.metadata) : "";
  return [
    h("a", { href: `#/jobs/${encodeURIComponent(job.id)}`, text: job.id, class: "mono" }),
    h("span", { dataset: { status: job.id } }, badge(job.status)),
    h("span", { dataset: { stage: job.id }, text: job.current_stage || job.stage || "—" }),
    h("span", { dataset: { progress: job.id } }, progressCell(job)),
    job.quality,
    fmtTime(job.created_at),
    h("span", { class: "clip", title: meta, text: meta }),
  ];
}

export function render(main, [query]) {
  const q = new URLSearchParams(query || "");
  const controller = new AbortController();
  const timers = [];
  const statuses = new Set((q.get("status") || "").split(",").filter(Boolean));
  const filters = h("form", { class: "card filters" },
    h("fieldset", {}, h("legend", { text: "Status" }),
      STATUSES.map((s) => h("label", { class: "check" },
        h("input", { type: "checkbox", name: "status", value: s, checked: statuses.has(s) }), ` ${s}`))),
    h("div", { class: "row" },
      field("jobs-since", "Created since", h("input", { type: "datetime-local", name: "since" })),
      field("jobs-until", "Created before", h("input", { type: "datetime-local", name: "until" })),
      field("jobs-limit", "Per page", h("select", { name: "limit" },
        [10, 20, 50, 100].map((n) => h("option", { value: n, text: n, selected: String(n) === (q.get("limit") || "20") })))),
      h("button", { type: "submit", text: "Apply" })));
  filters.addEventListener("submit", (e) => {
    e.preventDefault();
    const next = new URLSearchParams();
    const picked = [...filters.querySelectorAll("input[name=status]:checked")].map((i) => i.value);
    if (picked.length) next.set("status", picked.join(","));
    if (filters.since.value) next.set("created_since", toRfc3339(filters.since.value));
    if (filters.until.value) next.set("created_until", toRfc3339(filters.until.value));
    next.set("limit", filters.limit.value);
    location.hash = `#/jobs?${next}`;
  });
  const list = h("div", { "aria-live": "polite", "aria-busy": "true" }, h("p", { text: "Loading…" }));
  replace(main, heading("Jobs", h("a", { href: "#/submit", class: "button", text: "Submit an image" })),
    filters, list);

  async function load() {
    const params = new URLSearchParams();
    for (const name of ["status", "created_since", "created_until", "limit", "cursor"]) {
      if (q.get(name)) params.set(name, q.get(name));
    }
    let page;
    try {
      page = await api(`/v1/jobs?${params}`, { signal: controller.signal });
    } catch (err) {
      if (!controller.signal.aborted) replace(list, h("p", { class: "error", text: `${err.code}: ${err.message}` }));
      return;
    }
    const pager = h("nav", { class: "pager", "aria-label": "Pages" },
      q.get("cursor") ? h("a", { href: `#/jobs?${without(q, "cursor")}`, text: "First page" }) : null,
      page.next_cursor ? h("a", { href: `#/jobs?${withCursor(q, page.next_cursor)}`, text: "Next page" }) : null);
    replace(list, table("Your jobs, newest first",
      ["Job", "Status", "Stage", "Progress", "Quality", "Created", "Metadata"],
      page.items.map(row), "No jobs match."), pager);
    list.setAttribute("aria-busy", "false");
    const open = page.items.filter((j) => !isTerminal(j.status));
    open.slice(0, LIVE_STREAMS).forEach((j) => live(j.id));
    if (open.length > LIVE_STREAMS) timers.push(setTimeout(load, REFRESH_MS));
  }

  function live(jobId) {
    followEvents(jobId, (name, payload) => {
      const data = payload.data || {};
      const status = list.querySelector(`[data-status="${CSS.escape(jobId)}"]`);
      const stage = list.querySelector(`[data-stage="${CSS.escape(jobId)}"]`);
      const progress = list.querySelector(`[data-progress="${CSS.escape(jobId)}"]`);
      const kind = name.split(".")[1];
      const map = { queued: "queued", started: "processing", completed: "completed", failed: "failed",
        canceled: "canceled" };
      if (status && map[kind]) replace(status, badge(map[kind]));
      if (stage && data.stage) stage.textContent = data.next_stage || data.stage;
      if (progress && typeof data.progress === "number") {
        replace(progress, progressCell({ id: jobId, progress: data.progress }));
      }
      if (progress && kind === "completed") replace(progress, progressCell({ id: jobId, progress: 1 }));
    }, controller.signal).catch(() => {});
  }

  load();
  return () => {
    controller.abort();
    timers.forEach(clearTimeout);
  };
}

function without(q, name) {
  const next = new URLSearchParams(q);
  next.delete(name);
  return next;
}

function withCursor(q, cursor) {
  const next = new URLSearchParams(q);
  next.set("cursor", cursor);
  return next;
}
