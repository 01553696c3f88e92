// #/submit: an image by drag-and-drop (or the file picker) or by URL, with its parameters,
// sent as POST /v1/jobs (multipart: `image` or `image_url`, and `params` as JSON).

import { api } from "./api.js";
import { field, fmtBytes, h, heading, replace, toast } from "./dom.js";

const EVENTS = ["queued", "started", "progress", "preview_ready", "completed", "failed", "canceled"]
  .map((e) => `3d_reconstruction.${e}`);

function params(form) {
  const out = { quality: form.quality.value, cache: form.cache.checked, progressive: form.progressive.checked };
  const url = form.webhook_url.value.trim();
  if (url) {
    out.webhook_url = url;
    const picked = [...form.querySelectorAll("input[name=webhook_events]:checked")].map((e) => e.value);
    if (picked.length) out.webhook_events = picked;
  }
  const meta = form.metadata.value.trim();
  if (meta) {
    const parsed = JSON.parse(meta);
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
      throw new Error("metadata must be a JSON object");
    }
    out.metadata = parsed;
  }
  return out;
}

export function render(main) {
  let file = null;
  const picker = h("input", { type: "file", accept: "image/png,image/jpeg,image/webp", name: "image" });
  const chosen = h("p", { class: "chosen", "aria-live": "polite", text: "No image chosen." });
  const zone = h("div", { class: "dropzone" },
    h("p", { text: "Drop an image here, or" }),
    field("submit-file", "choose a file", picker),
    chosen);
  function choose(f) {
    file = f;
    chosen.textContent = f ? `${f.name} (${fmtBytes(f.size)})` : "No image chosen.";
  }
  picker.addEventListener("change", () => choose(picker.files[0] || null));
  zone.addEventListener("dragover", (e) => {
    e.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    if (e.dataTransfer.files.length) choose(e.dataTransfer.files[0]);
  });

  const error = h("p", { class: "error", role: "alert" });
  const form = h("form", { class: "card submit-form" },
    zone,
    field("submit-url", "…or an image URL (fetched by the gateway)",
      h("input", { type: "url", name: "image_url", placeholder: "https://…", inputmode: "url" })),
    h("div", { class: "row" },
      field("submit-quality", "Quality", h("select", { name: "quality" },
        h("option", { value: "preview", text: "preview (fast)" }),
        h("option", { value: "full", text: "full" }))),
      h("label", { class: "check" }, h("input", { type: "checkbox", name: "progressive" }),
        " progressive (a quick result first)"),
      h("label", { class: "check" }, h("input", { type: "checkbox", name: "cache", checked: true }),
        " reuse an identical finished job")),
    field("submit-webhook", "Webhook URL (optional)",
      h("input", { type: "url", name: "webhook_url", placeholder: "https://…" })),
    h("fieldset", { class: "events" }, h("legend", { text: "Webhook events (none chosen: all)" }),
      EVENTS.map((e) => h("label", { class: "check" },
        h("input", { type: "checkbox", name: "webhook_events", value: e }), ` ${e.split(".")[1]}`))),
    field("submit-metadata", "Metadata (a JSON object, optional)",
      h("textarea", { name: "metadata", rows: 3, placeholder: '{"order": "A-17"}', spellcheck: "false" })),
    error,
    h("button", { type: "submit", text: "Submit" }));

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.textContent = "";
    const url = form.image_url.value.trim();
    if (!file && !url) {
      error.textContent = "Choose an image or give its URL.";
      return;
    }
    const body = new FormData();
    try {
      body.append("params", JSON.stringify(params(form)));
    } catch (err) {
      error.textContent = `Metadata: ${err.message}`;
      return;
    }
    if (file) body.append("image", file, file.name);
    else body.append("image_url", url);
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      const created = await api("/v1/jobs", { method: "POST", form: body });
      toast(`Submitted: ${created.id}`);
      location.hash = `#/jobs/${encodeURIComponent(created.id)}`;
    } catch (err) {
      error.textContent = `${err.code}: ${err.message}`;
    } finally {
      button.disabled = false;
    }
  });
  replace(main, heading("Submit an image"), form);
}
