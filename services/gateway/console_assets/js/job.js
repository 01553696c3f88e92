// #/jobs/<id>: one job, live. Its 3D result in the viewer (the .spz first, else .splat, else
// .ply; a progressive job's quick result as soon as `preview_ready` says it exists), the
// preview image, the stages as a timeline of waits and runs, its events as they happen, the
// webhook deliveries, the metadata and the error with its code.

import { api, artifact } from "./api.js";
import { badge, confirmDialog, fmtBytes, fmtSeconds, fmtTime, h, heading, json, replace, section,
  table, toast } from "./dom.js";
import { followEvents, isTerminal } from "./sse.js";

// What the viewer loads, best first: the compact .spz, then .splat, then the .ply.
const SCENES = [["spz", "scene.spz"], ["splat", "scene.splat"], ["gaussian_ply", "scene.ply"]];
const STAGES = ["ingest", "reconstruct", "export", "render", "publish"];

function ms(iso) {
  return iso ? new Date(iso).getTime() : null;
}

function timeline(job) {
  const stages = job.stages || {};
  if (!Object.keys(stages).length) {
    return h("p", { class: "empty", text: "This job has no stages (a whole-job worker ran it), or none has started." });
  }
  const start = ms(job.created_at);
  const end = ms(job.completed_at) || Date.now();
  const span = Math.max(end - start, 1);
  let previous = start;
  const rows = STAGES.filter((name) => stages[name]).map((name) => {
    const s = stages[name];
    const began = ms(s.started_at);
    const done = ms(s.finished_at) || (s.status === "running" ? Date.now() : null);
    const waitBar = h("span", { class: "seg wait" });
    const runBar = h("span", { class: `seg run r-${s.status}` });
    let words = s.status;
    if (began) {
      const wait = Math.max(0, began - previous);
      waitBar.style.left = `${((previous - start) / span) * 100}%`;
      waitBar.style.width = `${(wait / span) * 100}%`;
      words = `waited ${fmtSeconds(wait / 1000)}`;
      if (done) {
        runBar.style.left = `${((began - start) / span) * 100}%`;
        runBar.style.width = `${Math.max(((done - began) / span) * 100, 0.5)}%`;
        words += `, ran ${fmtSeconds((done - began) / 1000)}`;
        previous = done;
      }
    }
    return h("li", { class: "stage" },
      h("span", { class: "stage-name", text: name }), badge(s.status),
      h("span", { class: "bar", "aria-hidden": "true" }, waitBar, runBar),
      h("span", { class: "stage-words", text: `${words}${s.attempts > 1 ? ` · ${s.attempts} attempts` : ""}` }),
      s.error ? h("span", { class: "error", text: `${s.error.code}: ${s.error.message}` }) : null);
  });
  return h("ol", { class: "timeline" }, rows);
}

function summary(job) {
  const items = [
    ["Status", badge(job.status)], ["Quality", job.quality], ["Stream", job.stream],
    ["Current stage", job.current_stage || "—"], ["Progress", `${Math.round(job.progress * 100)}%`],
    ["Created", fmtTime(job.created_at)], ["Started", fmtTime(job.started_at)],
    ["Finished", fmtTime(job.completed_at)], ["Attempts", job.attempts],
    ["Compute time", job.compute_time_ms === null ? "—" : fmtSeconds(job.compute_time_ms / 1000)],
    ["Model", job.model || "—"], ["Cached", job.cached ? "yes" : "no"],
  ];
  return h("dl", { class: "facts" }, items.map(([k, v]) => [h("dt", { text: k }), h("dd", {}, v)]));
}

function download(jobId, name, filename, quick) {
  return h("button", { type: "button", class: "secondary", text: filename, onclick: async () => {
    try {
      const blob = await artifact(jobId, name, { quick });
      const url = URL.createObjectURL(blob);
      const a = h("a", { href: url, download: `${jobId}-${quick ? "quick-" : ""}${filename}` });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (err) {
      toast(`${filename}: ${err.message}`, "error");
    }
  } });
}

class SceneView {
  constructor(jobId, signal) {
    this.jobId = jobId;
    this.signal = signal;
    this.canvas = h("canvas", { class: "viewer", tabindex: "0", role: "application",
      "aria-label": "3D view of the result. Drag or arrow keys to orbit, + and - to zoom, R to reset, F to fit.",
      "aria-describedby": "viewer-status", dataset: { state: "empty" } });
    this.status = h("p", { id: "viewer-status", class: "viewer-status", "aria-live": "polite",
      text: "The 3D result appears here once the job has one." });
    this.downloads = h("div", { class: "downloads" });
    const button = (text, act) => h("button", { type: "button", class: "secondary", text, onclick: act });
    this.element = section("3D result",
      h("div", { class: "viewer-wrap" }, this.canvas),
      h("div", { class: "viewer-controls" },
        button("Reset", () => this.viewer?.reset()), button("Fit", () => this.viewer?.fit()),
        button("Zoom in", () => this.viewer?.zoom(1 / 1.25)), button("Zoom out", () => this.viewer?.zoom(1.25)),
        button("Orbit left", () => this.viewer?.orbit(-0.3, 0)),
        button("Orbit right", () => this.viewer?.orbit(0.3, 0))),
      this.status, this.downloads);
    this.shown = null; // "quick" | "full"
  }

  async show(names, quick) {
    const kind = quick ? "quick" : "full";
    if (this.shown === "full" || this.shown === kind || this.loading === kind) return;
    this.loading = kind;
    replace(this.downloads, SCENES.concat([["rendered_preview", "preview.png"]])
      .filter(([name]) => names.includes(name))
      .map(([name, file]) => download(this.jobId, name, file, quick)));
    for (const [name, file] of SCENES.filter(([n]) => names.includes(n))) {
      try {
        this.canvas.dataset.state = "loading";
        this.status.textContent = `Loading ${quick ? "the quick result's " : ""}${file}…`;
        const blob = await artifact(this.jobId, name, { quick, signal: this.signal });
        const cloud = await SplatqFormats.parse(file, await blob.arrayBuffer());
        if (this.signal.aborted || (quick && this.shown === "full")) return;
        if (!this.viewer) this.viewer = SplatqViewer.create(this.canvas, { background: [0.11, 0.12, 0.14] });
        this.viewer.setCloud(cloud);
        this.shown = kind;
        Object.assign(this.canvas.dataset, { state: "ready", format: name, count: cloud.count, variant: kind });
        this.status.textContent = `${quick ? "Quick result" : "Result"}: ${cloud.count.toLocaleString()} Gaussians from ${file} (${fmtBytes(blob.size)}).`;
        this.loading = null;
        return;
      } catch (err) {
        if (this.signal.aborted) return;
        this.canvas.dataset.state = "error";
        this.status.textContent = `${file}: ${err.message}`;
      }
    }
    this.loading = null;
  }

  destroy() {
    this.viewer?.destroy();
  }
}

export function render(main, [jobId]) {
  const controller = new AbortController();
  const signal = controller.signal;
  const scene = new SceneView(jobId, signal);
  const head = h("div");
  const facts = h("div");
  const errorBox = h("div");
  const stages = h("div");
  const preview = h("div", { class: "preview" }, h("p", { class: "empty", text: "No preview yet." }));
  const events = h("ol", { class: "events", "aria-live": "polite" });
  const deliveries = h("div", {}, h("p", { class: "empty", text: "Loading…" }));
  const metadata = h("div");
  let job = null;
  let previewUrl = null;
  let refreshTimer = null;

  replace(main, head,
    h("div", { class: "grid" },
      scene.element,
      section("Details", facts, errorBox),
      section("Stages", stages),
      section("Preview image", preview),
      section("Metadata", metadata)),
    section("Events", events),
    section("Webhook deliveries", deliveries));

  async function showPreview(quick) {
    try {
      const blob = await artifact(jobId, "rendered_preview", { quick, signal });
      if (previewUrl) URL.revokeObjectURL(previewUrl);
      previewUrl = URL.createObjectURL(blob);
      replace(preview, h("img", { src: previewUrl, alt: `Preview rendering of job ${jobId}${quick ? " (quick result)" : ""}` }),
        quick ? h("p", { class: "note", text: "Quick result: the full result replaces it." }) : null);
    } catch (err) {
      if (!signal.aborted) replace(preview, h("p", { class: "error", text: err.message }));
    }
  }

  function paint() {
    replace(head, heading(`Job ${job.id}`, badge(job.status),
      isTerminal(job.status) ? null : h("button", { type: "button", class: "danger", text: "Cancel job",
        onclick: async () => {
          if (!(await confirmDialog("Cancel this job?", `Job ${job.id} stops at its next stage boundary.`, "Cancel job"))) return;
          try {
            await api(`/v1/jobs/${encodeURIComponent(jobId)}/cancel`, { method: "POST" });
            toast("Cancel requested");
            refresh();
          } catch (err) {
            toast(`${err.code}: ${err.message}`, "error");
          }
        } })));
    head.querySelector("h1").dataset.status = job.status;
    replace(facts, summary(job));
    replace(errorBox, job.error
      ? h("div", { class: "problem", role: "alert" }, h("strong", { text: job.error.code }),
        h("span", { text: ` ${job.error.message}` }),
        h("span", { class: "note", text: job.error.retryable ? " (retryable)" : " (permanent)" }))
      : null);
    replace(stages, timeline(job));
    const meta = job.metadata || {};
    replace(metadata, Object.keys(meta).length
      ? [table("Metadata", ["Key", "Value"], Object.entries(meta).map(([k, v]) =>
        [h("code", { text: k }), typeof v === "string" ? v : JSON.stringify(v)])), json(meta)]
      : h("p", { class: "empty", text: "No metadata." }));
    if (job.status === "completed" && job.artifacts) {
      scene.show(Object.keys(job.artifacts), false);
      if (!previewUrl || preview.querySelector(".note")) showPreview(false);
    }
  }

  async function refresh() {
    try {
      job = await api(`/v1/jobs/${encodeURIComponent(jobId)}`, { signal });
      paint();
    } catch (err) {
      if (signal.aborted) return;
      replace(head, heading("Job not found"));
      replace(main, head, h("p", { class: "error", text: err.status === 404
        ? "No such job for this key." : `${err.code}: ${err.message}` }));
      controller.abort();
    }
  }

  function later() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(refresh, 150);
  }

  async function loadDeliveries() {
    try {
      const body = await api(`/v1/jobs/${encodeURIComponent(jobId)}/deliveries`, { signal });
      replace(deliveries, table("Delivery attempts, oldest first",
        ["Event", "Target", "URL", "Attempt", "Outcome", "Status", "Error"],
        body.deliveries.map((d) => [d.event, d.target, h("span", { class: "clip", text: d.url }), d.attempt,
          badge(d.outcome), d.status_code ?? "—", d.error || ""]), "No webhook deliveries for this job."));
    } catch (err) {
      if (!signal.aborted) replace(deliveries, h("p", { class: "error", text: err.message }));
    }
  }

  refresh().then(() => {
    if (signal.aborted) return;
    followEvents(jobId, (name, payload, id) => {
      const data = payload.data || {};
      const kind = name.split(".").pop();
      const detail = Object.entries(data).filter(([k]) => !["job_id", "metadata", "artifacts"].includes(k))
        .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
      const when = payload.timestamp ? new Date(payload.timestamp * 1000).toLocaleTimeString() : "";
      events.append(h("li", { dataset: { event: kind, id } }, h("span", { class: "when", text: when }),
        badge(kind), h("span", { class: "detail", text: detail })));
      if (kind === "preview_ready" && job?.status !== "completed") {
        scene.show(Object.keys(data.artifacts || {}), true);
        showPreview(true);
      }
      if (kind !== "progress" || data.stage_status) later();
      if (isTerminal(kind)) loadDeliveries();
    }, signal).catch((err) => {
      if (!signal.aborted) events.append(h("li", { class: "error", text: `events: ${err.message}` }));
    });
    loadDeliveries();
  });

  return () => {
    controller.abort();
    clearTimeout(refreshTimer);
    scene.destroy();
    if (previewUrl) URL.revokeObjectURL(previewUrl);
  };
}
