"""Object storage for inputs and artifacts: an async interface and its local-filesystem backend.

Writes are staged under a temporary key and made visible by an atomic commit (rename), so a
reader never sees a partial object. No job logic here; the S3 backend is `splatq.shared.storage.s3`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlparse

from splatq.shared.storage.contract import (
    ObjectInfo,
    ObjectNotFound,
    Staged,
    Storage,
    StorageUnavailable,
    validate_key,
)
from splatq.shared.storage.files import (
    TEMP_MARKER,
    refresh_mtime,
    walk_files,
    write_file,
    write_if_absent,
)
from splatq.shared.storage.group_commit import GroupCommitWriter

__all__ = ["TEMP_MARKER", "LocalFileStorage", "ObjectInfo", "ObjectNotFound", "Staged",
           "Storage", "StorageUnavailable", "open_storage", "validate_key"]  # fmt: skip
# How often put_if_absent may find an object gone again (retention deleted it between the
# check and the refresh) before it gives up: once is all retention can do.
_REFRESH_TRIES = 3
# Objects a listing reads from disk per hop to a thread.
_LIST_CHUNK = 1000


class LocalFileStorage:
    """Files under `root`; commit is `os.replace` (atomic on POSIX) after an fsync."""

    def __init__(self, root: Path, group_commit: bool = True) -> None:
        self.root = root.resolve()
        # put_if_absent (the gateway's input writes) is batched: one filesystem flush for
        # every write queued at that moment (shared/storage/group_commit.py).
        self._writer = GroupCommitWriter(self.root) if group_commit else None

    def path_of(self, key: str) -> Path:
        return self.root / validate_key(key)

    async def get_bytes(self, key: str) -> bytes:
        path = self.path_of(key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise ObjectNotFound(f"no object at {key!r}") from None
        except OSError as exc:
            raise StorageUnavailable(f"reading {key!r}: {exc}") from exc

    async def put_bytes(self, key: str, data: bytes) -> None:
        await self.commit(await self.stage(key, data))

    async def stage(self, key: str, data: bytes) -> Staged:
        path = self.path_of(key)
        temp = path.with_name(f".{path.name}{TEMP_MARKER}{secrets.token_hex(6)}")
        try:
            await asyncio.to_thread(write_file, temp, data)
        except OSError as exc:
            raise StorageUnavailable(f"writing {key!r}: {exc}") from exc
        return Staged(key, str(temp.relative_to(self.root)), len(data))

    async def read_staged(self, staged: Staged) -> bytes:
        return await asyncio.to_thread((self.root / staged.temp_key).read_bytes)

    async def commit(self, staged: Staged) -> None:
        final = self.path_of(staged.key)
        try:
            await asyncio.to_thread(os.replace, self.root / staged.temp_key, final)
        except OSError as exc:
            raise StorageUnavailable(f"committing {staged.key!r}: {exc}") from exc

    async def discard(self, staged: Staged) -> None:
        await asyncio.to_thread((self.root / staged.temp_key).unlink, True)

    async def exists(self, key: str) -> bool:
        return await asyncio.to_thread(self.path_of(key).is_file)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self.path_of(key).unlink, True)

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self.path_of(key)
        try:
            for _ in range(_REFRESH_TRIES):
                if self._writer is not None:
                    wrote = await self._writer.put_if_absent(path, data)
                else:
                    wrote = await asyncio.to_thread(write_if_absent, path, data)
                # It existed: refresh its age. Gone again in between (retention deleted
                # it): write it anew.
                if wrote or await asyncio.to_thread(refresh_mtime, path):
                    return wrote
        except OSError as exc:
            raise StorageUnavailable(f"writing {key!r}: {exc}") from exc
        raise StorageUnavailable(f"writing {key!r}: deleted {_REFRESH_TRIES} times while written")

    async def list_objects(self, prefix: str, after: str = "") -> AsyncIterator[ObjectInfo]:
        walker = walk_files(self.root, self.path_of(prefix), after)
        while True:
            chunk = await asyncio.to_thread(_take, walker, _LIST_CHUNK)
            for key, mtime in chunk:
                yield ObjectInfo(key, mtime)
            if len(chunk) < _LIST_CHUNK:
                return

    async def modified_at(self, key: str) -> float | None:
        try:
            return (await asyncio.to_thread(self.path_of(key).stat)).st_mtime
        except FileNotFoundError:
            return None

    async def sweep_temp(self, prefix: str) -> int:
        directory = self.path_of(prefix)

        def sweep() -> int:
            if not directory.is_dir():
                return 0
            stale = [p for p in directory.iterdir() if TEMP_MARKER in p.name]
            for p in stale:
                p.unlink(missing_ok=True)
            return len(stale)

        return await asyncio.to_thread(sweep)


def _take(items: Iterator[tuple[str, float]], count: int) -> list[tuple[str, float]]:
    return list(itertools.islice(items, count))


def open_storage(url: str, default_root: Path, *, s3_endpoint_url: str = "") -> Storage:
    """`file:///abs/path` (or empty: `default_root`), or `s3://bucket/prefix`.

    S3 credentials and region come from the AWS config chain; `s3_endpoint_url` points at an
    S3-compatible service (MinIO, moto). aiobotocore is imported only when S3 is asked for.
    """
    if not url:
        return LocalFileStorage(default_root)
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return LocalFileStorage(Path(parsed.path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"SPLATQ_STORAGE_URL {url!r} names no bucket (s3://bucket/prefix)")
        from splatq.shared.storage.s3 import S3Storage  # noqa: PLC0415 - keeps aiobotocore off local use

        return S3Storage(
            parsed.netloc, parsed.path.strip("/"), endpoint_url=s3_endpoint_url or None, region=None
        )
    raise ValueError(
        f"unsupported SPLATQ_STORAGE_URL scheme {parsed.scheme!r} (use file:// or s3://)"
    )


def input_key(sha256_hex: str, extension: str) -> str:
    """Content-addressed key of an uploaded input image."""
    return f"inputs/{sha256_hex[:2]}/{sha256_hex}.{extension}"


# The contract's artifact names -> (file name under jobs/<job_id>/, content type). The one
# place they are written: the GPU worker writes them, the gateway serves them, clients save them.
ARTIFACTS: dict[str, tuple[str, str]] = {
    "gaussian_ply": ("scene.ply", "application/octet-stream"),
    "splat": ("scene.splat", "application/octet-stream"),
    # Niantic's compressed .spz (services/gpu_worker/spz.py): what the console's viewer loads
    # first; absent from jobs finished before it existed.
    "spz": ("scene.spz", "application/octet-stream"),
    "rendered_preview": ("preview.png", "image/png"),
    # The foreground mask stage 0 used (services/gpu_worker/foreground.py): absent from jobs
    # run with SPLATQ_FOREGROUND=none and from jobs finished before it existed.
    "mask": ("mask.png", "image/png"),
}
ARTIFACT_FILES: dict[str, str] = {name: f for name, (f, _) in ARTIFACTS.items()}


def artifact_prefix(job_id: str) -> str:
    return f"jobs/{job_id}"


def artifact_run(attempt: int) -> str:
    """The folder one run (attempt) of a job writes its artifacts to. Each run has its own,
    so a stale run -- one whose job was taken over while it still computed -- can never
    replace what another run committed; the job record's `artifact_run`, written by the
    lease-fenced commit, names the one run whose files are the job's result."""
    return f"a{attempt}"


def artifact_key(job_id: str, filename: str, run: str = "") -> str:
    """Where an artifact lives: under its run's folder, or (`run` empty: jobs committed
    before runs had folders, or written by other handlers) directly under the job."""
    if run:
        return f"{artifact_prefix(job_id)}/{run}/{filename}"
    return f"{artifact_prefix(job_id)}/{filename}"


# A progressive job's quick (preview-resolution) result: a folder of the job's own, named by
# the digest of the reconstruct stage that made it (content-addressed: a retried stage
# writes the same folder again; a redrive that reruns the stage gets a new one). The job's
# reconstruct ledger record names it (`facts.quick_run`), which is how the gateway finds it.
QUICK_RUN_PREFIX = "quick-"
# The artifact route's `variant` that serves it (`/v1/jobs/{id}/artifacts/{name}?variant=quick`).
QUICK_VARIANT = "quick"
_QUICK_RUN_RE = re.compile(r"quick-[0-9a-f]{16}")


def quick_run(stage_digest: str) -> str:
    return f"{QUICK_RUN_PREFIX}{stage_digest[:16]}"


def is_quick_run(run: str) -> bool:
    """A folder name `quick_run` makes (the gateway serves only such folders as quick)."""
    return bool(_QUICK_RUN_RE.fullmatch(run))


def intermediate_prefix(job_id: str) -> str:
    """Where a staged job's intermediates live (the cleanup stage deletes the folder)."""
    return f"intermediates/{job_id}"


def intermediate_key(job_id: str, stage: str, digest: str, name: str) -> str:
    """One stage output, content-addressed by the digest of the stage's inputs: a retried
    stage finds what an earlier run of it finished writing, and reuses it."""
    return f"{intermediate_prefix(job_id)}/{stage}/{digest[:32]}/{name}"
