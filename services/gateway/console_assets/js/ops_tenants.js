// #/ops/tenants and #/ops/tenants/<name>: tenants with their weights, running caps, quota
// and API keys, through the admin API. A new key's secret is shown once, in a dialog.

import { api } from "./api.js";
import { confirmDialog, field, fmtSeconds, fmtTime, h, heading, replace, secretDialog, section,
  table, toast } from "./dom.js";

const base = "/v1/admin/tenants";

function guard(run) {
  return async (e) => {
    e?.preventDefault?.();
    try {
      await run();
    } catch (err) {
      toast(`${err.code}: ${err.message}`, "error");
    }
  };
}

function quotaText(q) {
  if (q.quota_gpu_seconds === null) return `no quota · ${fmtSeconds(q.used_gpu_seconds)} used`;
  return `${fmtSeconds(q.used_gpu_seconds)} used + ${fmtSeconds(q.reserved_gpu_seconds)} reserved of ${fmtSeconds(q.quota_gpu_seconds)} / ${q.period}`;
}

function listPage(main, signal) {
  const body = h("div", {}, h("p", { text: "Loading…" }));
  const name = h("input", { required: true, pattern: "[A-Za-z0-9][A-Za-z0-9._\\-]{0,63}" });
  const weight = h("input", { type: "number", min: 1, max: 1000, value: 1 });
  const form = h("form", { class: "card" }, h("h2", { text: "Create a tenant" }),
    h("div", { class: "row" }, field("tenant-name", "Name", name), field("tenant-weight", "Weight", weight)),
    h("button", { type: "submit", text: "Create" }));
  form.addEventListener("submit", guard(async () => {
    const created = await api(base, { method: "POST", json: { tenant: name.value, weight: Number(weight.value) } });
    location.hash = `#/ops/tenants/${encodeURIComponent(created.tenant)}`;
  }));
  replace(main, heading("Tenants"), form, body);
  (async () => {
    try {
      const { tenants } = await api(base, { signal });
      const details = await Promise.all(tenants.map((t) =>
        api(`${base}/${encodeURIComponent(t.tenant)}`, { signal })));
      replace(body, table("Tenants", ["Tenant", "Weight", "Running caps", "Quota", "Keys", "Created"],
        details.map((t) => [
          h("a", { href: `#/ops/tenants/${encodeURIComponent(t.tenant)}`, text: t.tenant }),
          t.weight,
          `interactive ${t.running_caps.interactive || "—"}, synthesis ${t.running_caps.synthesis || "—"}`,
          quotaText(t.quota), t.keys.length, fmtTime(t.created_at),
        ]), "No tenants in Redis (static SPLATQ_API_KEYS tenants are not listed)."));
    } catch (err) {
      if (!signal.aborted) replace(body, h("p", { class: "error", text: `${err.code}: ${err.message}` }));
    }
  })();
}

function tenantPage(main, tenant, signal) {
  const path = `${base}/${encodeURIComponent(tenant)}`;
  const body = h("div", {}, h("p", { text: "Loading…" }));
  replace(main, heading(`Tenant ${tenant}`, h("a", { href: "#/ops/tenants", text: "All tenants" })), body);

  async function load() {
    let t;
    try {
      t = await api(path, { signal });
    } catch (err) {
      if (!signal.aborted) replace(body, h("p", { class: "error", text: `${err.code}: ${err.message}` }));
      return;
    }
    const weight = h("input", { type: "number", min: 1, max: 1000, value: t.weight });
    const capI = h("input", { type: "number", min: 0, value: t.running_caps.interactive });
    const capS = h("input", { type: "number", min: 0, value: t.running_caps.synthesis });
    const sched = h("form", {}, h("div", { class: "row" }, field("t-weight", "Weight", weight),
      field("t-cap-i", "Running cap, interactive (0: none)", capI),
      field("t-cap-s", "Running cap, synthesis (0: none)", capS)),
    h("button", { type: "submit", text: "Save" }));
    sched.addEventListener("submit", guard(async () => {
      await api(path, { method: "PATCH", json: { weight: Number(weight.value),
        running_caps: { interactive: Number(capI.value), synthesis: Number(capS.value) } } });
      toast("Saved");
      load();
    }));
    const seconds = h("input", { type: "number", min: 0, step: "any", placeholder: "none",
      value: t.quota.quota_gpu_seconds ?? "" });
    const period = h("select", {}, ["month", "day"].map((p) => h("option", { value: p, text: p, selected: p === t.quota.period })));
    const quota = h("form", {}, h("p", { text: quotaText(t.quota) }),
      h("div", { class: "row" }, field("t-quota", "GPU seconds (empty: no quota)", seconds),
        field("t-period", "Period", period)),
      h("button", { type: "submit", text: "Set quota" }));
    quota.addEventListener("submit", guard(async () => {
      const value = seconds.value === "" ? null : Number(seconds.value);
      await api(`${path}/quota`, { method: "PUT", json: { gpu_seconds: value, period: period.value } });
      toast("Quota set");
      load();
    }));
    const label = h("input", { placeholder: "ci, laptop, …" });
    const newKey = h("form", {}, h("div", { class: "row" }, field("t-key-label", "Label", label)),
      h("button", { type: "submit", text: "Create a key" }));
    newKey.addEventListener("submit", guard(async () => {
      const k = await api(`${path}/keys`, { method: "POST", json: { label: label.value } });
      await secretDialog(`New API key for ${tenant}`, "API key", k.api_key);
      load();
    }));
    const keyRows = t.keys.map((k) => [
      h("code", { text: k.key_id }), k.label || "—", h("code", { text: k.hint }), fmtTime(k.created_at),
      k.expires_at ? `retires ${fmtTime(k.expires_at)}` : "—",
      h("div", { class: "actions" },
        h("button", { type: "button", class: "secondary", text: "Rotate", onclick: guard(async () => {
          const grace = h("input", { type: "number", min: 0, value: 3600, id: "rotate-grace" });
          const ok = await confirmDialog("Rotate this key?", `A new key replaces ${k.hint}; the old one keeps working for the grace period.`,
            "Rotate", field("rotate-grace", "Grace period (seconds)", grace));
          if (!ok) return;
          const made = await api(`${path}/keys`, { method: "POST",
            json: { label: k.label, rotate: k.key_id, grace_seconds: Number(grace.value) } });
          await secretDialog(`Rotated key for ${tenant}`, "API key", made.api_key);
          load();
        }) }),
        h("button", { type: "button", class: "danger", text: "Revoke", onclick: guard(async () => {
          if (!(await confirmDialog("Revoke this key?", `${k.hint} stops working within the key cache's seconds.`, "Revoke"))) return;
          await api(`${path}/keys/${encodeURIComponent(k.key_id)}`, { method: "DELETE" });
          toast("Revoked");
          load();
        }) })),
    ]);
    replace(body,
      section("Scheduling", sched),
      section("Quota", quota),
      section("API keys", table("Keys (secrets are never shown again)", ["Key", "Label", "Hint", "Created", "Expires", "Actions"],
        keyRows, "No keys in Redis."), newKey));
  }
  load();
}

export function render(main, [tenant]) {
  const controller = new AbortController();
  if (tenant) tenantPage(main, tenant, controller.signal);
  else listPage(main, controller.signal);
  return () => controller.abort();
}
