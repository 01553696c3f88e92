"""The policies file is validated at start with errors that name the file, entry and key;
decisions are pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from splatq.shared.maintenance.config import (
    ConfigError,
    RetentionConfig,
    load_config,
    parse_config,
    retention_defaults,
)
from splatq.shared.maintenance.keys import DeadLetterKind
from splatq.shared.maintenance.policy import LetterView, Verdict, decide, default_policies
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.settings import Settings, SettingsError

POLICY = {"name": "p", "kind": "jobs", "codes": ["X"], "action": "redrive"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"policies": [{**POLICY, "kind": "jobz"}]},
         "f.toml: policies[0].kind: must be one of jobs | webhooks, got 'jobz'"),
        ({"policies": [{**POLICY, "delay_s": -1}]},
         "f.toml: policies[0].delay_s: must be a number >= 0, got -1"),
        ({"policies": [POLICY, POLICY]}, "f.toml: policies[1].name: 'p' is used by an earlier"),
        ({"policies": [{**POLICY, "require": "closed"}]},
         "f.toml: policies[0].require: must be one of none | circuit_closed, got 'closed'"),
        ({"policies": [{**POLICY, "codes": []}]}, "f.toml: policies[0].codes: must be a non-empty"),
        ({"policies": [{**POLICY, "delay": 3}]}, "f.toml: policies[0].delay: unknown key"),
        ({"tasks": {"retention": {"schedule": "61 * * * *"}}},
         "f.toml: tasks.retention.schedule: not a cron expression"),
        ({"tasks": {"vacuum": {}}}, "f.toml: tasks.vacuum: no such task"),
        ({"rate_limit": {"burst": 0.5}}, "f.toml: rate_limit.burst: must be an integer >= 1"),
    ],
)  # fmt: skip
def test_invalid_configuration_is_refused_precisely(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(raw, "f.toml")
    assert str(err.value).startswith(message), str(err.value)


def test_a_file_that_is_not_toml_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "policies.toml"
    path.write_text("[[policies]\n")
    with pytest.raises(ConfigError, match=rf"^{path}: not TOML"):
        load_config(str(path))


def test_defaults_redrive_oom_later_and_hold_poison() -> None:
    policies = default_policies()
    now = 10_000_000

    def view(
        codes: set[str], kind: DeadLetterKind = DeadLetterKind.JOBS, **kw: object
    ) -> LetterView:
        base = {"at_ms": now - 60_000, "redrives": 0, "redrivable": True}
        return LetterView(kind, frozenset(codes), **{**base, **kw})  # type: ignore[arg-type]

    oom = decide(policies, view({"dead_lettered", "CUDA_OUT_OF_MEMORY"}), now)
    assert (oom.verdict, oom.policy) == (Verdict.WAIT, "gpu-oom-smaller-batch")
    later = decide(policies, view({"CUDA_OUT_OF_MEMORY"}, at_ms=now - 301_000), now)
    assert later.verdict is Verdict.REDRIVE
    assert later.hint == {"batch_max_size": "1"}
    spent = decide(policies, view({"CUDA_OUT_OF_MEMORY"}, at_ms=0, redrives=2), now)
    assert spent.verdict is Verdict.EXHAUSTED
    assert decide(policies, view({"max_deliveries_exceeded"}), now).verdict is Verdict.HOLD
    hook = view({"exhausted"}, DeadLetterKind.WEBHOOKS, at_ms=0, circuit_closed=False)
    assert decide(policies, hook, now).verdict is Verdict.WAIT
    healthy = view({"exhausted"}, DeadLetterKind.WEBHOOKS, at_ms=0)
    assert decide(policies, healthy, now).verdict is Verdict.REDRIVE
    assert decide(policies, view({"gone"}, DeadLetterKind.WEBHOOKS), now).verdict is Verdict.HOLD
    # a hosted model's job: back once its vendor's circuit is closed, after 5 minutes
    down = view({"UPSTREAM_UNAVAILABLE"}, at_ms=0, circuit_closed=False)
    assert (decide(policies, down, now).verdict, decide(policies, down, now).policy) == (
        Verdict.WAIT, "upstream-after-recovery")  # fmt: skip
    assert decide(policies, view({"UPSTREAM_UNAVAILABLE"}, at_ms=0), now).verdict is Verdict.REDRIVE


def test_schedules_are_utc_and_seconds_capable() -> None:
    daily = Schedule("30 2 * * *")
    at = 1_767_232_800.0  # 2026-01-01T02:00:00Z
    assert daily.next_slot(at) == at + 1800
    assert daily.latest_slot(at + 1800) == at + 1800
    assert daily.interval_s(at) == 86_400
    assert Schedule("*/2 * * * * *").interval_s(at) == 2


def test_retention_defaults_come_from_the_environment_and_the_file_overrides(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env(
        {"SPLATQ_ARTIFACT_RETENTION_S": "86400", "SPLATQ_INPUT_RETENTION_S": "7200"}
    )
    defaults = retention_defaults(settings)
    assert load_config("", defaults).retention == RetentionConfig(7200, 86_400)
    path = tmp_path / "redriver.toml"
    path.write_text("[retention]\nartifacts_max_age_s = 3600\n")
    assert load_config(str(path), defaults).retention == RetentionConfig(7200, 3600)
    for name in ("SPLATQ_ARTIFACT_RETENTION_S", "SPLATQ_INPUT_RETENTION_S"):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: "0"})
    assert Settings.from_env({}).job_retention_s == 7 * 86_400
    with pytest.raises(SettingsError, match="SPLATQ_JOB_RETENTION_S"):
        Settings.from_env({"SPLATQ_JOB_RETENTION_S": "5"})
