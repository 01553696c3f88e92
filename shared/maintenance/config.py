"""The redriver's configuration file (TOML, path in SPLATQ_REDRIVER_CONFIG), validated at start:
an error names the file, the entry and the key, and what was expected. Without a file every
value has a default (policy.default_policies(), the schedules below).

    [rate_limit]                  # every redrive, all replicas together
    per_s = 50
    burst = 100

    [[policies]]                  # first match wins; no match: held for a person
    name = "gpu-oom-smaller-batch"
    kind = "jobs"                 # jobs | webhooks
    codes = ["CUDA_OUT_OF_MEMORY"]  # the entry's reason or its job's error code; "*" = any
    action = "redrive"            # redrive | hold
    delay_s = 300                 # after the entry was dead-lettered
    budget = 2                    # redrives of one job/message, ever
    require = "none"              # none | circuit_closed (an endpoint's, a hosted model's vendor's)
    hint = { batch_max_size = "1" }  # job fields `hint_<name>` the redrive sets

    [tasks.retention]             # any task: schedule (cron, UTC) and enabled
    schedule = "17 3 * * *"

    [retention]
    inputs_max_age_s = 604800
    inputs_grace_s = 900          # an input younger than this is never deleted
    artifacts_max_age_s = 2592000
    tenants = { acme = { artifacts_max_age_s = 86400 } }
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from splatq.shared.maintenance.keys import DeadLetterKind
from splatq.shared.maintenance.policy import (
    Action,
    Policy,
    Requirement,
    default_policies,
)
from splatq.shared.maintenance.schedule import Schedule, ScheduleError
from splatq.shared.settings import Settings

E = TypeVar("E", DeadLetterKind, Action, Requirement)


# The default and the least grace of an input (see RetentionConfig.inputs_grace_s).
INPUTS_GRACE_S = 900
MIN_INPUTS_GRACE_S = 600


class ConfigError(ValueError):
    """The configuration file cannot be used; the message says where and why."""


# Every task and its default schedule (UTC).
DEFAULT_SCHEDULES: Mapping[str, str] = {
    "redrive_sweep": "* * * * *",
    "retention": "17 3 * * *",
    "expire_records": "41 * * * *",
    "prune_consumers": "*/30 * * * *",
    "stream_bounds": "*/5 * * * *",
    "expired_leases": "* * * * *",
}


@dataclass(frozen=True, slots=True)
class TaskConfig:
    schedule: Schedule
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    inputs_max_age_s: int = 7 * 24 * 3600
    artifacts_max_age_s: int = 30 * 24 * 3600
    tenant_artifacts_max_age_s: Mapping[str, int] = field(default_factory=dict)
    # An input younger than this is never deleted, whatever inputs_max_age_s says: a
    # submission stores its input before it records its job (and S3 refreshes an existing
    # input's age at most every S3_REFRESH_AFTER_S = 300 s), so this must exceed both.
    inputs_grace_s: int = INPUTS_GRACE_S

    @property
    def input_age_s(self) -> int:
        """The age past which an input nobody needs is deleted."""
        return max(self.inputs_max_age_s, self.inputs_grace_s)

    def artifacts_age_for(self, tenant: str) -> int:
        return self.tenant_artifacts_max_age_s.get(tenant, self.artifacts_max_age_s)


def retention_defaults(settings: Settings) -> RetentionConfig:
    """The retention the environment sets (SPLATQ_ARTIFACT_RETENTION_S,
    SPLATQ_INPUT_RETENTION_S); the config file's [retention] overrides it."""
    return RetentionConfig(
        inputs_max_age_s=settings.input_retention_s,
        artifacts_max_age_s=settings.artifact_retention_s,
    )


@dataclass(frozen=True, slots=True)
class RedriverConfig:
    policies: tuple[Policy, ...] = field(default_factory=default_policies)
    rate_per_s: float = 50.0
    burst: int = 100
    batch: int = 200
    tasks: Mapping[str, TaskConfig] = field(
        default_factory=lambda: {n: TaskConfig(Schedule(s)) for n, s in DEFAULT_SCHEDULES.items()}
    )
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    source: str = "(defaults)"


def load_config(path: str, retention: RetentionConfig | None = None) -> RedriverConfig:
    """The file at `path`, or the defaults when `path` is empty. `retention` holds the
    retention defaults (SPLATQ_ARTIFACT_RETENTION_S, SPLATQ_INPUT_RETENTION_S); the file's
    `[retention]` table overrides them."""
    if not path:
        return RedriverConfig(retention=retention or RetentionConfig())
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not TOML: {exc}") from None
    return parse_config(raw, path, retention)


def parse_config(
    raw: Mapping[str, Any], source: str, retention: RetentionConfig | None = None
) -> RedriverConfig:
    where = _Where(source)
    where.only(raw, "", {"rate_limit", "policies", "tasks", "retention", "sweep"})
    rate = where.table(raw, "rate_limit")
    where.only(rate, "rate_limit", {"per_s", "burst"})
    sweep = where.table(raw, "sweep")
    where.only(sweep, "sweep", {"batch"})
    defaults = RedriverConfig()
    policies = raw.get("policies")
    return RedriverConfig(
        policies=defaults.policies if policies is None else _policies(where, policies),
        rate_per_s=where.number(rate, "rate_limit", "per_s", defaults.rate_per_s, 0.001),
        burst=int(where.number(rate, "rate_limit", "burst", defaults.burst, 1, integer=True)),
        batch=int(where.number(sweep, "sweep", "batch", defaults.batch, 1, integer=True)),
        tasks=_tasks(where, where.table(raw, "tasks")),
        retention=_retention(where, where.table(raw, "retention"), retention or RetentionConfig()),
        source=source,
    )


def _policies(where: _Where, raw: Any) -> tuple[Policy, ...]:
    if not isinstance(raw, list) or not raw:
        raise where.error("policies", "must be a non-empty array of tables ([[policies]])")
    out: list[Policy] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        at = f"policies[{i}]"
        if not isinstance(item, dict):
            raise where.error(at, "must be a table")
        where.only(item, at, {"name", "kind", "codes", "action", "delay_s", "budget", "require",
                              "hint"})  # fmt: skip
        name = where.text(item, at, "name")
        if name in names:
            raise where.error(f"{at}.name", f"{name!r} is used by an earlier policy")
        names.add(name)
        codes = item.get("codes")
        if (
            not isinstance(codes, list)
            or not codes
            or not all(isinstance(c, str) and c for c in codes)
        ):
            raise where.error(f"{at}.codes", "must be a non-empty array of reason codes")
        hint = item.get("hint", {})
        if not isinstance(hint, dict) or not all(isinstance(v, str) for v in hint.values()):
            raise where.error(f"{at}.hint", "must be a table of strings")
        kind = where.choice(item, at, "kind", DeadLetterKind)
        # circuit_closed: a webhook message's endpoint's, a job's hosted-model vendor's
        require = where.choice(item, at, "require", Requirement, Requirement.NONE)
        if hint and kind is not DeadLetterKind.JOBS:
            raise where.error(f"{at}.hint", "hints are job fields: jobs only")
        out.append(
            Policy(
                name=name,
                kind=kind,
                codes=frozenset(codes),
                action=where.choice(item, at, "action", Action),
                delay_ms=int(where.number(item, at, "delay_s", 0, 0) * 1000),
                budget=int(where.number(item, at, "budget", 3, 0, integer=True)),
                require=require,
                hint=dict(hint),
            )
        )
    return tuple(out)


def _tasks(where: _Where, raw: Mapping[str, Any]) -> Mapping[str, TaskConfig]:
    unknown = set(raw) - set(DEFAULT_SCHEDULES)
    if unknown:
        raise where.error(
            f"tasks.{sorted(unknown)[0]}", f"no such task (known: {', '.join(DEFAULT_SCHEDULES)})"
        )
    out: dict[str, TaskConfig] = {}
    for name, default in DEFAULT_SCHEDULES.items():
        item = where.table(raw, name, f"tasks.{name}")
        where.only(item, f"tasks.{name}", {"schedule", "enabled"})
        expression = item.get("schedule", default)
        try:
            schedule = Schedule(expression if isinstance(expression, str) else repr(expression))
        except ScheduleError as exc:
            raise where.error(f"tasks.{name}.schedule", str(exc)) from None
        enabled = item.get("enabled", True)
        if not isinstance(enabled, bool):
            raise where.error(f"tasks.{name}.enabled", "must be true or false")
        out[name] = TaskConfig(schedule, enabled)
    return out


def _retention(where: _Where, raw: Mapping[str, Any], d: RetentionConfig) -> RetentionConfig:
    where.only(
        raw, "retention", {"inputs_max_age_s", "inputs_grace_s", "artifacts_max_age_s", "tenants"}
    )
    tenants = where.table(raw, "tenants", "retention.tenants")
    per_tenant: dict[str, int] = {}
    for tenant, item in tenants.items():
        at = f"retention.tenants.{tenant}"
        if not isinstance(item, dict):
            raise where.error(at, "must be a table")
        where.only(item, at, {"artifacts_max_age_s"})
        per_tenant[tenant] = int(
            where.number(item, at, "artifacts_max_age_s", d.artifacts_max_age_s, 0)
        )
    return RetentionConfig(
        inputs_max_age_s=int(
            where.number(raw, "retention", "inputs_max_age_s", d.inputs_max_age_s, 0)
        ),
        artifacts_max_age_s=int(
            where.number(raw, "retention", "artifacts_max_age_s", d.artifacts_max_age_s, 0)
        ),
        tenant_artifacts_max_age_s=per_tenant,
        inputs_grace_s=int(
            where.number(raw, "retention", "inputs_grace_s", d.inputs_grace_s, MIN_INPUTS_GRACE_S)
        ),
    )


@dataclass(frozen=True, slots=True)
class _Where:
    """Builds errors that name the file and the key."""

    source: str

    def error(self, at: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: {at}: {problem}")

    def only(self, table: Mapping[str, Any], at: str, known: set[str]) -> None:
        unknown = sorted(set(table) - known)
        if unknown:
            key = f"{at}.{unknown[0]}" if at else unknown[0]
            raise self.error(key, f"unknown key (known: {', '.join(sorted(known))})")

    def table(self, raw: Mapping[str, Any], key: str, at: str = "") -> Mapping[str, Any]:
        value = raw.get(key, {})
        if not isinstance(value, dict):
            raise self.error(at or key, "must be a table")
        return value

    def text(self, raw: Mapping[str, Any], at: str, key: str) -> str:
        value = raw.get(key)
        if not isinstance(value, str) or not value.strip():
            raise self.error(f"{at}.{key}", "must be a non-empty string")
        return value

    def number(
        self,
        raw: Mapping[str, Any],
        at: str,
        key: str,
        default: float,
        minimum: float,
        *,
        integer: bool = False,
    ) -> float:
        value: Any = raw.get(key, default)
        ok = isinstance(value, int) or (isinstance(value, float) and not integer)
        if isinstance(value, bool) or not ok or float(value) < minimum:
            what = "an integer" if integer else "a number"
            raise self.error(f"{at}.{key}", f"must be {what} >= {minimum:g}, got {value!r}")
        return float(value)

    def choice(
        self, raw: Mapping[str, Any], at: str, key: str, enum: type[E], default: E | None = None
    ) -> E:
        value = raw.get(key)
        if value is None and default is not None:
            return default
        try:
            return enum(value if isinstance(value, str) else repr(value))
        except ValueError:
            allowed = " | ".join(e.value for e in enum)
            raise self.error(f"{at}.{key}", f"must be one of {allowed}, got {value!r}") from None
