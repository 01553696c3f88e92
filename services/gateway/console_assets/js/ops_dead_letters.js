// #/ops/dead-letters[/<kind>[/<partition>/<entry>]]: dead-lettered jobs and webhook messages
// (newest first), one entry with its death log (the job's stages and events, a message's
// attempts) and audit trail, and the audited actions: redrive (a job from a chosen stage) and
// purge, each after a confirmation.

import { api } from "./api.js";
import { badge, confirmDialog, field, fmtTime, h, heading, json, replace, section, table,
  toast } from "./dom.js";

const STAGES = ["ingest", "reconstruct", "export", "render", "publish"];

function tabs(kind) {
  return h("nav", { class: "tabs", "aria-label": "Kind" }, ["jobs", "webhooks"].map((k) =>
    h("a", { href: `#/ops/dead-letters/${k}`, text: k === "jobs" ? "Jobs" : "Webhook messages",
      "aria-current": k === kind ? "page" : null })));
}

function eventData(data) {
  const shown = Object.entries(data || {}).filter(([k]) => k !== "job_id" && k !== "metadata");
  return shown.map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ") || "—";
}

function entryHref(kind, id) {
  return `#/ops/dead-letters/${kind}/${id}`;
}

async function listPage(main, kind, signal) {
  const body = h("div", {}, h("p", { text: "Loading…" }));
  replace(main, heading("Dead letters"), tabs(kind), body);
  try {
    const r = await api(`/v1/admin/dead-letters/${kind}?limit=100`, { signal });
    const columns = kind === "jobs"
      ? ["Entry", "Reason", "Job", "Tenant", "Error", "Stage", "Redrives", "At"]
      : ["Entry", "Reason", "Message", "Tenant", "URL", "Event", "Redrives", "At"];
    replace(body, h("p", { text: `${r.total} entr${r.total === 1 ? "y" : "ies"}; the newest ${r.items.length} below.` }),
      table(`Dead-lettered ${kind}`, columns, r.items.map((x) => [
        h("a", { href: entryHref(kind, x.id), text: x.id, class: "mono" }),
        x.reason, h("span", { class: "mono", text: x.subject || "—" }), x.tenant || "—",
        kind === "jobs" ? (x.error ? `${x.error.code}: ${x.error.message}` : "—") : h("span", { class: "clip", text: x.url || "—" }),
        kind === "jobs" ? x.current_stage || "—" : x.event || "—",
        x.redrives, fmtTime(x.at),
      ]), "No dead letters. Good."));
  } catch (err) {
    if (!signal.aborted) replace(body, h("p", { class: "error", text: `${err.code}: ${err.message}` }));
  }
}

async function entryPage(main, kind, id, signal) {
  const path = `/v1/admin/dead-letters/${kind}/${id}`;
  const body = h("div", {}, h("p", { text: "Loading…" }));
  replace(main, heading(`Dead letter ${id}`, h("a", { href: `#/ops/dead-letters/${kind}`, text: "All dead letters" })), body);
  let entry;
  try {
    entry = await api(path, { signal });
  } catch (err) {
    if (!signal.aborted) replace(body, h("p", { class: "error", text: err.status === 404 ? "No such entry (redriven or purged?)." : `${err.code}: ${err.message}` }));
    return;
  }
  const actor = h("input", { value: "console", maxlength: 64 });
  const stage = h("select", {}, h("option", { value: "", text: "the stage that failed" }),
    STAGES.map((s) => h("option", { value: s, text: s })));
  const act = async (action) => {
    const json = { actor: actor.value || "console" };
    if (action === "redrive" && stage.value) json.from_stage = stage.value;
    const what = action === "redrive"
      ? `The ${kind === "jobs" ? "job" : "message"} goes back to its queue${json.from_stage ? ` from stage ${json.from_stage}` : ""}.`
      : "The entry is deleted (its audit trail records who did it).";
    if (!(await confirmDialog(`${action === "redrive" ? "Redrive" : "Purge"} ${id}?`, what, action === "redrive" ? "Redrive" : "Purge"))) return;
    try {
      await api(`${path}/${action}`, { method: "POST", json });
      toast(`${action === "redrive" ? "Redriven" : "Purged"}: ${id}`);
      location.hash = `#/ops/dead-letters/${kind}`;
    } catch (err) {
      toast(`${err.code}: ${err.message}`, "error");
    }
  };
  const job = entry.job;
  replace(body,
    section("Entry",
      h("dl", { class: "facts" }, [["Reason", entry.reason], ["At", fmtTime(entry.at)], ["Job", entry.job_id || "—"]]
        .map(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })])),
      json(entry.fields)),
    section("Actions",
      h("div", { class: "row" }, field("dl-actor", "Acting as", actor),
        kind === "jobs" ? field("dl-stage", "Redrive from", stage) : null),
      h("div", { class: "actions" },
        h("button", { type: "button", text: "Redrive", onclick: () => act("redrive") }),
        h("button", { type: "button", class: "danger", text: "Purge", onclick: () => act("purge") }))),
    job ? section("Death log",
      h("p", {}, "Job ", h("span", { class: "mono", text: job.job_id }), ` of ${job.tenant}: `, badge(job.status),
        ` after ${job.attempts} attempt(s), ${job.deliveries} deliveries, ${job.redrives} redrive(s).`),
      job.error ? h("p", { class: "problem" }, h("strong", { text: job.error.code }), ` ${job.error.message}`) : null,
      table("Stages", ["Stage", "Status", "Attempts", "Started", "Finished", "Error"],
        Object.entries(job.stages || {}).map(([name, s]) => [name, badge(s.status), s.attempts, fmtTime(s.started_at),
          fmtTime(s.finished_at), s.error ? `${s.error.code}: ${s.error.message}` : ""]), "No stages."),
      table("Events", ["Type", "At", "Data"], job.events.map((e) => [e.type.split(".").pop(),
        e.payload.timestamp ? fmtTime(new Date(e.payload.timestamp * 1000).toISOString()) : "—",
        h("span", { class: "clip", text: eventData(e.payload.data) })]), "No events.")) : null,
    entry.attempts ? section("Delivery attempts", table("Attempts", ["Attempt", "Outcome", "Status", "Error"],
      entry.attempts.map((a) => [a.attempt, badge(a.outcome || "?"), a.status_code ?? "—", a.error || ""]))) : null,
    section("Audit trail", table("Actions on this entry", ["Action", "By", "Why", "Codes"],
      entry.audit.map((a) => [a.action, a.actor, a.why, a.codes || ""]), "No action recorded yet.")));
}

export function render(main, [kind, partition, entry]) {
  const controller = new AbortController();
  kind = kind || "jobs";
  if (partition && entry) entryPage(main, kind, `${partition}/${entry}`, controller.signal);
  else listPage(main, kind, controller.signal);
  return () => controller.abort();
}
