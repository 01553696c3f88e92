// DOM helpers. Every string reaches the page as a text node or an attribute value set through
// the DOM: nothing is ever parsed as HTML (no HTML-parsing property or call anywhere in the
// console; tests/gateway/test_console.py checks), so a
// tenant's metadata, URLs, error text or file names always show as text.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "text") el.textContent = String(value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "style" || name === "html") throw new Error(`h(): no ${name} attribute`);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

export function fmtAgo(iso) {
  if (!iso) return "—";
  const s = (Date.now() - new Date(iso).getTime()) / 1000;
  if (!Number.isFinite(s)) return String(iso);
  return `${fmtSeconds(Math.max(0, s))} ago`;
}

export function fmtSeconds(s) {
  if (s === null || s === undefined) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 90) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

export function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

export function badge(status) {
  return h("span", { class: `badge s-${String(status).replace(/[^a-z_]/g, "")}`, text: status });
}

export function table(caption, columns, rows, empty = "Nothing here yet.") {
  if (!rows.length) return h("p", { class: "empty", text: empty });
  return h("div", { class: "scroll" },
    h("table", {},
      h("caption", { class: caption ? "" : "sr-only", text: caption || "table" }),
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", text: c })))),
      h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c) => h("td", {}, c)))))));
}

export function json(value) {
  return h("pre", { class: "json", text: JSON.stringify(value, null, 2) });
}

export function section(title, ...children) {
  const id = `s-${title.toLowerCase().replace(/[^a-z0-9]+/g, "-")}`;
  return h("section", { class: "card", "aria-labelledby": id }, h("h2", { id, text: title }), children);
}

export function toast(message, kind = "info") {
  const box = document.getElementById("toast");
  const item = h("div", { class: `toast t-${kind}`, text: message });
  box.append(item);
  setTimeout(() => item.remove(), 6000);
}

// A modal confirmation (<dialog>: focus moves in, Escape cancels). Resolves true or false.
export function confirmDialog(title, message, confirmLabel, extra = null) {
  return new Promise((resolve) => {
    const dialog = h("dialog", { class: "dialog", "aria-labelledby": "dlg-title" },
      h("form", { method: "dialog" },
        h("h2", { id: "dlg-title", text: title }),
        h("p", { text: message }),
        extra,
        h("div", { class: "actions" },
          h("button", { type: "submit", value: "cancel", class: "secondary", text: "Cancel" }),
          h("button", { type: "submit", value: "ok", class: "danger", text: confirmLabel }))));
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve(dialog.returnValue === "ok");
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

// A secret shown once: a dialog with the value selectable, and a copy button.
export function secretDialog(title, label, secret) {
  return new Promise((resolve) => {
    const value = h("input", { id: "secret-value", readonly: true, value: secret, class: "secret" });
    const dialog = h("dialog", { class: "dialog", "aria-labelledby": "secret-title" },
      h("form", { method: "dialog" },
        h("h2", { id: "secret-title", text: title }),
        h("p", { text: "Shown once: copy it now. The server keeps only its hash." }),
        h("label", { for: "secret-value", text: label }), value,
        h("div", { class: "actions" },
          h("button", { type: "button", class: "secondary", text: "Copy",
            onclick: () => navigator.clipboard?.writeText(secret).then(() => toast("Copied")) }),
          h("button", { type: "submit", text: "Done" }))));
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve();
    });
    document.body.append(dialog);
    dialog.showModal();
    value.select();
  });
}

export function field(id, label, input, hint = null) {
  input.id = id;
  const hintId = hint ? `${id}-hint` : null;
  if (hintId) input.setAttribute("aria-describedby", hintId);
  return h("div", { class: "field" }, h("label", { for: id, text: label }), input,
    hint ? h("small", { id: hintId, text: hint }) : null);
}

export function heading(title, ...extra) {
  return h("div", { class: "page-head" }, h("h1", { tabindex: "-1", text: title }), extra);
}
