"""One frozen, typed settings object read from the environment once (`Settings.from_env()`).

The only package that reads SPLATQ_* variables; everything else receives a `Settings`
explicitly. Each setting is declared once (its field, variable, default, bounds and doc) in
the section modules `front`, `pipeline` and `services`; `declare` reads them generically,
`checks` holds the validations across settings, `doc` renders the README's table.
"""

from __future__ import annotations

from splatq.shared.settings.declare import Declaration, declared
from splatq.shared.settings.environ import process_environment
from splatq.shared.settings.errors import (
    MIN_ADMIN_KEY_CHARS,
    MIN_ADMIN_KEY_DISTINCT,
    SettingsError,
    check_admin_key,
)
from splatq.shared.settings.front import DEFAULT_CHARGED_FAILURE_CODES, DEFAULT_QUOTA_ESTIMATES_MS
from splatq.shared.settings.model import Settings
from splatq.shared.settings.redaction import REDACTED, redact_url
from splatq.shared.settings.services import MIN_FILE_RETENTION_S

__all__ = [
    "DEFAULT_CHARGED_FAILURE_CODES", "DEFAULT_QUOTA_ESTIMATES_MS", "MIN_ADMIN_KEY_CHARS",
    "MIN_ADMIN_KEY_DISTINCT", "MIN_FILE_RETENTION_S", "REDACTED", "Declaration", "Settings",
    "SettingsError", "check_admin_key", "declarations", "declared_variables",
    "process_environment", "redact_url",
]  # fmt: skip


def declarations() -> list[Declaration]:
    """Every setting's declaration, in field order."""
    return [decl for _, decl in declared(Settings)]


def declared_variables() -> frozenset[str]:
    """Every SPLATQ_* variable `Settings.from_env` reads."""
    return frozenset(decl.env for decl in declarations())
