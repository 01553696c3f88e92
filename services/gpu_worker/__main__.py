"""`python -m services.gpu_worker`: one GPU worker process (same as `splatq worker`)."""

from __future__ import annotations

import asyncio

from services.gpu_worker.handler import make
from shared.runner import run_worker
from shared.settings import Settings


def main() -> None:
    asyncio.run(run_worker(Settings.from_env(), make, service="gpu_worker"))


if __name__ == "__main__":
    main()
