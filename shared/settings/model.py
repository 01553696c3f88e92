"""`Settings`: every tunable of splatq, each declared once in a section class -- its field,
SPLATQ_* variable, default, bounds and doc (shared/settings/declare.py) -- and read from the
environment once (`Settings.from_env()`). The README's configuration table is rendered from
those declarations (shared/settings/doc.py)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from splatq.shared.settings.checks import check_settings
from splatq.shared.settings.declare import read_env
from splatq.shared.settings.redaction import redacted
from splatq.shared.settings.services import ObservabilitySettings


@dataclass(frozen=True, slots=True)
class Settings(ObservabilitySettings):
    """Every tunable of splatq; defaults work for a local stack."""

    def __post_init__(self) -> None:
        check_settings(self)

    def tenant_backlog_limit(self, stream_limit: int) -> int:
        """A tenant's bound within a stream partition bounded by `stream_limit` (0 = none)."""
        if stream_limit <= 0 or self.tenant_backlog_share >= 1.0:
            return 0
        return max(1, math.ceil(stream_limit * self.tenant_backlog_share))

    @property
    def job_retention_ms(self) -> int:
        return self.job_retention_s * 1000

    @property
    def max_deliveries_hard_cap(self) -> int:
        """Deliveries after which a job is dead-lettered whatever its crash charge (a death
        beside k other jobs charges only 1/k against SPLATQ_MAX_DELIVERIES)."""
        return self.max_deliveries * 3

    @property
    def fleet_allowance_ms(self) -> int:
        """A gap in every worker's contact with Redis longer than this is an outage (its time
        is not charged to leases). Workers tick at a third of it."""
        return self.lease_ttl_ms // 2

    @property
    def fleet_tick_interval_s(self) -> float:
        return self.fleet_allowance_ms / 3000.0

    @property
    def heartbeat_interval_s(self) -> float:
        """Leases are renewed every TTL/3, so two renewals can fail before the lease lapses."""
        return self.lease_ttl_ms / 3000.0

    @property
    def storage_root(self) -> Path:
        """Where local storage lives when SPLATQ_STORAGE_URL is not set."""
        return self.data_dir / "artifacts"

    @property
    def public_base_url(self) -> str:
        """Base of artifact links: SPLATQ_PUBLIC_URL, else the gateway's own address."""
        return self.public_url or f"http://127.0.0.1:{self.gateway_port}"

    def for_stage(self, stage: str) -> Settings:
        """The settings a stage's worker runs under: its own slots and attempts."""
        return replace(
            self,
            worker_concurrency=self.stage_concurrency.get(stage, self.worker_concurrency),
            max_attempts=self.stage_max_attempts.get(stage, self.max_attempts),
        )

    @property
    def owned_partitions(self) -> tuple[int, ...]:
        """Partitions this process consumes: the configured subset, or all of them."""
        return self.worker_partitions or tuple(range(self.partitions))

    def __repr__(self) -> str:
        """Every field, secrets redacted: settings reach logs, tracebacks and debuggers."""
        shown = ", ".join(
            f"{f.name}={redacted(f.name, getattr(self, f.name))!r}" for f in fields(self)
        )
        return f"Settings({shown})"

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (tests and the CLI use this; env stays untouched)."""
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every declared SPLATQ_* variable once; unknown values raise `SettingsError`."""
        e: Mapping[str, str] = os.environ if env is None else env
        values = read_env(cls, e)
        values["redis_url_is_default"] = not e.get("SPLATQ_REDIS_URL", "").strip()
        return cls(**values)
