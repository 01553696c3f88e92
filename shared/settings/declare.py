"""Declaring a setting once: its field, environment variable, default, parser (bounds) and doc.

    lease_ttl_ms: int = LEASES("SPLATQ_LEASE_TTL_MS", 15_000, minimum=100, doc="...")

A `Group` is a README section; calling it declares one field of `Settings` (a
`dataclasses.field` whose metadata holds the `Declaration`). `read_env` reads every declared
field generically; shared/settings/doc.py renders the README's table from the same metadata.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

from splatq.shared.settings import parsers
from splatq.shared.settings.parsers import Parser

T = TypeVar("T")
METADATA_KEY = "splatq.setting"


@dataclass(frozen=True, slots=True)
class Declaration:
    """One setting as declared: where it is read from, how, and what it means."""

    env: str  # the SPLATQ_* variable
    parse: Parser  # (env, name, default) -> value; SettingsError on a bad value
    doc: str  # one line of markdown for the README's table
    group: Group
    shown: str = ""  # the default as the README shows it ('' = rendered from the value)


class Group:
    """A section of the configuration (one sub-table of the README). Calling it declares a
    setting: the parser follows from the default's type (bool, int with `minimum`, float
    within [`lo`, `hi`], str, or one of `choices`, Path) unless `parse` is given."""

    def __init__(self, title: str) -> None:
        self.title = title

    def __repr__(self) -> str:
        return f"Group({self.title!r})"

    def __call__(
        self,
        env: str,
        default: T,
        *,
        doc: str,
        minimum: int = 0,
        lo: float | None = None,
        hi: float | None = None,
        choices: frozenset[str] | None = None,
        parse: Parser | None = None,
        shown: str = "",
    ) -> T:
        parser = parse or _parser_for(env, default, minimum, lo, hi, choices)
        declared = Declaration(env=env, parse=parser, doc=doc, group=self, shown=shown)
        metadata = {METADATA_KEY: declared}
        if isinstance(default, Mapping):
            factory: Callable[[], dict[Any, Any]] = partial(dict, default)
            return cast("T", dataclasses.field(default_factory=factory, metadata=metadata))
        return dataclasses.field(default=default, metadata=metadata)


def _parser_for(
    env: str,
    default: object,
    minimum: int,
    lo: float | None,
    hi: float | None,
    choices: frozenset[str] | None,
) -> Parser:
    if isinstance(default, bool):
        return parsers.parse_bool
    if isinstance(default, int):
        return partial(parsers.parse_int, minimum=minimum)
    if isinstance(default, float):
        if lo is None or hi is None:
            raise TypeError(f"{env}: a float setting needs its bounds (lo=, hi=)")
        return partial(parsers.parse_float, lo=lo, hi=hi)
    if isinstance(default, str):
        if choices is not None:
            return partial(parsers.parse_choice, allowed=choices)
        return parsers.parse_str
    if isinstance(default, Path):
        return parsers.parse_path
    raise TypeError(f"{env}: a {type(default).__name__} setting needs parse=")


def declaration(f: dataclasses.Field[Any]) -> Declaration | None:
    """The declaration behind a field (None for a field no variable sets)."""
    return cast("Declaration | None", f.metadata.get(METADATA_KEY))


def declared(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], Declaration]]:
    """Every declared field of the settings class `cls`, in field order."""
    out = []
    for f in dataclasses.fields(cls):
        decl = declaration(f)
        if decl is not None:
            out.append((f, decl))
    return out


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"setting {f.name} has no default")


def read_env(cls: type[Any], env: Mapping[str, str]) -> dict[str, Any]:
    """{field name: value} of every declared field of `cls`, parsed from `env`."""
    return {f.name: decl.parse(env, decl.env, default_of(f)) for f, decl in declared(cls)}
