// #/ops/workers: the worker processes the fleet clocks saw in the last ten minutes: their
// stages, slots in use, jobs running and the leases they hold per stream.

import { api } from "./api.js";
import { badge, fmtAgo, fmtTime, h, heading, replace, table } from "./dom.js";

const REFRESH_MS = 3000;

export function render(main) {
  const controller = new AbortController();
  let timer = null;
  const body = h("div", {}, h("p", { text: "Loading…" }));
  replace(main, heading("Workers"), body);
  async function load() {
    try {
      const s = await api("/v1/admin/stats", { signal: controller.signal });
      replace(body, table("Worker processes", ["Worker", "State", "Stages", "Slots in use", "Running", "Leases", "Last seen", "Started"],
        s.workers.map((w) => [
          h("span", { class: "mono", text: w.name }),
          badge(w.alive ? "alive" : "silent"),
          w.stages.join(", ") || "—",
          w.alive ? `${w.in_use} / ${w.slots}` : "—",
          w.running,
          w.leases.length ? h("ul", { class: "plain" }, w.leases.map((l) =>
            h("li", { text: `${l.stage}:${l.stream} p${l.partition}: ${l.leases}` }))) : "none",
          fmtAgo(w.last_seen),
          fmtTime(w.started_at),
        ]), "No worker has reached Redis in the last ten minutes."));
    } catch (err) {
      if (!controller.signal.aborted) replace(body, h("p", { class: "error", text: `${err.code}: ${err.message}` }));
    }
    if (!controller.signal.aborted) timer = setTimeout(load, REFRESH_MS);
  }
  load();
  return () => {
    controller.abort();
    clearTimeout(timer);
  };
}
