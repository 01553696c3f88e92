"""`splatq tenants create|list|show`, `splatq keys add|list|revoke`, `splatq quota set`:
operate tenants, their API keys and their GPU quotas in Redis (SPLATQ_REDIS_URL) directly,
without restarting anything. A new key is printed once; Redis keeps only its SHA-256.
Exit codes: 0 done, 1 not found / exists, 3 refused (bad input).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

from splatq.shared.engine.keys import StreamName
from splatq.shared.redis.client import connect
from splatq.shared.settings import Settings
from splatq.shared.tenants.periods import Period
from splatq.shared.tenants.quota import QuotaBook, Usage
from splatq.shared.tenants.store import KeyInfo, TenantError, TenantStore

EXIT_OK, EXIT_NONE, EXIT_REFUSED = 0, 1, 3
COMMANDS = frozenset({"tenants", "keys", "quota"})


def add_commands(sub: Any) -> None:
    t = sub.add_parser("tenants", help="create, list or show tenants (in Redis)")
    tv = t.add_subparsers(dest="verb", required=True)
    create = tv.add_parser("create", help="create a tenant")
    create.add_argument("tenant", help="the tenant's name")
    create.add_argument("--weight", type=int, default=1, help="fair-share weight (1-1000)")
    for s in StreamName:
        create.add_argument(
            f"--cap-{s.value}", type=int, default=0, help=f"running {s.value} jobs at most"
        )
    tv.add_parser("list", help="list tenants")
    show = tv.add_parser("show", help="a tenant's settings, quota, usage and keys")
    show.add_argument("tenant", help="the tenant's name")

    k = sub.add_parser("keys", help="add, list or revoke a tenant's API keys")
    kv = k.add_subparsers(dest="verb", required=True)
    add = kv.add_parser("add", help="a new key (printed once)")
    add.add_argument("tenant", help="the tenant's name")
    add.add_argument("--label", default="", help="a note shown by `keys list`")
    add.add_argument("--rotate", default="", help="key id this key replaces")
    add.add_argument("--grace-s", type=int, default=0,
                     help="the replaced key works this many seconds more (default 0)")  # fmt: skip
    lst = kv.add_parser("list", help="a tenant's keys (ids and hints, never the keys)")
    lst.add_argument("tenant", help="the tenant's name")
    revoke = kv.add_parser("revoke", help="revoke a key (gateways refuse it within "
                           "SPLATQ_API_KEY_CACHE_S)")  # fmt: skip
    revoke.add_argument("tenant", help="the tenant's name")
    revoke.add_argument("key_id", help="the key's id, as `keys list` prints")

    q = sub.add_parser("quota", help="set a tenant's GPU quota")
    qv = q.add_subparsers(dest="verb", required=True)
    qs = qv.add_parser("set", help="GPU-seconds per period ('none' = unlimited)")
    qs.add_argument("tenant", help="the tenant's name")
    qs.add_argument("gpu_seconds", help="a number of GPU-seconds, or 'none'")
    qs.add_argument(
        "--period",
        choices=[p.value for p in Period],
        default="month",
        help="the quota's UTC period (default month)",
    )
    for parser in (create, show, add, lst, revoke, qs, tv.choices["list"]):
        parser.add_argument("--json", action="store_true", help="machine-readable output")


def run_tenant_command(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_run(args, settings))


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    redis = connect(settings.redis_url, client_name="splatq-cli")
    store, book = TenantStore(redis), QuotaBook(redis)
    try:
        return await _dispatch(args, store, book)
    except TenantError as exc:
        print(f"splatq {args.command}: {exc.message}", file=sys.stderr)
        return EXIT_NONE if exc.code in {"not_found", "tenant_exists"} else EXIT_REFUSED
    finally:
        await redis.aclose()


async def _dispatch(args: argparse.Namespace, store: TenantStore, book: QuotaBook) -> int:
    out: Any
    match (args.command, args.verb):
        case ("tenants", "create"):
            caps = {s: getattr(args, f"cap_{s.value}") for s in StreamName}
            await store.create(args.tenant, args.weight, caps)
            out = await _show(store, book, args.tenant)
        case ("tenants", "list"):
            out = {"tenants": list(await store.all())}
        case ("tenants", "show"):
            if not await store.exists(args.tenant):
                raise TenantError("not_found", f"no such tenant {args.tenant!r}")
            out = await _show(store, book, args.tenant)
        case ("keys", "add"):
            new = await store.add_key(args.tenant, args.label, args.rotate, args.grace_s)
            out = {**_key(new.info), "api_key": new.api_key}
        case ("keys", "list"):
            out = {"keys": [_key(k) for k in await store.list_keys(args.tenant)]}
        case ("keys", "revoke"):
            await store.revoke_key(args.tenant, args.key_id)
            out = {"revoked": args.key_id}
        case ("quota", "set"):
            seconds = None if args.gpu_seconds.lower() == "none" else _seconds(args.gpu_seconds)
            await store.set_quota(args.tenant, seconds, Period(args.period))
            out = _usage(await book.usage(args.tenant))
        case _:
            return EXIT_REFUSED
    _print(out, args.json)
    return EXIT_OK


def _seconds(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise TenantError(
            "invalid_request", f"gpu_seconds must be a number or 'none', got {raw!r}"
        ) from None


async def _show(store: TenantStore, book: QuotaBook, tenant: str) -> dict[str, Any]:
    sched = await store.scheduling(tenant)
    return {
        "tenant": tenant,
        "weight": sched.weight,
        "running_caps": {s.value: sched.running_cap(s) for s in StreamName},
        "quota": _usage(await book.usage(tenant)),
        "keys": [_key(k) for k in await store.list_keys(tenant)],
    }


def _key(k: KeyInfo) -> dict[str, Any]:
    return {"key_id": k.key_id, "label": k.label, "hint": k.hint, "expires_ms": k.expires_ms}


def _usage(u: Usage) -> dict[str, Any]:
    return {
        "period": u.period.value,
        "quota_gpu_seconds": None if u.limit_ms is None else u.limit_ms / 1000,
        "reserved_gpu_seconds": u.reserved_ms / 1000,
        "used_gpu_seconds": u.used_ms / 1000,
        "resets_ms": u.resets_ms,
    }


def _print(out: Any, as_json: bool) -> None:
    if as_json:
        print(orjson.dumps(out).decode())
        return
    for name, value in out.items():
        print(f"{name}: {orjson.dumps(value).decode() if not isinstance(value, str) else value}")
