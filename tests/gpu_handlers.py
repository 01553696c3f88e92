"""GPU-worker handler factories for tests that run worker subprocesses
(`--handler tests.gpu_handlers:...`)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from splatq.services.gpu_worker.handler import GpuJobHandler
from splatq.services.gpu_worker.model import load_model
from splatq.shared.settings import Settings
from splatq.shared.storage.store import LocalFileStorage, Staged


class CrashOnFirstCommit(LocalFileStorage):
    """Dies (SIGKILL) at the first artifact commit of the deployment: artifacts are staged
    and verified, none is committed, and the job's state is not."""

    def __init__(self, root: Path, marker: Path) -> None:
        super().__init__(root)
        self.marker = marker

    async def commit(self, staged: Staged) -> None:
        if not self.marker.exists():
            self.marker.write_text("crashed once")
            os.kill(os.getpid(), signal.SIGKILL)
        await super().commit(staged)


def make_crash_on_commit(settings: Settings) -> GpuJobHandler:
    root = Path(settings.storage_url.removeprefix("file://"))
    storage = CrashOnFirstCommit(root, root / "crash-marker")
    return GpuJobHandler(settings, load_model("builtin"), storage)
