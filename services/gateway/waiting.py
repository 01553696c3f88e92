"""`Prefer: wait=N` on POST /v1/jobs (RFC 7240, as Replicate's API does): hold the answer
until the job ends or N seconds pass.

The wait follows the job's own event history with blocking reads (XREAD BLOCK, on the SSE
pool, under the SSE caps): the answer leaves as soon as the terminal event is appended, with
no polling loop. `preferred_wait` is pure; `wait_until_finished` is the Redis side.
"""

from __future__ import annotations

import time

from splatq.services.gateway.digits import is_digits
from splatq.shared.engine.events import TERMINAL_EVENTS
from splatq.shared.engine.queue import JobQueue

MAX_WAIT_S = 60


def preferred_wait(header_values: list[str], max_s: int = MAX_WAIT_S) -> int | None:
    """Seconds to wait from the Prefer header(s): `wait=N` (clamped to `max_s`,
    SPLATQ_PREFER_WAIT_MAX_S), or a bare `wait` (`max_s`, as Replicate); None when absent or
    unusable (a preference the server cannot honour is ignored, RFC 7240 section 2)."""
    for header in header_values:
        for preference in header.split(","):
            token = preference.split(";", 1)[0].strip()
            name, sep, value = token.partition("=")
            if name.strip().lower() != "wait":
                continue
            if not sep:
                return max_s
            value = value.strip().strip('"')
            if not is_digits(value) or len(value) > 6:
                return None
            return min(int(value), max_s)
    return None


async def wait_until_finished(
    queue: JobQueue, job_id: str, timeout_s: float, block_cap_ms: int
) -> bool:
    """True once the job's terminal event is in its history, False after `timeout_s`.
    Each blocking read lasts at most `block_cap_ms` (the SSE keep-alive interval, within the
    SSE pool's socket timeout)."""
    deadline = time.monotonic() + timeout_s
    after = "0-0"
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            return False
        events = await queue.job_history(job_id, after, block_ms=min(left_ms, block_cap_ms))
        for entry_id, kind, _ in events:
            after = entry_id
            if kind in TERMINAL_EVENTS:
                return True
