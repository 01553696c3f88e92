// #/ops: every stream and stage (depth, queued in the fair queues, ready, running, the oldest
// waiting age), throughput over the last minutes and dead-letter depths, from
// GET /v1/admin/stats, refreshed every few seconds.

import { api } from "./api.js";
import { fmtSeconds, fmtTime, h, heading, replace, section, table } from "./dom.js";

const REFRESH_MS = 3000;

// One row per stage and class: the sums over partitions (the oldest age is their maximum).
export function byStage(rows) {
  const out = new Map();
  for (const r of rows) {
    const key = `${r.stage}:${r.stream}`;
    const s = out.get(key) || { stage: r.stage, stream: r.stream, depth: 0, queued: 0, ready: 0,
      running: 0, consumers: 0, oldest: null, delayed: 0 };
    s.depth += r.depth;
    s.queued += r.queued;
    s.ready += r.ready ?? 0;
    s.running += r.running;
    s.consumers += r.consumers;
    s.delayed += r.delayed;
    if (r.oldest_waiting_s !== null) s.oldest = Math.max(s.oldest ?? 0, r.oldest_waiting_s);
    out.set(key, s);
  }
  return [...out.values()];
}

export function render(main) {
  const controller = new AbortController();
  let timer = null;
  let paused = false;
  const body = h("div", { "aria-busy": "true" }, h("p", { text: "Loading…" }));
  const stamp = h("p", { class: "note", "aria-live": "off" });
  const pause = h("button", { type: "button", class: "secondary", text: "Pause", "aria-pressed": "false",
    onclick: () => {
      paused = !paused;
      pause.textContent = paused ? "Resume" : "Pause";
      pause.setAttribute("aria-pressed", String(paused));
      if (!paused) load();
    } });
  replace(main, heading("Streams and stages", pause), stamp, body);

  async function load() {
    clearTimeout(timer);
    try {
      const s = await api("/v1/admin/stats", { signal: controller.signal });
      stamp.textContent = `As of ${fmtTime(s.generated_at)} · ${s.partitions} partition(s)`;
      const stages = byStage(s.streams);
      const t = s.throughput;
      replace(body,
        section("Stages",
          table("Per stage and class, summed over partitions",
            ["Stage", "Class", "Queued (fair)", "Ready", "Running", "Oldest waiting", "Depth", "Consumers", "Retries due later"],
            stages.map((r) => [r.stage, r.stream, r.queued, r.ready, r.running, fmtSeconds(r.oldest), r.depth,
              r.consumers, r.delayed]))),
        section(`Throughput, last ${t.window_s / 60} minutes`,
          table("Stage successes", ["Stage", "Succeeded", "Per minute"],
            t.stages.map((r) => [r.stage, r.succeeded, r.per_minute])),
          h("p", { text: `Jobs: ${t.jobs.completed} completed, ${t.jobs.failed} failed, ${t.jobs.canceled} canceled${t.truncated ? " (window truncated)" : ""}.` })),
        section("Dead letters",
          h("p", {}, h("a", { href: "#/ops/dead-letters/jobs", text: `${s.dead_letters.jobs} dead-lettered job(s)` }),
            " · ", h("a", { href: "#/ops/dead-letters/webhooks", text: `${s.dead_letters.webhooks} dead-lettered webhook message(s)` }))),
        section("Per partition",
          table("Every partition's streams", ["Partition", "Stage", "Class", "Queued", "Ready", "Running", "Oldest waiting", "Depth"],
            s.streams.map((r) => [r.partition, r.stage, r.stream, r.queued, r.ready ?? "?", r.running,
              fmtSeconds(r.oldest_waiting_s), r.depth]))));
      body.setAttribute("aria-busy", "false");
    } catch (err) {
      if (controller.signal.aborted) return;
      replace(body, h("p", { class: "error", text: `${err.code}: ${err.message}` }));
    }
    if (!paused && !controller.signal.aborted) timer = setTimeout(load, REFRESH_MS);
  }
  load();
  return () => {
    controller.abort();
    clearTimeout(timer);
  };
}
