"""The web console at /console: static files shipped inside the package (console_assets/),
served under a strict Content-Security-Policy; `/` leads there.

The console is a client of the public HTTP API only (docs/console.md): the page holds no
data and no key; the browser keeps the key the user signs in with in sessionStorage and sends
it as `Authorization`. Scripts and styles come from this origin only, never inline; pictures
may be `blob:` URLs (artifacts fetched with the key) and `data:` (none are built from tenant
strings). The files are read once, at startup, from an allowlist: nothing else is served.
"""

from __future__ import annotations

from importlib import resources
from urllib.parse import urlsplit

from aiohttp import web

from splatq.services.gateway.appkeys import SETTINGS
from splatq.services.gateway.problems import not_found
from splatq.shared.settings import Settings

ASSETS_PACKAGE = "splatq.services.gateway"
ASSETS_DIR = "console_assets"
CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".txt": "text/plain",
}
CONSOLE_FILES = web.AppKey("console_files", dict)


def content_security_policy(settings: Settings) -> str:
    """No inline script or style, nothing from elsewhere; `connect-src` adds the object
    store's origin when artifacts are served by presigned URLs (S3)."""
    connect = ["'self'"]
    if settings.storage_url.startswith("s3://"):
        endpoint = urlsplit(settings.s3_endpoint_url) if settings.s3_endpoint_url else None
        if endpoint is not None and endpoint.scheme and endpoint.netloc:
            connect.append(f"{endpoint.scheme}://{endpoint.netloc}")
        else:
            connect.append("https://*.amazonaws.com")
    return (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
        f"connect-src {' '.join(connect)}; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


def load_assets() -> dict[str, tuple[bytes, str]]:
    """Every file under console_assets/ with a known type: relative path -> (bytes, type)."""
    root = resources.files(ASSETS_PACKAGE).joinpath(ASSETS_DIR)
    out: dict[str, tuple[bytes, str]] = {}
    pending = [("", root)]
    while pending:
        prefix, folder = pending.pop()
        for entry in folder.iterdir():
            name = f"{prefix}{entry.name}"
            if entry.is_dir():
                pending.append((f"{name}/", entry))
                continue
            suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
            if suffix in CONTENT_TYPES:
                out[name] = (entry.read_bytes(), CONTENT_TYPES[suffix])
    return out


def add_console_routes(app: web.Application) -> None:
    app[CONSOLE_FILES] = load_assets()
    app.router.add_get("/", root)
    app.router.add_get("/console", console_page)
    app.router.add_get("/console/{path:[A-Za-z0-9_./-]+}", console_asset)


def _headers(request: web.Request) -> dict[str, str]:
    return {
        "Content-Security-Policy": content_security_policy(request.app[SETTINGS]),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        # Revalidated on every load: a new version of the console is picked up at once.
        "Cache-Control": "no-cache",
    }


def _file(request: web.Request, path: str) -> web.Response:
    found = request.app[CONSOLE_FILES].get(path)
    if found is None or ".." in path.split("/"):
        raise not_found("console file")
    body, content_type = found
    return web.Response(
        body=body, content_type=content_type, charset="utf-8", headers=_headers(request)
    )


async def root(request: web.Request) -> web.Response:
    """`/` leads to the console."""
    return web.Response(status=302, headers={"Location": "/console"})


async def console_page(request: web.Request) -> web.Response:
    return _file(request, "index.html")


async def console_asset(request: web.Request) -> web.Response:
    return _file(request, request.match_info["path"])
