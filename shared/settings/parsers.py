"""How one environment variable becomes one setting's value. Every parser has the shape
`(env, name, default) -> value`: an unset or blank variable gives the default (except where
said), a malformed one raises `SettingsError` naming the variable."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from splatq.shared.config.vocabulary import parse_class_names, parse_int_map, parse_stage_names
from splatq.shared.settings.errors import SettingsError

Parser = Callable[[Mapping[str, str], str, Any], Any]
N = TypeVar("N", int, float)


def _given(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value as set, or None when it is unset or blank."""
    raw = env.get(name)
    return None if raw is None or raw.strip() == "" else raw


def _converted(raw: str, name: str, convert: Callable[[str], N], what: str) -> N:
    try:
        return convert(raw)
    except ValueError:
        raise SettingsError(f"{name} must be {what}, got {raw!r}") from None


def parse_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    if (raw := _given(env, name)) is None:
        return default
    value = _converted(raw, name, int, "an integer")
    if value < minimum:
        raise SettingsError(f"{name} must be >= {minimum}, got {value}")
    return value


def parse_float(env: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    if (raw := _given(env, name)) is None:
        return default
    value = _converted(raw, name, float, "a number")
    if not lo <= value <= hi:
        raise SettingsError(f"{name} must be within [{lo}, {hi}], got {value}")
    return value


def parse_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    if (raw := _given(env, name)) is None:
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise SettingsError(f"{name} must be a boolean (1/0/true/false), got {raw!r}")


def parse_choice(env: Mapping[str, str], name: str, default: str, allowed: frozenset[str]) -> str:
    value = env.get(name, "").strip() or default
    if value not in allowed:
        raise SettingsError(f"{name} must be one of {sorted(allowed)}, got {value!r}")
    return value


def parse_str(env: Mapping[str, str], name: str, default: str) -> str:
    """The stripped value; unset or blank: the default."""
    return env.get(name, "").strip() or default


def parse_base_url(env: Mapping[str, str], name: str, default: str) -> str:
    """A base URL, without its trailing slashes."""
    return env.get(name, "").strip().rstrip("/") or default


def parse_path(env: Mapping[str, str], name: str, default: Path) -> Path:
    return Path(env.get(name, "").strip() or default)


def parse_names(env: Mapping[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """A comma-separated list of names; unset or blank: the default."""
    names = tuple(t.strip() for t in env.get(name, "").split(",") if t.strip())
    return names or default


def parse_int_list(env: Mapping[str, str], name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """Comma-separated integers ('1,3'); unset or blank: the default."""
    raw = env.get(name, "").strip()
    try:
        values = tuple(int(p) for p in raw.split(",") if p.strip())
    except ValueError:
        raise SettingsError(f"{name} must be comma-separated integers, got {raw!r}") from None
    return values or default


def int_map(what: str) -> Parser:
    """'name=n,...' of integers within [1, 1000] naming `what`s (replacing the default)."""

    def parse(env: Mapping[str, str], name: str, default: Mapping[str, int]) -> Mapping[str, int]:
        raw = env.get(name, "").strip()
        if not raw:
            return dict(default)
        try:
            return parse_int_map(raw, what, 1000)
        except ValueError as exc:
            raise SettingsError(f"{name}: {exc}") from None

    return parse


def stage_map(maximum: int = 1000) -> Parser:
    """'reconstruct=16,export=4': per-stage integers over the default's; names are checked."""

    def parse(env: Mapping[str, str], name: str, default: Mapping[str, int]) -> Mapping[str, int]:
        raw = env.get(name, "").strip()
        if not raw:
            return dict(default)
        try:
            given = parse_int_map(raw, "stage", maximum)
            parse_stage_names(",".join(given))
        except ValueError as exc:
            raise SettingsError(f"{name}: {exc}") from None
        return {**default, **given}

    return parse


def parse_stages(env: Mapping[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """Stage names (SPLATQ_STAGES); unset or blank: the default (none: whole jobs)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse_stage_names(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None


def parse_classes(env: Mapping[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """Job class names (SPLATQ_WORKER_CLASSES); unset, blank or `all`: both classes."""
    try:
        return parse_class_names(env.get(name, ""))
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc}") from None


def parse_codes(env: Mapping[str, str], name: str, default: frozenset[str]) -> frozenset[str]:
    """A comma-separated set of error codes; unset: the default; `none`: empty."""
    raw = env.get(name)
    if raw is None:
        return default
    codes = frozenset(filter(None, (part.strip() for part in raw.split(","))))
    if codes == {"none"}:
        return frozenset()
    bad = sorted(c for c in codes if not c.replace("_", "").isalnum())
    if bad:
        raise SettingsError(f"{name} must list error codes (letters, digits, _), got {bad[0]!r}")
    return codes


def parse_api_keys(
    env: Mapping[str, str], name: str, default: Mapping[str, str]
) -> Mapping[str, str]:
    """`tenant:key,tenant2:key2` into {key: tenant} (added to the default's)."""
    keys: dict[str, str] = dict(default)
    for item in filter(None, (part.strip() for part in env.get(name, "").split(","))):
        tenant, sep, key = item.partition(":")
        if not sep or not tenant or not key:
            raise SettingsError(f"{name} entries must be tenant:key, got {item!r}")
        keys[key] = tenant
    return keys


def parse_quota_estimates(
    env: Mapping[str, str], name: str, default: Mapping[str, int]
) -> Mapping[str, int]:
    """`preview:15,full:120` (GPU-seconds per quality) into {quality: ms} over the default's."""
    table = dict(default)
    for item in filter(None, (part.strip() for part in env.get(name, "").split(","))):
        quality, sep, seconds = item.partition(":")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if not sep or quality not in table or value < 0:
            raise SettingsError(
                f"{name} entries must be quality:seconds with quality in"
                f" {sorted(table)}, got {item!r}"
            )
        table[quality] = round(value * 1000)
    return table


def parse_malloc_arena_max(env: Mapping[str, str], name: str, default: int) -> int:
    """glibc reads its own MALLOC_ARENA_MAX at start: an operator's value stands (0 = leave
    glibc's choice alone)."""
    if env.get("MALLOC_ARENA_MAX", "").strip():
        return 0
    return parse_int(env, name, default, 0)
