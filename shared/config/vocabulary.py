"""The names configuration speaks in (stages, job classes, `splatq up` layouts, job costs) and
the pure parsers of their lists. The engine's enums (`PipelineStage`, `StreamName`) carry the
same values; tests/shared/test_settings_declared.py checks that they agree."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# The pipeline's stages, in order, and the cleanup that follows a job's terminal exit
# (shared/engine/stages.py: PipelineStage, ALL_STAGES).
STAGE_NAMES: tuple[str, ...] = ("ingest", "reconstruct", "export", "render", "publish", "cleanup")

# The two work streams (job classes) in stream order (shared/engine/keys.py: STREAMS).
CLASS_NAMES: tuple[str, ...] = ("interactive", "synthesis")

# `splatq up`'s worker layouts (SPLATQ_UP_LAYOUT; services/stack.py lays them out).
UP_LAYOUTS = frozenset({"auto", "per-class", "shared"})

# Estimated cost of a job by quality, in the scheduler's units (a preview is 1). Deficit
# round-robin hands each tenant `quantum x weight` units per turn, so a tenant of full jobs
# gets one full job for every ten previews of another tenant of the same weight.
DEFAULT_COSTS: Mapping[str, int] = {"preview": 1, "full": 10}


def parse_int_map(raw: str, what: str, maximum: int) -> dict[str, int]:
    """'preview=1,full=10' -> {'preview': 1, 'full': 10}; ValueError naming `what` when an
    item is not name=integer within [1, maximum]."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, eq, value = item.partition("=")
        value = value.strip()
        if not eq or not name.strip() or not value.isdigit() or not 1 <= int(value) <= maximum:
            raise ValueError(f"expected {what}=integer within [1, {maximum}], got {item!r}")
        out[name.strip()] = int(value)
    return out


def parse_stage_names(raw: str) -> tuple[str, ...]:
    """`--stages` / SPLATQ_STAGES: comma-separated names, or `all`. Raises ValueError on an
    unknown name; keeps pipeline order and drops repeats."""
    names = [p.strip() for p in raw.split(",") if p.strip()]
    if not names:
        raise ValueError("no stage named")
    if names == ["all"]:
        return STAGE_NAMES
    for name in names:
        if name not in STAGE_NAMES:
            known = ", ".join(STAGE_NAMES)
            raise ValueError(f"unknown stage {name!r} (known: {known}, or all)")
    return tuple(s for s in STAGE_NAMES if s in names)


def parse_class_names(raw: str | Iterable[str]) -> tuple[str, ...]:
    """'interactive', 'synthesis', 'interactive,synthesis' or 'all' (also '' = all) -> the
    classes in stream order; an unknown name raises ValueError."""
    names = [n.strip() for n in (raw.split(",") if isinstance(raw, str) else raw) if n.strip()]
    if not names or names == ["all"]:
        return CLASS_NAMES
    unknown = [n for n in names if n not in CLASS_NAMES]
    if unknown:
        raise ValueError(
            f"unknown class {unknown[0]!r} (one or more of {', '.join(CLASS_NAMES)}, or 'all')"
        )
    return tuple(s for s in CLASS_NAMES if s in names)
