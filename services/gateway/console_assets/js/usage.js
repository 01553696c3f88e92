// #/usage: the tenant's GPU time in the current period against its quota (GET /v1/usage).

import { api } from "./api.js";
import { fmtSeconds, fmtTime, h, heading, replace, section } from "./dom.js";

export function render(main) {
  const controller = new AbortController();
  const body = h("div", {}, h("p", { text: "Loading…" }));
  replace(main, heading("Usage"), body);
  api("/v1/usage", { signal: controller.signal }).then((u) => {
    const quota = u.quota_gpu_seconds;
    const used = u.used_gpu_seconds + u.reserved_gpu_seconds;
    const facts = [
      ["Period", `${u.period} (${u.period_id || "current"})`],
      ["Quota", quota === null ? "none" : `${fmtSeconds(quota)} of GPU time`],
      ["Used (measured)", fmtSeconds(u.used_gpu_seconds)],
      ["Reserved (unfinished jobs, estimated)", fmtSeconds(u.reserved_gpu_seconds)],
      ["Remaining", u.remaining_gpu_seconds === null ? "unlimited" : fmtSeconds(u.remaining_gpu_seconds)],
      ["Resets", fmtTime(u.resets_at)],
    ];
    const pct = quota ? Math.min(100, Math.round((used / quota) * 100)) : 0;
    replace(body, section(`GPU time of ${u.tenant}`,
      quota === null ? h("p", { text: "No quota is set for this tenant." })
        : h("div", { class: "meter" },
          h("label", { for: "usage-meter", text: `${pct}% of the quota used or reserved` }),
          h("meter", { id: "usage-meter", min: 0, max: 100, low: 70, high: 90, optimum: 0, value: pct })),
      h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })]))));
  }).catch((err) => {
    if (!controller.signal.aborted) replace(body, h("p", { class: "error", text: `${err.code}: ${err.message}` }));
  });
  return () => controller.abort();
}
