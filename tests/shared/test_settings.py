"""Settings come from SPLATQ_* variables once; bad values are refused with the name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from splatq.shared.settings import Settings, SettingsError
from tests.helpers import REPO_ROOT


def test_defaults_work_without_any_variable() -> None:
    """An empty environment gives the documented defaults."""
    s = Settings.from_env({})
    assert s.lease_ttl_ms == 15_000
    assert s.max_deliveries == 5
    assert s.interactive_share == 0.7
    assert s.redis_url_is_default
    assert s.heartbeat_interval_s == 5.0


def test_variables_override_defaults() -> None:
    s = Settings.from_env(
        {
            "SPLATQ_REDIS_URL": "redis://10.1.2.3:6380/2",
            "SPLATQ_LEASE_TTL_MS": "3000",
            "SPLATQ_PARTITIONS": "4",
            "SPLATQ_WORKER_PARTITIONS": "1,3",
            "SPLATQ_API_KEYS": "acme:k1, beta:k2",
            "SPLATQ_WEBHOOK_ALLOW_PRIVATE": "1",
        }
    )
    assert not s.redis_url_is_default
    assert s.owned_partitions == (1, 3)
    assert s.api_keys == {"k1": "acme", "k2": "beta"}
    assert s.webhook_allow_private
    assert Settings.from_env({}).dead_letter_codes == {"CUDA_OUT_OF_MEMORY", "UPSTREAM_UNAVAILABLE"}
    codes = {"SPLATQ_DEAD_LETTER_CODES": "CUDA_OUT_OF_MEMORY, INPUT_MISSING"}
    assert Settings.from_env(codes).dead_letter_codes == {"CUDA_OUT_OF_MEMORY", "INPUT_MISSING"}
    assert Settings.from_env({"SPLATQ_DEAD_LETTER_CODES": "none"}).dead_letter_codes == set()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SPLATQ_LEASE_TTL_MS", "soon"),
        ("SPLATQ_LEASE_TTL_MS", "50"),
        ("SPLATQ_INTERACTIVE_SHARE", "1.5"),
        ("SPLATQ_DEVICE", "tpu"),
        ("SPLATQ_FOREGROUND_NORMALISATION", "u2net"),
        ("SPLATQ_WEBHOOK_ALLOW_PRIVATE", "maybe"),
        ("SPLATQ_API_KEYS", "no-colon"),
        ("SPLATQ_WORKER_PARTITIONS", "a,b"),
        ("SPLATQ_PARTITIONS", "0"),
        ("SPLATQ_DEAD_LETTER_CODES", "CUDA OOM"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(name: str, value: str) -> None:
    """Every malformed value raises SettingsError whose message names the variable."""
    with pytest.raises(SettingsError, match=name.removeprefix("SPLATQ_")[:8]):
        Settings.from_env({name: value})


def test_worker_partitions_must_exist() -> None:
    with pytest.raises(SettingsError, match="WORKER_PARTITIONS"):
        Settings.from_env({"SPLATQ_PARTITIONS": "2", "SPLATQ_WORKER_PARTITIONS": "5"})


def test_cli_exits_78_on_a_configuration_error() -> None:
    """`splatq worker` with a bad variable: exit code 78 (EX_CONFIG) and a clear message."""
    proc = subprocess.run(
        [sys.executable, "-m", "splatq.services.cli", "worker"],
        cwd=REPO_ROOT,
        env={"SPLATQ_LEASE_TTL_MS": "soon", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 78
    assert "SPLATQ_LEASE_TTL_MS" in proc.stderr


def test_cli_exits_78_on_an_unloadable_handler() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "splatq.services.cli", "worker", "--handler", "no.such:thing"],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 78
    assert "cannot load handler" in proc.stderr
