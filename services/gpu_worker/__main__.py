"""`python -m splatq.services.gpu_worker`: one GPU worker process (same as `splatq worker`)."""

from __future__ import annotations

import asyncio

from splatq.services.gpu_worker.handler import make
from splatq.shared.engine.runner import run_worker
from splatq.shared.settings import Settings


def main() -> None:
    asyncio.run(run_worker(Settings.from_env(), make, service="gpu_worker"))


if __name__ == "__main__":
    main()
