"""Fixtures: vendor configurations, the fake vendor on loopback, lanes on the test's Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from splatq.shared.vendor.config import VendorConfig, parse_vendor_config
from tests.gateway.conftest import make_client  # noqa: F401 - the webhook test's gateway
from tests.vendor.fake_vendor import TOKEN, FakeVendor

TOKEN_ENV = "SPLATQ_TEST_VENDOR_TOKEN"


def vendor_table(
    base_url: str = "http://127.0.0.1:9", **sections: dict[str, Any]
) -> dict[str, Any]:
    """A configuration table for the fake vendor (Replicate's shape), sections overridden."""
    table: dict[str, Any] = {
        "vendor": {"name": "fake", "base_url": f"{base_url}/v1", "model_version": "trellis@abc"},
        "auth": {"env": TOKEN_ENV},
        # small inputs: the preview render of the result is most of a test job's CPU time
        "request": {
            "shape": "json",
            "body": {"version": "abc123"},
            "resolution": {"preview": 64, "full": 64},
        },
        "response": {"mode": "async"},
        "poll": {"initial_s": 0.05, "max_s": 0.2, "factor": 1.5},
        "limits": {"rate": 600, "per_s": 60, "concurrency": 20, "slot_ttl_s": 10},
        "breaker": {"failures": 3, "open_s": 1, "open_cap_s": 4, "max_wait_s": 30},
        "wait": {"inline_max_s": 2},
    }
    for name, values in sections.items():
        table[name] = {**table.get(name, {}), **values}
    return table


def vendor_config(base_url: str = "http://127.0.0.1:9", **sections: dict[str, Any]) -> VendorConfig:
    return parse_vendor_config(vendor_table(base_url, **sections), "test")


def toml_text(table: dict[str, Any]) -> str:
    """A small TOML writer for the configuration tables of these tests (tables of scalars,
    strings, arrays and one level of inline tables)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list | tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(type(v))

    lines: list[str] = []
    for section, values in table.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def write_config(path: Path, base_url: str, **sections: dict[str, Any]) -> Path:
    path.write_text(toml_text(vendor_table(base_url, **sections)))
    return path


@pytest.fixture
def vendor_token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return TOKEN


VendorFactory = Callable[..., Awaitable[FakeVendor]]


@pytest.fixture
async def fake_vendor() -> AsyncIterator[VendorFactory]:
    """Start fake vendors on loopback (keyword arguments: FakeVendor's); closed after."""
    started: list[FakeVendor] = []

    async def make(**kwargs: Any) -> FakeVendor:
        vendor = FakeVendor(**kwargs)
        await vendor.start()
        started.append(vendor)
        return vendor

    yield make
    for vendor in started:
        await vendor.close()
