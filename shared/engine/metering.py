"""Metering: the measured work of a job, recorded per unit of work in the job's own record.

A *unit* is one piece of work that produces something a later step can reuse: a stage's
outputs for one input digest (`<stage>.<digest>`), a progressive job's quick result
(`reconstruct.quick.<digest>`), or a whole job run by a monolithic worker (`job`). The run that
finishes a unit records it with the time it measured (meter.lua, fenced by the run's lease), in
the field `m.<unit>` of the job hash; the first record of a unit wins. A retry or a redrive
that reuses stored outputs meters the same unit again with the time the run that made them
measured (kept in the outputs' marker) -- which records it if that run died before it could, and
adds nothing otherwise. So a unit of work is metered exactly once, however often its outputs are
reused, and work that was lost before its outputs were stored is not metered at all (its retry
does the work, and is metered, again).

What the tenant is charged for a job's units is the quota's business
(shared/tenants/charging.py); this module only names the units and reads them back. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

METER_PREFIX = "m."
WHOLE_JOB_UNIT = "job"
# How much of a digest names a unit: 64 bits are plenty within one job.
UNIT_DIGEST_CHARS = 16


def stage_unit(stage: str, digest: str) -> str:
    """The unit of a stage's outputs for one (effective) input digest."""
    return f"{stage}.{digest[:UNIT_DIGEST_CHARS]}"


def quick_unit(digest: str) -> str:
    """The unit of a progressive job's quick result (part of the reconstruct stage's work: a
    redrive that runs reconstruct again discards it with the stage's own unit)."""
    return f"reconstruct.quick.{digest[:UNIT_DIGEST_CHARS]}"


def metered_unit(name: str, value: str) -> tuple[str, int] | None:
    """(unit, measured ms) when a job hash's field `name` is a metered unit, else None (a
    cleared unit's empty value included)."""
    if name.startswith(METER_PREFIX) and value.isdigit():
        return name[len(METER_PREFIX) :], int(value)
    return None


def metered_units(raw: Mapping[str, str]) -> dict[str, int]:
    """The metered units of a job hash: unit -> measured ms (cleared units left out)."""
    return dict(u for name, value in raw.items() if (u := metered_unit(name, value)))


def discarded_unit_fields(units: Iterable[str], stages: Iterable[str]) -> list[str]:
    """Field/value pairs that clear the units of `stages` (a redrive with --from-stage runs
    them again, so their earlier work is no longer the job's)."""
    prefixes = tuple(f"{stage}." for stage in stages)
    pairs: list[str] = []
    for unit in units:
        if unit.startswith(prefixes):
            pairs += [METER_PREFIX + unit, ""]
    return pairs


def total_ms(units: Mapping[str, int]) -> int:
    return sum(units.values())
