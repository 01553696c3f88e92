"""The validations that span more than one setting (a single variable's bounds are in its
declaration). Run on every `Settings` built, from the environment or by `with_overrides`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from splatq.shared.settings.errors import SettingsError, check_admin_key

if TYPE_CHECKING:
    from splatq.shared.settings.model import Settings


def check_partitions(s: Settings) -> None:
    if s.partitions < 1 or s.partitions > 999:
        raise SettingsError("SPLATQ_PARTITIONS must be within [1, 999]")
    for p in s.worker_partitions:
        if not 0 <= p < s.partitions:
            raise SettingsError(f"SPLATQ_WORKER_PARTITIONS lists {p}, outside [0, {s.partitions})")


def check_lease(s: Settings) -> None:
    if s.lease_ttl_ms < 100:
        raise SettingsError("SPLATQ_LEASE_TTL_MS must be >= 100")


def check_cache_ttls(s: Settings) -> None:
    if s.cache_soft_ttl_s > s.cache_hard_ttl_s:
        raise SettingsError("SPLATQ_CACHE_SOFT_TTL_S must be <= SPLATQ_CACHE_HARD_TTL_S")


def check_admin(s: Settings) -> None:
    if s.admin_api_key:
        check_admin_key(s.admin_api_key)


def check_ports(s: Settings) -> None:
    if s.admin_port and s.admin_port in (s.gateway_port, s.metrics_port):
        raise SettingsError(
            "SPLATQ_ADMIN_PORT must differ from SPLATQ_GATEWAY_PORT and SPLATQ_METRICS_PORT"
        )
    if s.metrics_port and s.metrics_port == s.gateway_port:
        raise SettingsError("SPLATQ_METRICS_PORT must differ from SPLATQ_GATEWAY_PORT")


CHECKS = (check_partitions, check_lease, check_cache_ttls, check_admin, check_ports)


def check_settings(s: Settings) -> None:
    """SettingsError unless the settings agree with one another."""
    for check in CHECKS:
        check(s)
