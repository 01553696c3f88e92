"""Stopping a benchmark's worker process: SIGTERM, then SIGKILL of its whole session if it
is still alive after a grace period (a worker started with `start_new_session=True`; a
manager process that forwards SIGTERM would otherwise orphan its children when killed)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal


async def stop_process(proc: asyncio.subprocess.Process, grace_s: float = 10.0) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            print(f"  worker {proc.pid} ignored SIGTERM for {grace_s:.0f} s; SIGKILL")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()
