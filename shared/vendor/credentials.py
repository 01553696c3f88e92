"""Reading a vendor secret (its API token, its webhook signing secret) from where the
configuration names it: an environment variable or a mounted secret file. The only place
either is read; nothing here logs or formats the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from splatq.shared.settings.environ import process_environ
from splatq.shared.vendor.config import AuthConfig, VendorConfigError


class Credential:
    """A secret from an environment variable or a mounted secret file (read again when the
    file changes: a rotated Kubernetes secret needs no restart). Its repr names where it is
    read from, never the value."""

    def __init__(self, auth: AuthConfig, environ: Mapping[str, str] | None = None) -> None:
        self._auth = auth
        self._environ = process_environ() if environ is None else environ
        self._mtime = -1.0
        self._value = ""
        self.value()  # fails at start, not at the first job

    def __repr__(self) -> str:
        return f"Credential(env={self._auth.env!r}, file={self._auth.file!r})"

    def value(self) -> str:
        if self._auth.env:
            token = self._environ.get(self._auth.env, "").strip()
            if not token:
                raise VendorConfigError(f"{self._auth.env} (a secret's variable) is not set")
            return token
        path = Path(self._auth.file)
        try:
            mtime = path.stat().st_mtime
            if mtime != self._mtime:
                self._value, self._mtime = path.read_text(encoding="utf-8").strip(), mtime
        except OSError as exc:
            raise VendorConfigError(f"cannot read the secret file {path}: {exc.strerror}") from None
        if not self._value:
            raise VendorConfigError(f"the secret file {path} is empty")
        return self._value

    def header(self) -> tuple[str, str]:
        scheme = self._auth.scheme
        token = self.value()
        return self._auth.header, f"{scheme} {token}" if scheme else token


def webhook_secret(env: str, file: str) -> Credential:
    """The vendor's webhook signing secret, read like its token."""
    return Credential(AuthConfig(env=env, file=file, scheme=""))
