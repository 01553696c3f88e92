"""Whether the vendors of dead-lettered jobs have a closed circuit again (the redriver's
`require = "circuit_closed"` for jobs): a job a hosted model ran names its vendor in its
notes; one of a local model has none and counts as closed. Thin I/O over the lanes' keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.asyncio import Redis

from splatq.shared.vendor.keys import VendorKeys

_VENDOR_NOTE = ("note.up.", ".vendor")


def job_vendor(fields: Mapping[str, str]) -> str:
    """The vendor a job's remote call went to ('' for a local model's job)."""
    for name, value in fields.items():
        if name.startswith(_VENDOR_NOTE[0]) and name.endswith(_VENDOR_NOTE[1]) and value:
            return value
    return ""


async def vendor_circuits_closed(
    redis: Redis, jobs: Sequence[Mapping[str, str]], prefix: str = "splatq"
) -> list[bool]:
    """Per job hash: False while its vendor's circuit is open (or half-open: no probe has
    succeeded yet), else True. One HGET per distinct vendor."""
    vendors = [job_vendor(fields) for fields in jobs]
    states: dict[str, bool] = {}
    for vendor in sorted(set(filter(None, vendors))):
        state = await redis.hget(VendorKeys(vendor, prefix).breaker, "state")  # type: ignore[misc]
        states[vendor] = state != "open"
    return [states.get(v, True) if v else True for v in vendors]
