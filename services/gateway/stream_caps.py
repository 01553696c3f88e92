"""Caps on the event streams (SSE) one gateway process holds open: in all, and per tenant.

Pure bookkeeping, no I/O: a stream is admitted or refused here before it takes a connection
of the SSE Redis pool; the handler releases it when the stream ends, however it ends.
"""

from __future__ import annotations

from collections import Counter


class StreamCaps:
    """Open-stream counts of this process: at most `per_process` in all, `per_tenant` each."""

    def __init__(self, per_process: int, per_tenant: int) -> None:
        self.per_process = per_process
        self.per_tenant = per_tenant
        self._open: Counter[str] = Counter()
        self._total = 0

    def try_open(self, tenant: str) -> str | None:
        """Admit one more stream of `tenant` (None), or say which cap refuses it."""
        if self._open[tenant] >= self.per_tenant:
            return f"this API key already has {self.per_tenant} open event streams"
        if self._total >= self.per_process:
            return f"this gateway already serves {self.per_process} event streams"
        self._open[tenant] += 1
        self._total += 1
        return None

    def close(self, tenant: str) -> None:
        """Release a stream `try_open` admitted."""
        self._open[tenant] -= 1
        if self._open[tenant] <= 0:
            del self._open[tenant]
        self._total -= 1

    def open_streams(self, tenant: str | None = None) -> int:
        return self._total if tenant is None else self._open[tenant]
