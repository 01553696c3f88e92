"""Every Redis key of tenants, API keys and quotas is built here.

Two kinds of slot: the registry (`{tenants}`: the tenant index and every API key's hash, so a
key's creation, rotation and revocation are one script each) and one slot per tenant
(`{tenant:<id>}`: its settings, quota, usage per period, reservations and per-job saga
ledgers, so every quota step is one script). Pure string building; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Tenant ids created through the admin API / CLI: short, no braces or colons (they appear
# inside hash tags), no spaces. Tenants of SPLATQ_API_KEYS keep whatever name they have.
TENANT_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_tenant_id(value: str) -> bool:
    return TENANT_ID_RE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class TenantKeys:
    prefix: str = "splatq"

    # -- the registry slot -------------------------------------------------------------

    @property
    def registry(self) -> str:
        return f"{self.prefix}:{{tenants}}"

    @property
    def index(self) -> str:
        """Hash of every tenant created in Redis: id -> created_ms."""
        return f"{self.registry}:index"

    @property
    def key_hashes(self) -> str:
        """Hash of every API key: sha256(key) hex -> `tenant|key_id|expires_ms` (0 = never)."""
        return f"{self.registry}:keys"

    @property
    def key_version(self) -> str:
        """Counter bumped by every key rotation and revocation (in the same script): a
        gateway reads it per request and trusts its cached lookups only while it is
        unchanged, so a revoked or retired key stops working at once on every gateway."""
        return f"{self.registry}:keys-version"

    def tenant_keys(self, tenant: str) -> str:
        """Hash of one tenant's keys: key_id -> JSON {sha256, label, created_ms, expires_ms}."""
        return f"{self.registry}:keys:{tenant}"

    @property
    def quota_tenants(self) -> str:
        """Set of tenants that ever reserved quota (the sweeper's work list)."""
        return f"{self.registry}:quota-tenants"

    # -- one tenant's slot -------------------------------------------------------------

    def tag(self, tenant: str) -> str:
        return f"{self.prefix}:{{tenant:{tenant}}}"

    def settings(self, tenant: str) -> str:
        """Hash: weight, cap_interactive, cap_synthesis, created_ms."""
        return f"{self.tag(tenant)}:settings"

    def quota(self, tenant: str) -> str:
        """Hash: gpu_ms (absent = unlimited), period (day | month)."""
        return f"{self.tag(tenant)}:quota"

    def usage(self, tenant: str, period_id: str) -> str:
        """Hash of one period: reserved_ms, used_ms."""
        return f"{self.tag(tenant)}:usage:{period_id}"

    def reservations(self, tenant: str) -> str:
        """Hash of open reservations: job_id -> `period_id|amount_ms|at_ms`."""
        return f"{self.tag(tenant)}:reservations"

    def saga(self, tenant: str, job_id: str) -> str:
        """Hash: the job's saga ledger: `reserve` and `release` (`at_ms|amount_ms|detail`, each
        at most once), the last `charge` (`at_ms|charged_ms|outcome`), `charged_ms` (in all),
        and `u.<unit>` = ms for each unit of work charged (each at most once)."""
        return f"{self.tag(tenant)}:saga:{job_id}"
