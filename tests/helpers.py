"""This repository's test-only helpers (the reusable ones are in `splatq.shared.testing`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splatq.shared.engine.jobs import JobSpec
from splatq.shared.settings import Settings

if TYPE_CHECKING:
    from splatq.services.gpu_worker.handler import GpuJobHandler

REPO_ROOT = Path(__file__).resolve().parent.parent

# The `gpu_handler_factory` fixture's type (tests/conftest.py).
GpuHandlerFactory = Callable[[Settings], Awaitable["GpuJobHandler"]]


def spec(quality: str = "preview", **metadata: Any) -> JobSpec:
    """A job of the tests' usual tenant, `acme`; `metadata` steers tests.handlers."""
    return JobSpec(tenant="acme", quality=quality, metadata=metadata)
