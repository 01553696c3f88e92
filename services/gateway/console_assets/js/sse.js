// A job's Server-Sent Events (GET /v1/jobs/{id}/events) read with fetch(), because
// EventSource cannot send an Authorization header. Reconnects with Last-Event-ID after a
// dropped connection; ends after the terminal event or when `signal` aborts.

import { api } from "./api.js";

const TERMINAL = new Set(["completed", "failed", "canceled"].map((s) => `3d_reconstruction.${s}`));

function parseBlock(block) {
  const event = { id: null, name: "message", data: "" };
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") event.id = value;
    else if (field === "event") event.name = value;
    else if (field === "data") event.data += (event.data ? "\n" : "") + value;
  }
  return event.data ? event : null;
}

export async function followEvents(jobId, onEvent, signal) {
  let lastId = null;
  let failures = 0;
  while (!signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const response = await api(`/v1/jobs/${encodeURIComponent(jobId)}/events`,
        { raw: true, signal, headers });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = parseBlock(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
          if (!event) continue;
          lastId = event.id || lastId;
          failures = 0;
          let payload = {};
          try {
            payload = JSON.parse(event.data);
          } catch {
            payload = { raw: event.data };
          }
          onEvent(event.name, payload, event.id);
          if (TERMINAL.has(event.name)) return;
        }
      }
    } catch (err) {
      if (signal.aborted) return;
      if (err.status && err.status !== 429 && err.status < 500) throw err;
    }
    failures += 1;
    await new Promise((resolve) => setTimeout(resolve, Math.min(10000, 500 * 2 ** failures)));
  }
}

export const isTerminal = (status) => ["completed", "failed", "canceled"].includes(status);
