// #/ops/tasks: the redriver's scheduled tasks (GET /v1/admin/tasks): schedule, last success
// and failure, the next run, and each one's latest runs.

import { api } from "./api.js";
import { badge, fmtTime, h, heading, replace, table } from "./dom.js";

export function render(main) {
  const controller = new AbortController();
  const body = h("div", {}, h("p", { text: "Loading…" }));
  replace(main, heading("Scheduled tasks"), body);
  api("/v1/admin/tasks", { signal: controller.signal }).then((r) => {
    replace(body,
      h("p", { class: "note", text: `Configuration: ${r.config}` }),
      table("Tasks", ["Task", "Schedule (UTC cron)", "State", "Last success", "Last failure", "Next run", "History"],
        r.tasks.map((t) => [
          h("code", { text: t.task }), h("code", { text: t.schedule }),
          badge(!t.enabled ? "disabled" : t.running ? "running" : "idle"),
          fmtTime(t.last_success), fmtTime(t.last_failure), fmtTime(t.next_run),
          t.history.length ? h("details", {}, h("summary", { text: `${t.history.length} latest run(s)` }),
            h("ul", { class: "plain" }, t.history.map((run) => h("li", {},
              badge(run.outcome || "?"), ` ${run.trigger || ""} ${run.summary || ""}`.trimEnd()))))
            : "no runs yet",
        ])));
  }).catch((err) => {
    if (!controller.signal.aborted) replace(body, h("p", { class: "error", text: `${err.code}: ${err.message}` }));
  });
  return () => controller.abort();
}
