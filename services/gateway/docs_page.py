"""GET /docs: the OpenAPI document rendered as one self-contained HTML page.

No script and no external resource (the gateway may run where nothing outside is reachable,
and a strict Content-Security-Policy allows only the page's own inline style): operations
grouped by tag, each with its parameters, request body and responses, then the webhook events
with their payload fields and an example. Pure: the document in, HTML out.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
_METHODS = ("get", "post", "put", "patch", "delete")
_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;margin:0 auto;max-width:60rem;padding:1rem 2rem;
color:#1d2330}
h1{margin-bottom:.2rem}h2{border-bottom:2px solid #d8dce6;padding-top:1rem}
section.op{border:1px solid #d8dce6;border-radius:6px;margin:1rem 0;padding:.4rem 1rem}
.method{display:inline-block;min-width:4.2rem;font-weight:700;text-transform:uppercase}
.get{color:#1769aa}.post{color:#2e7d32}.patch{color:#8a5a00}.delete{color:#b3261e}
code,pre{font-family:ui-monospace,monospace;font-size:13px}
pre{background:#f4f6fa;padding:.6rem;overflow-x:auto;border-radius:4px}
table{border-collapse:collapse;margin:.4rem 0}td,th{border:1px solid #d8dce6;padding:.2rem .5rem;
text-align:left;vertical-align:top}
nav a{margin-right:1rem}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table(columns: Iterable[str], rows: str) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    return f"<table><tr>{head}</tr>{rows}</table>"


def _pre(value: object) -> str:
    return f"<pre>{_e(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())}</pre>"


def _anchor(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _type(schema: Mapping[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "const" in schema:
        return f"const {schema['const']}"
    kind = schema.get("type", "")
    shown = " | ".join(kind) if isinstance(kind, list) else str(kind)
    if "enum" in schema:
        shown += " (" + ", ".join(map(str, schema["enum"])) + ")"
    if schema.get("format"):
        shown += f", {schema['format']}"
    return shown or "any"


def _parameters(params: Iterable[Mapping[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td><code>{_e(p['name'])}</code></td><td>{_e(p['in'])}</td>"
        f"<td>{_e(_type(p.get('schema', {})))}</td><td>{'yes' if p.get('required') else ''}"
        f"</td><td>{_e(p.get('description', ''))}</td></tr>"
        for p in params
    )
    if not rows:
        return ""
    return "<h4>Parameters</h4>" + _table(("name", "in", "type", "required", "about"), rows)


def _fields(schema: Mapping[str, Any]) -> str:
    props = schema.get("properties") or {}
    if not props:
        return ""
    required = set(schema.get("required", []))
    rows = "".join(
        f"<tr><td><code>{_e(name)}</code></td><td>{_e(_type(sub))}</td>"
        f"<td>{'yes' if name in required else ''}</td>"
        f"<td>{_e(sub.get('description', ''))}</td></tr>"
        for name, sub in props.items()
    )
    return _table(("field", "type", "required", "about"), rows)


def _body(body: Mapping[str, Any]) -> str:
    parts = ["<h4>Request body</h4>"]
    for media, content in body.get("content", {}).items():
        parts.append(f"<p><code>{_e(media)}</code></p>")
        parts.append(_fields(content.get("schema", {})))
        for name, example in (content.get("examples") or {}).items():
            parts.append(f"<p>Example: {_e(example.get('summary', name))}</p>")
            parts.append(_pre(example["value"]))
    return "".join(parts)


def _responses(responses: Mapping[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{_e(status)}</td><td>{_e(r.get('description', ''))}</td>"
        f"<td>{_e(', '.join(r.get('content', {})))}</td></tr>"
        for status, r in sorted(responses.items())
    )
    return "<h4>Responses</h4>" + _table(("status", "meaning", "type"), rows)


def _operation(path: str, method: str, op: Mapping[str, Any]) -> str:
    op_id = str(op.get("operationId", f"{method}-{path}"))
    return "".join(
        [
            f'<section class="op" id="{_e(_anchor(op_id))}">',
            f'<h3><span class="method {_e(method)}">{_e(method)}</span> ',
            f"<code>{_e(path)}</code></h3>",
            f"<p><strong>{_e(op.get('summary', ''))}</strong></p>",
            f"<p>{_e(op.get('description', ''))}</p>" if op.get("description") else "",
            _parameters(op.get("parameters", [])),
            _body(op["requestBody"]) if "requestBody" in op else "",
            _responses(op.get("responses", {})),
            "</section>",
        ]
    )


def _webhook(name: str, item: Mapping[str, Any], schemas: Mapping[str, Any]) -> str:
    op = item["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = schemas[ref.rsplit("/", 1)[-1]]
    data = schema["properties"]["data"]
    examples = "".join(_pre(x) for x in schema.get("examples", []))
    return (
        f'<section class="op" id="{_e(_anchor(name))}"><h3><code>{_e(name)}</code></h3>'
        f"<p>{_e(op.get('summary', ''))}</p><h4><code>data</code></h4>{_fields(data)}"
        f"{examples}</section>"
    )


def render(doc: Mapping[str, Any]) -> str:
    """The page for one OpenAPI document."""
    info = doc.get("info", {})
    by_tag: dict[str, list[str]] = {t["name"]: [] for t in doc.get("tags", [])}
    for path, item in doc.get("paths", {}).items():
        for method in _METHODS:
            if method in item:
                tag = (item[method].get("tags") or ["Other"])[0]
                by_tag.setdefault(tag, []).append(_operation(path, method, item[method]))
    nav = "".join(f'<a href="#{_e(_anchor(t))}">{_e(t)}</a>' for t in by_tag)
    tags = {t["name"]: t.get("description", "") for t in doc.get("tags", [])}
    sections = "".join(
        f'<h2 id="{_e(_anchor(tag))}">{_e(tag)}</h2><p>{_e(tags.get(tag, ""))}</p>{"".join(ops)}'
        for tag, ops in by_tag.items()
    )
    schemas = doc.get("components", {}).get("schemas", {})
    hooks = "".join(_webhook(n, i, schemas) for n, i in doc.get("webhooks", {}).items())
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(info.get('title', 'API'))} API reference</title><style>{_STYLE}</style>"
        f"</head><body><h1>{_e(info.get('title', 'API'))} API</h1>"
        f"<p>Version {_e(info.get('version', ''))} · OpenAPI {_e(doc.get('openapi', ''))} · "
        '<a href="/openapi.json">openapi.json</a></p>'
        f"<p>{_e(info.get('description', ''))}</p><nav>{nav}"
        '<a href="#webhook-events">Webhook events</a></nav>'
        f'{sections}<h2 id="webhook-events">Webhook events</h2>'
        "<p>What a receiver gets (the same payloads are the SSE <code>data:</code>).</p>"
        f"{hooks}</body></html>"
    )
