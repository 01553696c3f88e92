// #/webhooks: the tenant's webhook endpoints with their health (circuit, failures), and the
// actions of the API: register, rotate the secret (shown once), send a test event, re-send
// failed messages (recover), enable/disable, delete; and each endpoint's latest attempts.

import { api } from "./api.js";
import { badge, confirmDialog, field, fmtTime, h, heading, replace, secretDialog, section, table,
  toast } from "./dom.js";

const base = "/v1/webhook-endpoints";

function endpointCard(e, reload) {
  const id = encodeURIComponent(e.id);
  const act = (label, run, cls = "secondary") => h("button", { type: "button", class: cls, text: label,
    onclick: async () => {
      try {
        await run();
      } catch (err) {
        toast(`${err.code}: ${err.message}`, "error");
      }
    } });
  const attempts = h("div");
  const health = e.health;
  return section(e.url,
    h("dl", { class: "facts" },
      [["Endpoint", e.id], ["Enabled", e.enabled ? "yes" : `no (${e.disabled_reason || "disabled"})`],
        ["Circuit", badge(health.circuit)], ["Failures in a row", health.consecutive_failures],
        ["Failing since", fmtTime(health.failing_since)], ["Last success", fmtTime(health.last_success_at)],
        ["Last failure", fmtTime(health.last_failure_at)],
        ["Events", e.events.length ? e.events.join(", ") : "all"],
        ["Previous secret valid until", fmtTime(e.previous_secret_expires_at)]]
        .map(([k, v]) => [h("dt", { text: k }), h("dd", {}, v)])),
    h("div", { class: "actions" },
      act("Send test event", async () => {
        const r = await api(`${base}/${id}/test`, { method: "POST" });
        toast(`Test event ${r.event_id} queued`);
      }),
      act("Rotate secret", async () => {
        if (!(await confirmDialog("Rotate this endpoint's secret?",
          "A new secret signs from now on; the old one keeps signing alongside it for the overlap.", "Rotate"))) return;
        const r = await api(`${base}/${id}/rotate-secret`, { method: "POST" });
        await secretDialog("New signing secret", "Secret", r.secret);
        reload();
      }),
      act("Recover failed (24 h)", async () => {
        const since = new Date(Date.now() - 24 * 3600 * 1000).toISOString();
        if (!(await confirmDialog("Re-send failed messages?", `Every dead-lettered message of this endpoint since ${fmtTime(since)} is sent again.`, "Re-send"))) return;
        const r = await api(`${base}/${id}/recover`, { method: "POST", json: { since } });
        toast(`${r.recovered} message(s) re-sent`);
      }),
      act(e.enabled ? "Disable" : "Enable", async () => {
        await api(`${base}/${id}`, { method: "PATCH", json: { enabled: !e.enabled } });
        reload();
      }),
      act("Show attempts", async () => {
        const r = await api(`${base}/${id}/attempts?limit=20`);
        replace(attempts, table("Latest attempts, newest first", ["At", "Event", "Attempt", "Outcome", "Status", "Error"],
          r.items.map((a) => [fmtTime(new Date(a.at * 1000).toISOString()), a.event, a.attempt, badge(a.outcome),
            a.status_code ?? "—", a.error || ""]), "No attempts yet."));
      }),
      act("Delete", async () => {
        if (!(await confirmDialog("Delete this endpoint?", `${e.url} gets no more events.`, "Delete"))) return;
        await api(`${base}/${id}`, { method: "DELETE" });
        reload();
      }, "danger")),
    attempts);
}

export function render(main) {
  const controller = new AbortController();
  const list = h("div", {}, h("p", { text: "Loading…" }));
  const url = h("input", { type: "url", required: true, placeholder: "https://example.com/webhooks" });
  const form = h("form", { class: "card" }, h("h2", { text: "Register an endpoint" }),
    field("wh-url", "URL", url, "Receives every event of your jobs, signed (Standard Webhooks)."),
    h("button", { type: "submit", text: "Register" }));
  async function reload() {
    try {
      const body = await api(base, { signal: controller.signal });
      replace(list, body.data.length ? body.data.map((e) => endpointCard(e, reload))
        : h("p", { class: "empty", text: "No endpoints registered." }));
    } catch (err) {
      if (!controller.signal.aborted) replace(list, h("p", { class: "error", text: `${err.code}: ${err.message}` }));
    }
  }
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const created = await api(base, { method: "POST", json: { url: url.value.trim() } });
      await secretDialog("Endpoint registered", "Signing secret", created.secret);
      url.value = "";
      reload();
    } catch (err) {
      toast(`${err.code}: ${err.message}`, "error");
    }
  });
  replace(main, heading("Webhook endpoints"), form, list);
  reload();
  return () => controller.abort();
}
