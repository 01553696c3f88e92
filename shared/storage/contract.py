"""The object storage contract every backend keeps (local files: `store.LocalFileStorage`, S3:
`s3.S3Storage`): the `Storage` protocol, staged writes, listing entries, the two errors a
caller tells apart and what a key may be. No backend here, so the backends import it and it
imports none of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from splatq.shared.errors import PermanentError, TransientError


class ObjectNotFound(PermanentError):
    code = "OBJECT_NOT_FOUND"


class StorageUnavailable(TransientError):
    code = "STORAGE_UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class Staged:
    """An object written under `temp_key`, not yet visible at `key`."""

    key: str
    temp_key: str
    size: int


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """A committed object in a listing: its key and when it was last written (or its age
    refreshed by `put_if_absent`), Unix seconds."""

    key: str
    modified_s: float


class Storage(Protocol):
    async def get_bytes(self, key: str) -> bytes: ...

    async def put_bytes(self, key: str, data: bytes) -> None:
        """Write and commit in one call (stage + commit)."""
        ...

    async def stage(self, key: str, data: bytes) -> Staged: ...

    async def read_staged(self, staged: Staged) -> bytes: ...

    async def commit(self, staged: Staged) -> None:
        """Make a staged object visible at its key, atomically (replacing any old one)."""
        ...

    async def discard(self, staged: Staged) -> None: ...

    async def exists(self, key: str) -> bool: ...

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write and commit unless the key exists (content-addressed objects); True when
        this call wrote it. An object that exists has its age refreshed (its modification
        time moves to now; on S3 at most once per `S3_REFRESH_AFTER_S`), so retention,
        which deletes only old objects, treats a re-uploaded input as new."""
        ...

    async def delete(self, key: str) -> None: ...

    def list_objects(self, prefix: str, after: str = "") -> AsyncIterator[ObjectInfo]:
        """Committed objects under `prefix/` (staged temporaries left out) in the backend's
        key order, strictly after key `after` (a checkpoint of an earlier listing)."""
        ...

    async def modified_at(self, key: str) -> float | None:
        """When the object was last written or refreshed (Unix seconds); None if absent."""
        ...

    async def sweep_temp(self, prefix: str) -> int:
        """Delete temporary (never committed) objects under `prefix`; returns how many."""
        ...


def validate_key(key: str) -> str:
    """Keys are relative POSIX paths without `..`, empty or hidden segments (checked on the
    raw string: `a//b` would silently mean `a/b` locally but another key on S3)."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in {"", ".", ".."} for p in parts):
        raise ValueError(f"invalid storage key: {key!r}")
    if any(p.startswith(".") for p in parts):
        raise ValueError(f"invalid storage key (hidden segment): {key!r}")
    return key
