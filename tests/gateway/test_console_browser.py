"""The web console in a real browser (Debian's headless Chromium through Playwright, WebGL on
SwiftShader) against a real stack: the gateway on loopback HTTP, the 3DGS stage handlers in
in-process staged workers (builtin model, CPU), the session's redis-server.

A tenant signs in, submits the bundled sample with metadata that tries to inject a script,
watches the job go from `queued` to `completed` live (no reload: the event stream), and
orbits the result in the viewer: the canvas is not blank and dragging changes the picture.
The metadata shows as text; another tenant cannot reach the job; the admin key is never
sent from a tenant's page. An operator redrives a dead-lettered job after a confirmation.
Every page passes an axe-core scan with no serious or critical violation. Screenshots go to
docs/img/ (the README links them) with SPLATQ_UPDATE_SCREENSHOTS=1, else to a temporary
folder.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from redis.asyncio import Redis

from splatq.services.gateway.local_viewer import write_local_viewer
from splatq.services.stack import BUNDLED_SAMPLE
from splatq.shared.engine.queue import JobQueue
from splatq.shared.testing import StagesFactory, WorkerFactory, eventually
from tests.gateway.conftest import KEY_A, KEY_B, ClientFactory
from tests.gateway.test_admin_ops import dead_letter_a_job
from tests.helpers import REPO_ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# WebGL without a GPU: ANGLE on SwiftShader
BROWSER_ARGS = ["--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist"]
AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
# The screenshots docs/ shows are refreshed on request only (a test run leaves the tree clean):
# SPLATQ_UPDATE_SCREENSHOTS=1 .venv/bin/pytest tests/gateway/test_console_browser.py
SHOTS = (
    REPO_ROOT / "docs" / "img"
    if os.environ.get("SPLATQ_UPDATE_SCREENSHOTS") == "1"
    else Path(tempfile.gettempdir()) / "splatq-console-screenshots"
)
ADMIN_KEY = "admin-console-key-0123456789-abcdefghijk"
LAPTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
INJECTION = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
# A canvas showing a scene has many grey levels; a blank one has one.
MIN_VARIANCE = 100.0
MIN_ORBIT_CHANGE = 2.0  # mean absolute change in grey levels after a drag


HAVE_CHROMIUM = Path(CHROMIUM).exists()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    if not HAVE_CHROMIUM:
        pytest.skip("no Chromium: `make chromium` installs Debian's (the console tests need it)")
    from playwright.async_api import async_playwright  # noqa: PLC0415

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS
        )
        yield launched
        await launched.close()


class Tab:
    """A page in its own context (its own sessionStorage), recording every request's
    Authorization header and every script error or policy refusal."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.errors: list[str] = []
        self.auth: list[tuple[str, str]] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("request", lambda r: self.auth.append((r.url, r.headers.get("authorization", ""))))

    def _console(self, message: Any) -> None:
        # a refused request (a 404 for another tenant's job) logs a resource error: expected
        if message.type == "error" and "Failed to load resource" not in message.text:
            self.errors.append(message.text)

    async def sign_in(self, key: str, role: str = "tenant") -> None:
        await self.page.goto(f"{self.base}/")  # / leads to /console
        assert self.page.url.endswith("/console")
        await self.page.locator(f"input[name=role][value={role}]").check()
        await self.page.locator("#signin-key").fill(key)
        await self.page.get_by_role("button", name="Sign in").click()
        await self.page.wait_for_selector("#nav a[aria-current=page]")

    async def go(self, fragment: str) -> None:
        await self.page.evaluate("(f) => { location.hash = f; }", fragment)

    async def shot(self, name: str, full_page: bool = True) -> None:
        """A screenshot for docs/img/, without the passing notices and the focus ring."""
        await self.page.evaluate(
            "document.getElementById('toast').replaceChildren(); document.activeElement?.blur()"
        )
        SHOTS.mkdir(parents=True, exist_ok=True)
        await self.page.screenshot(path=str(SHOTS / name), full_page=full_page)

    async def axe(self, label: str) -> None:
        """No serious or critical axe-core violation on the current page."""
        if not await self.page.evaluate("typeof window.axe !== 'undefined'"):
            await self.page.evaluate(AXE.read_text(encoding="utf-8"))
        result = await self.page.evaluate(
            "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
            ".map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.target.join(' '))"
            ".slice(0, 3)}))"
        )
        bad = [v for v in result if v["impact"] in {"serious", "critical"}]
        assert bad == [], f"{label}: {bad}"


async def new_tab(browser: Any, base: str, viewport: dict[str, int] = LAPTOP, **kw: Any) -> Tab:
    context = await browser.new_context(viewport=viewport, **kw)
    return Tab(await context.new_page(), base)


async def settled(locator: Any, tries: int = 40) -> bytes:
    """A screenshot once two in a row agree (the viewer draws on animation frames)."""
    previous = await locator.screenshot()
    for _ in range(tries):
        await asyncio.sleep(0.15)
        current = await locator.screenshot()
        if current == previous:
            return bytes(current)
        previous = current
    raise AssertionError("the picture never settled")


def grey(png: bytes) -> Any:
    return np.asarray(Image.open(BytesIO(png)).convert("L"), dtype=np.float64)


async def test_a_tenant_submits_watches_it_live_and_orbits_the_result(
    browser: Any,
    make_client: ClientFactory,
    stage_handlers: Any,
    start_stages: StagesFactory,
) -> None:
    client = await make_client(admin_api_key=ADMIN_KEY)
    base = str(client.make_url("")).rstrip("/")
    tab = await new_tab(browser, base, color_scheme="dark")
    page = tab.page
    await tab.sign_in(KEY_A)
    assert await page.locator("#who").inner_text() == "Tenant: acme"

    await tab.go("#/submit")
    await page.locator("#submit-file").set_input_files(str(BUNDLED_SAMPLE))
    await page.locator("#submit-quality").select_option("preview")
    await page.locator("#submit-metadata").fill(f'{{"note": "{INJECTION.replace(chr(34), "&")}"}}')
    await tab.axe("submit page")
    await page.get_by_role("button", name="Submit").click()
    await page.wait_for_url("**/console#/jobs/job_*")
    job_id = page.url.rsplit("/", 1)[1]
    await page.wait_for_selector("h1[data-status=queued]")  # no worker yet

    await start_stages(stage_handlers, "all")  # now the job runs; the page only listens
    await page.wait_for_selector("h1[data-status=completed]", timeout=90_000)
    await page.wait_for_selector("ol.events li[data-event=completed]")
    canvas = page.locator("canvas.viewer[data-state=ready]")
    await canvas.wait_for(timeout=30_000)
    assert await canvas.get_attribute("data-format") == "spz"  # the compact artifact first
    assert await page.locator("ol.timeline li.stage").count() == 5
    await page.wait_for_function("document.querySelector('.preview img')?.naturalWidth === 128")

    front = grey(await settled(canvas))
    assert front.var() > MIN_VARIANCE, f"blank canvas (variance {front.var():.1f})"
    box = await canvas.bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    await page.mouse.move(cx, cy)
    await page.mouse.down()
    await page.mouse.move(cx + 140, cy + 30, steps=8)
    await page.mouse.up()
    turned = grey(await settled(canvas))
    assert np.abs(turned - front).mean() > MIN_ORBIT_CHANGE, "dragging did not orbit"
    await canvas.focus()
    await page.keyboard.press("r")  # reset: the front view again
    again = grey(await settled(canvas))
    assert np.abs(again - front).mean() < np.abs(turned - front).mean() / 4

    # The metadata is text: shown as written, nothing of it ran or was parsed.
    note = INJECTION.replace('"', "&")
    assert note in await page.locator("pre.json").inner_text()
    assert await page.evaluate("window.__pwned") is None
    assert await page.locator("main script, main img[src=x]").count() == 0
    await tab.axe("job page")
    await tab.shot("console-job.png")

    await tab.go("#/jobs")
    row = page.locator("tr", has=page.locator(f"a[href='#/jobs/{job_id}']"))
    await row.locator(".badge.s-completed").wait_for()
    await tab.axe("jobs page")
    await tab.shot("console-jobs.png", full_page=False)
    await tab.go("#/usage")
    await page.wait_for_selector("dl.facts")
    await tab.axe("usage page")
    await tab.go("#/webhooks")
    await page.wait_for_selector("text=No endpoints registered.")
    await tab.axe("webhooks page")

    phone = await new_tab(
        browser, base, PHONE, color_scheme="light", is_mobile=True, has_touch=True
    )
    await phone.sign_in(KEY_A)
    await phone.go(f"#/jobs/{job_id}")
    await phone.page.wait_for_selector("canvas.viewer[data-state=ready]")
    await settled(phone.page.locator("canvas.viewer"))
    width = await phone.page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the phone layout scrolls sideways ({width} px)"
    await phone.shot("console-job-phone.png", full_page=False)

    # Another tenant: the job is not theirs, not listed, not shown.
    other = await new_tab(browser, base)
    await other.sign_in(KEY_B)
    await other.page.wait_for_selector("table, p.empty")
    assert await other.page.locator(f"a[href='#/jobs/{job_id}']").count() == 0
    await other.go(f"#/jobs/{job_id}")
    await other.page.wait_for_selector("h1:text('Job not found')")

    # The tenant's pages sent the tenant's own key, and never to the admin API.
    for t, key in ((tab, KEY_A), (phone, KEY_A), (other, KEY_B)):
        sent = [(u, a) for u, a in t.auth if a]
        assert sent, "no authenticated request"
        assert all(a == f"Bearer {key}" for _, a in sent)
        assert not any("/v1/admin/" in u for u, _ in t.auth)
        assert t.errors == []


async def test_an_operator_redrives_a_dead_letter(
    browser: Any,
    make_client: ClientFactory,
    queue: JobQueue,
    redis: Redis,
    start_worker: WorkerFactory,
) -> None:
    client = await make_client(admin_api_key=ADMIN_KEY)
    base = str(client.make_url("")).rstrip("/")
    job_id = await dead_letter_a_job(queue, redis)
    [letter] = await queue.dead_letters(0)
    await start_worker()  # a live worker process for the workers page (and the redriven job)
    tab = await new_tab(browser, base)
    page = tab.page
    await tab.sign_in(ADMIN_KEY, "operator")
    assert await page.locator("#who").inner_text() == "Operator: operator"
    await page.wait_for_selector("text=Throughput, last 5 minutes")
    await tab.axe("streams page")
    await tab.shot("console-ops-streams.png")

    await tab.go("#/ops/workers")
    await page.wait_for_selector("td .badge.s-alive")
    await tab.axe("workers page")
    await tab.go("#/ops/tasks")
    await page.wait_for_selector("code:text('retention')")
    await tab.axe("tasks page")
    await tab.go("#/ops/tenants")
    await page.wait_for_selector("h2:text('Create a tenant')")
    await tab.axe("tenants page")
    await page.locator("#tenant-name").fill("zeta")
    await page.get_by_role("button", name="Create", exact=True).click()
    await page.wait_for_selector("h1:text('Tenant zeta')")
    await page.locator("#t-key-label").fill("ci")
    await page.get_by_role("button", name="Create a key").click()
    secret = await page.locator("dialog[open] input.secret").input_value()
    assert secret.startswith("sq_")
    await tab.axe("new key dialog")
    await page.locator("dialog[open]").get_by_role("button", name="Done").click()
    await page.wait_for_selector("td:text('ci')")
    assert secret not in await page.content()  # shown once, then gone

    await tab.go("#/ops/dead-letters")
    await page.get_by_role("link", name=letter.id).click()
    await page.wait_for_selector("h2:text('Death log')")
    assert job_id in await page.locator("main").inner_text()
    await tab.axe("dead letter page")
    await tab.shot("console-dead-letter.png")
    await page.get_by_role("button", name="Redrive").click()
    dialog = page.locator("dialog[open]")
    await dialog.wait_for()
    await tab.axe("confirmation dialog")
    await dialog.get_by_role("button", name="Redrive").click()
    await page.wait_for_selector("text=No dead letters. Good.")

    async def redriven() -> bool:
        job = await queue.get(job_id)
        return job is not None and job.status == "completed"

    await eventually(redriven, timeout=30)
    assert await queue.dead_letters(0) == []
    assert not any("/v1/admin/" not in u for u, a in tab.auth if a)  # the admin key: admin only
    assert tab.errors == []


async def test_the_local_viewer_opens_from_disk(browser: Any, tmp_path: Path) -> None:
    """`make demo`'s viewer.html: opened as a file (no server), it shows the embedded .spz."""
    from splatq.services.gpu_worker.spz import to_spz_bytes  # noqa: PLC0415 - torch
    from tests.gpu_worker.test_formats import random_gaussians  # noqa: PLC0415

    page_path = write_local_viewer(tmp_path, "scene.spz", to_spz_bytes(random_gaussians(3000)))
    assert page_path == tmp_path / "viewer.html"
    tab = await new_tab(browser, "")
    await tab.page.goto(page_path.as_uri())
    canvas = tab.page.locator("canvas[data-state=ready]")
    await canvas.wait_for()
    assert await canvas.get_attribute("data-count") == "3000"
    assert grey(await settled(canvas)).var() > MIN_VARIANCE
    assert tab.errors == []


def _two_layers(blue_first: bool) -> bytes:
    """A red and a blue layer of opaque splats 5e-6 apart in depth (blue nearer), in a scene
    1 unit deep: a 16-bit depth sort ties them and draws them in file order."""
    import torch  # noqa: PLC0415 - the worker extra

    from splatq.services.gpu_worker.formats import to_ply_bytes  # noqa: PLC0415
    from splatq.services.gpu_worker.gaussians import Gaussians  # noqa: PLC0415

    side = torch.linspace(-0.3, 0.3, 12)
    grid = torch.stack(torch.meshgrid(side, side, indexing="ij"), -1).reshape(-1, 2)
    n = len(grid)
    red = torch.cat([grid, torch.full((n, 1), 2.0)], 1)
    blue = torch.cat([grid, torch.full((n, 1), 2.0 - 5e-6)], 1)
    far = torch.tensor([[3.0, 0.0, 1.5], [-3.0, 0.0, 2.5]])  # out of view; depth range 1 unit
    layers = [blue, red] if blue_first else [red, blue]
    means = torch.cat([*layers, far])
    colours = {"red": [1.8, -1.8, -1.8], "blue": [-1.8, -1.8, 1.8]}
    order = ["blue", "red"] if blue_first else ["red", "blue"]
    dc = torch.tensor([colours[order[0]]] * n + [colours[order[1]]] * n + [[0.0] * 3] * 2)
    count = len(means)
    return to_ply_bytes(
        Gaussians(
            means,
            torch.full((count, 3), -3.0),
            torch.tensor([[1.0, 0, 0, 0]] * count),
            torch.full((count,), 6.0),
            dc,
        )
    )


async def test_the_picture_does_not_depend_on_the_files_row_order(
    browser: Any, tmp_path: Path
) -> None:
    """Splats at nearly one depth are drawn in depth order, not in file order: the same scene
    with its rows in two orders gives the same picture (the nearer blue layer on top)."""
    shots = []
    for blue_first in (False, True):
        folder = tmp_path / str(blue_first)
        page_path = write_local_viewer(folder, "scene.ply", _two_layers(blue_first))
        tab = await new_tab(browser, "")
        await tab.page.goto(page_path.as_uri())
        canvas = tab.page.locator("canvas[data-state=ready]")
        await canvas.wait_for()
        picture = np.asarray(Image.open(BytesIO(await settled(canvas))).convert("RGB"))
        shots.append(picture.astype(np.float64))
        assert tab.errors == []
    centre = [s[s.shape[0] // 2, s.shape[1] // 2] for s in shots]
    assert all(c[2] > c[0] + 100 for c in centre), centre  # blue on top in both
    assert np.abs(shots[0] - shots[1]).mean() < 0.5
