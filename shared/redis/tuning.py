"""The Redis settings splatq's memory figures assume, and a check of a running server's.

A job record is a hash. Redis keeps a small hash as one compact listpack only while every
value is at most `hash-max-listpack-value` bytes (64 by default); past that the whole hash
becomes a hashtable of separately allocated entries. A staged job's ledger records
(`ps.<stage>`, ~120 bytes each) and a finished job's artifact URLs are longer than 64, so with
the default a retained record takes ~3.6 KB where 1,024 keeps it at ~1.6 KB (measured:
docs/benchmarks.md). `splatq up`'s redis-server and the k8s Redis are started with these
values; on a Redis of your own set them (docs/operations.md), and the gateway says at start
which ones differ.
"""

from __future__ import annotations

from collections.abc import Mapping

from redis.asyncio import Redis
from redis.exceptions import RedisError

# setting -> (the value splatq's servers start with, why it matters)
RECOMMENDED: Mapping[str, tuple[str, str]] = {
    "hash-max-listpack-value": (
        "1024",
        "job records with a stage ledger or artifact URLs then stay compact listpacks "
        "(~1.6 KB each instead of ~3.6 KB, kept for the whole retention)",
    ),
}
# Must not be lower than this for the figure above to hold.
_AT_LEAST = {"hash-max-listpack-value": 1024}


def tuning_arguments() -> list[str]:
    """redis-server command-line options for the recommended settings."""
    return [arg for name, (value, _) in RECOMMENDED.items() for arg in (f"--{name}", value)]


def differences(config: Mapping[str, str]) -> list[str]:
    """Pure: what is off in a server's CONFIG GET answer, one sentence each."""
    out = []
    for name, least in _AT_LEAST.items():
        value = config.get(name)
        if value is None:
            continue
        if not value.isdigit() or int(value) < least:
            wanted, why = RECOMMENDED[name]
            out.append(f"{name} is {value}, not {wanted}: {why}")
    return out


async def check(redis: Redis) -> list[str]:
    """What is off in the server's settings; empty when they match, or when the server does
    not let us read them (a managed Redis may refuse CONFIG GET)."""
    try:
        config = await redis.config_get(*_AT_LEAST)
    except (RedisError, OSError):
        return []
    return differences({str(k): str(v) for k, v in config.items()})
