"""S3Storage against moto's standalone S3 server, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import os
import random
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiobotocore.session import AioSession
from botocore.exceptions import BotoCoreError, ClientError
from redis.asyncio import Redis

from splatq.services.dlq_redriver.service import task_store
from splatq.shared.engine.jobs import JobSpec
from splatq.shared.engine.queue import JobQueue
from splatq.shared.maintenance.config import RetentionConfig
from splatq.shared.maintenance.retention import Retention
from splatq.shared.maintenance.schedule import Schedule
from splatq.shared.maintenance.scheduler import Scheduler
from splatq.shared.maintenance.store import Refusal
from splatq.shared.storage.s3 import MULTIPART_THRESHOLD, PART_SIZE, S3Storage
from splatq.shared.storage.store import (
    TEMP_MARKER,
    ObjectNotFound,
    StorageUnavailable,
    input_key,
    open_storage,
)
from splatq.shared.testing import eventually, eventually_sync


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m moto.server` on a free port; yields its URL once it answers."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"moto server exited {proc.returncode}: {log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                return True
        except (urllib.error.URLError, OSError):
            return False

    try:
        eventually_sync(
            answers,
            timeout=30,
            interval=0.1,
            message=lambda: f"moto server answering: {log_path.read_text()}",
        )
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials through the standard chain; no real AWS config can leak in."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
async def s3(moto_endpoint: str) -> AsyncIterator[S3Storage]:
    storage = S3Storage(f"splatq-{secrets.token_hex(4)}", "tenant/a", endpoint_url=moto_endpoint)
    await storage.ensure_bucket()
    yield storage
    await storage.close()


@pytest.fixture
async def raw(moto_endpoint: str) -> AsyncIterator[Any]:
    """A plain client, to look at the bucket behind the backend's back."""
    async with AioSession().create_client(
        "s3", region_name="us-east-1", endpoint_url=moto_endpoint
    ) as client:
        yield client


async def bucket_keys(raw: Any, bucket: str) -> list[str]:
    keys: list[str] = []
    async for page in raw.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return sorted(keys)


async def open_uploads(raw: Any, bucket: str) -> list[Any]:
    listed = await raw.list_multipart_uploads(Bucket=bucket)
    return list(listed.get("Uploads", []))


async def test_put_get_round_trip(s3: S3Storage, raw: Any) -> None:
    """put_bytes then get_bytes returns the bytes, stored at <prefix>/<key>; delete removes it."""
    await s3.put_bytes("jobs/j1/scene.ply", b"ply\x00data")
    assert await s3.get_bytes("jobs/j1/scene.ply") == b"ply\x00data"
    assert await s3.exists("jobs/j1/scene.ply")
    assert await bucket_keys(raw, s3.bucket) == ["tenant/a/jobs/j1/scene.ply"]
    await s3.delete("jobs/j1/scene.ply")
    assert not await s3.exists("jobs/j1/scene.ply")
    await s3.delete("jobs/j1/scene.ply")  # deleting twice is fine


async def test_get_missing_key_raises_object_not_found(s3: S3Storage) -> None:
    """A missing key is ObjectNotFound (permanent), not a botocore error."""
    with pytest.raises(ObjectNotFound) as caught:
        await s3.get_bytes("inputs/ab/nothing.png")
    assert not caught.value.retryable
    assert not await s3.exists("inputs/ab/nothing.png")


async def test_invalid_keys_are_refused(s3: S3Storage) -> None:
    """Keys go through validate_key: no `..`, absolute or hidden segments."""
    for key in ("../escape", "/abs", "jobs/.hidden", ""):
        with pytest.raises(ValueError, match="invalid storage key"):
            await s3.put_bytes(key, b"x")


async def test_stage_is_invisible_until_commit(s3: S3Storage, raw: Any) -> None:
    """A staged object lives under a hidden temp key; the final key does not exist yet."""
    staged = await s3.stage("jobs/j2/scene.ply", b"new")
    assert staged.key == "jobs/j2/scene.ply"
    assert staged.size == 3
    assert TEMP_MARKER in staged.temp_key
    assert staged.temp_key.startswith("jobs/j2/.scene.ply.tmp-")
    assert not await s3.exists("jobs/j2/scene.ply")
    with pytest.raises(ObjectNotFound):
        await s3.get_bytes("jobs/j2/scene.ply")
    assert await s3.read_staged(staged) == b"new"
    assert await bucket_keys(raw, s3.bucket) == [f"tenant/a/{staged.temp_key}"]


async def test_commit_makes_visible_and_removes_temp(s3: S3Storage, raw: Any) -> None:
    """commit puts the staged bytes at the final key (replacing the old) and deletes the temp."""
    await s3.put_bytes("jobs/j3/scene.ply", b"old")
    staged = await s3.stage("jobs/j3/scene.ply", b"new")
    assert await s3.get_bytes("jobs/j3/scene.ply") == b"old"
    await s3.commit(staged)
    assert await s3.get_bytes("jobs/j3/scene.ply") == b"new"
    assert await bucket_keys(raw, s3.bucket) == ["tenant/a/jobs/j3/scene.ply"]
    preview = await s3.stage("jobs/j3/preview.png", b"png")
    await s3.commit(preview)
    head = await raw.head_object(Bucket=s3.bucket, Key="tenant/a/jobs/j3/preview.png")
    assert head["ContentType"] == "image/png"  # the final key's type, not the temp name's
    assert await bucket_keys(raw, s3.bucket) == [
        "tenant/a/jobs/j3/preview.png",
        "tenant/a/jobs/j3/scene.ply",
    ]
    with pytest.raises(ObjectNotFound):
        await s3.read_staged(staged)


async def test_discard_removes_temp(s3: S3Storage, raw: Any) -> None:
    """discard deletes the temp object and never touches the final key."""
    staged = await s3.stage("jobs/j4/scene.ply", b"draft")
    await s3.discard(staged)
    assert await bucket_keys(raw, s3.bucket) == []
    assert not await s3.exists("jobs/j4/scene.ply")


async def test_large_staged_object_uses_multipart_and_leaves_no_uploads(
    s3: S3Storage, raw: Any
) -> None:
    """A 9 MiB object is staged in parts, round-trips exactly, and no multipart upload remains."""
    data = random.Random(7).randbytes(9 * 1024 * 1024)
    assert len(data) > MULTIPART_THRESHOLD
    staged = await s3.stage("jobs/j5/scene.ply", data)
    head = await raw.head_object(Bucket=s3.bucket, Key=f"tenant/a/{staged.temp_key}")
    assert head["ETag"].endswith('-2"')  # a two-part multipart object (8 MiB + 1 MiB)
    assert head["ContentLength"] == len(data)
    assert await s3.read_staged(staged) == data
    await s3.commit(staged)
    assert await s3.get_bytes("jobs/j5/scene.ply") == data
    assert await bucket_keys(raw, s3.bucket) == ["tenant/a/jobs/j5/scene.ply"]
    assert await open_uploads(raw, s3.bucket) == []


async def test_large_put_bytes_goes_straight_to_final_key(s3: S3Storage, raw: Any) -> None:
    """put_bytes of a large object uploads in parts to the final key, with no temp object."""
    data = random.Random(8).randbytes(PART_SIZE + 12345)
    await s3.put_bytes("jobs/j6/scene.ply", data)
    head = await raw.head_object(Bucket=s3.bucket, Key="tenant/a/jobs/j6/scene.ply")
    assert head["ETag"].endswith('-2"')
    assert await s3.get_bytes("jobs/j6/scene.ply") == data
    assert await bucket_keys(raw, s3.bucket) == ["tenant/a/jobs/j6/scene.ply"]
    assert await open_uploads(raw, s3.bucket) == []


async def test_failed_multipart_upload_is_aborted(
    s3: S3Storage, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part failing mid-upload aborts the multipart upload: StorageUnavailable, no parts left."""
    client = await s3._client()
    real_upload_part = client.upload_part
    calls = 0

    async def flaky_upload_part(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ClientError({"Error": {"Code": "InternalError", "Message": "boom"}}, "UploadPart")
        return await real_upload_part(**kwargs)

    monkeypatch.setattr(client, "upload_part", flaky_upload_part)
    with pytest.raises(StorageUnavailable, match="InternalError"):
        await s3.stage("jobs/j7/scene.ply", bytes(MULTIPART_THRESHOLD + 1))
    assert calls == 2
    assert await open_uploads(raw, s3.bucket) == []
    assert await bucket_keys(raw, s3.bucket) == []


async def test_sweep_temp_removes_only_temp_objects(s3: S3Storage, raw: Any) -> None:
    """sweep_temp deletes uncommitted temps directly under the prefix and nothing else."""
    await s3.put_bytes("jobs/j8/scene.ply", b"committed")
    await s3.put_bytes("jobs/j80/scene.ply", b"sibling prefix, committed")
    await s3.stage("jobs/j8/scene.ply", b"orphan 1")
    await s3.stage("jobs/j8/preview.png", b"orphan 2")
    nested = await s3.stage("jobs/j8/sub/x.bin", b"another writer's stage")
    sibling = await s3.stage("jobs/j80/scene.ply", b"sibling's stage")
    assert await s3.sweep_temp("jobs/j8") == 2
    assert await bucket_keys(raw, s3.bucket) == sorted(
        [
            "tenant/a/jobs/j8/scene.ply",
            "tenant/a/jobs/j80/scene.ply",
            f"tenant/a/{nested.temp_key}",
            f"tenant/a/{sibling.temp_key}",
        ]
    )
    assert await s3.sweep_temp("jobs/j8") == 0
    assert await s3.sweep_temp("jobs/none") == 0


async def test_presigned_url_downloads_with_plain_get(s3: S3Storage) -> None:
    """A presigned URL serves the object to a plain aiohttp GET, as an attachment if named."""
    await s3.put_bytes("jobs/j9/scene.ply", b"splats")
    url = await s3.presigned_get_url("jobs/j9/scene.ply", expires_s=60, filename="scène 1.ply")
    assert "X-Amz-Signature=" in url  # SigV4
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        assert await response.read() == b"splats"
        disposition = response.headers.get("Content-Disposition", "")
    assert disposition.startswith('attachment; filename="sc_ne 1.ply"')
    assert "filename*=UTF-8''sc%C3%A8ne%201.ply" in disposition

    plain = await s3.presigned_get_url("jobs/j9/scene.ply")
    async with aiohttp.ClientSession() as http, http.get(plain) as response:
        assert response.status == 200
        assert await response.read() == b"splats"


async def test_open_storage_returns_working_s3_backend(
    moto_endpoint: str, raw: Any, tmp_path: Path
) -> None:
    """open_storage("s3://bucket/prefix", ..., s3_endpoint_url=...) is a working S3Storage."""
    bucket = f"splatq-{secrets.token_hex(4)}"
    storage = open_storage(f"s3://{bucket}/pre/", tmp_path, s3_endpoint_url=moto_endpoint)
    assert isinstance(storage, S3Storage)
    assert (storage.bucket, storage.prefix, storage.endpoint_url) == (bucket, "pre", moto_endpoint)
    try:
        await storage.ensure_bucket()
        await storage.ensure_bucket()  # idempotent
        await storage.put_bytes("inputs/ab/x.png", b"png")
        assert await storage.get_bytes("inputs/ab/x.png") == b"png"
        assert await bucket_keys(raw, bucket) == ["pre/inputs/ab/x.png"]
    finally:
        await storage.close()
    assert not any(os.scandir(tmp_path))  # nothing written locally


def test_open_storage_url_forms(tmp_path: Path) -> None:
    """file:// and empty URLs stay local; an s3:// URL needs a bucket; other schemes fail."""
    assert type(open_storage("", tmp_path)).__name__ == "LocalFileStorage"
    assert type(open_storage(f"file://{tmp_path}", tmp_path)).__name__ == "LocalFileStorage"
    bare = open_storage("s3://only-bucket", tmp_path)
    assert isinstance(bare, S3Storage)
    assert (bare.prefix, bare.endpoint_url) == ("", None)
    with pytest.raises(ValueError, match="no bucket"):
        open_storage("s3:///prefix", tmp_path)
    with pytest.raises(ValueError, match="unsupported"):
        open_storage("gs://bucket", tmp_path)


async def test_unreachable_endpoint_raises_storage_unavailable_quickly() -> None:
    """A closed port gives StorageUnavailable (transient, botocore cause) within seconds."""
    storage = S3Storage(
        "bucket",
        "p",
        endpoint_url=f"http://127.0.0.1:{_free_port()}",
        connect_timeout_s=1.0,
        read_timeout_s=1.0,
        max_attempts=2,
    )
    started = time.monotonic()
    try:
        with pytest.raises(StorageUnavailable) as caught:
            await storage.get_bytes("inputs/x.png")
        assert caught.value.retryable
        assert isinstance(caught.value.__cause__, BotoCoreError)
        with pytest.raises(StorageUnavailable):
            await storage.put_bytes("inputs/x.png", b"x")
        with pytest.raises(StorageUnavailable):
            await storage.exists("inputs/x.png")
        with pytest.raises(StorageUnavailable):
            await storage.sweep_temp("jobs/j")
    finally:
        await storage.close()
    assert time.monotonic() - started < 15


def test_s3_backend_is_not_imported_by_local_storage() -> None:
    """Importing splatq.shared.storage.store (local users) does not import aiobotocore."""
    code = "import sys, splatq.shared.storage.store; sys.exit('aiobotocore' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=False, env=dict(os.environ))
    assert done.returncode == 0


async def test_listing_pages_in_key_order_after_a_checkpoint(moto_endpoint: str, raw: Any) -> None:
    """list_objects walks every page (2 keys a page here), leaves staged temporaries out,
    strips the prefix, and resumes strictly after a key."""
    s3 = S3Storage(f"splatq-{secrets.token_hex(4)}", "tenant/a", endpoint_url=moto_endpoint,
                   list_page_size=2)  # fmt: skip
    await s3.ensure_bucket()
    try:
        keys = [f"inputs/{i:02x}/{i:064x}.png" for i in range(7)]
        for key in reversed(keys):
            await s3.put_bytes(key, b"x")
        await s3.stage("inputs/00/staged.png", b"half")
        await s3.put_bytes("jobs/j1/scene.ply", b"ply")
        listed = [o.key async for o in s3.list_objects("inputs")]
        assert listed == keys
        assert [o.key async for o in s3.list_objects("inputs", after=keys[2])] == keys[3:]
        [ply] = [o async for o in s3.list_objects("jobs")]
        assert ply.key == "jobs/j1/scene.ply"
        assert abs(ply.modified_s - time.time()) < 300  # S3's clock, near ours
        assert await s3.modified_at("jobs/j1/nothing.ply") is None
    finally:
        await s3.close()


async def test_put_if_absent_refreshes_the_age_of_an_existing_object(moto_endpoint: str) -> None:
    """An existing object is not rewritten, but its LastModified moves to now (a CopyObject
    onto itself) once it is older than refresh_after_s; retention then sees it as new."""
    s3 = S3Storage(f"splatq-{secrets.token_hex(4)}", endpoint_url=moto_endpoint,
                   refresh_after_s=0.0)  # fmt: skip
    await s3.ensure_bucket()
    try:
        key = "inputs/ab/" + "ab" * 32 + ".png"
        assert await s3.put_if_absent(key, b"first")
        first = await s3.modified_at(key)
        assert first is not None

        async def refreshed() -> bool:  # LastModified has a resolution of one second
            assert not await s3.put_if_absent(key, b"second")
            now = await s3.modified_at(key)
            return now is not None and now > first

        await eventually(refreshed, timeout=15, interval=0.2)
        assert await s3.get_bytes(key) == b"first"
    finally:
        await s3.close()


async def test_retention_deletes_on_s3_only_what_no_job_needs(
    moto_endpoint: str, queue: JobQueue, redis: Redis
) -> None:
    """The retention task on an S3 bucket (listing across pages, checkpointed batches of 3):
    an old input a queued job names stays, an old orphan goes; a completed job's old
    artifacts go, a running job's stay. Ages are judged at a clock two hours ahead."""
    s3 = S3Storage(f"splatq-{secrets.token_hex(4)}", "p", endpoint_url=moto_endpoint,
                   list_page_size=2)  # fmt: skip
    await s3.ensure_bucket()
    try:
        needed, orphans = input_key("a" * 64, "png"), [input_key(c * 64, "png") for c in "bcd"]
        for key in (needed, *orphans):
            await s3.put_bytes(key, b"image")
        queued = await queue.enqueue(JobSpec(tenant="acme", quality="preview", input_ref=needed))
        done = await queue.enqueue(JobSpec(tenant="acme", quality="preview"))
        await redis.hset(queue.keys.job(done.job_id), "status", "completed")  # type: ignore[misc]
        kept_art = f"jobs/{queued.job_id}/a1/scene.ply"
        done_arts = [f"jobs/{done.job_id}/a1/{n}" for n in ("scene.ply", "scene.splat")]
        for key in (kept_art, *done_arts):
            await s3.put_bytes(key, b"artifact")
        config = RetentionConfig(inputs_max_age_s=3600, artifacts_max_age_s=3600)
        task = Retention(queue, s3, config, Schedule("0 4 * * *"), batch=3,
                         clock=lambda: time.time() + 7200)  # fmt: skip
        scheduler = Scheduler(task_store(queue), [task], "test", 5000, 0.05)
        result = await scheduler.run_now("retention")
        assert not isinstance(result, Refusal)
        assert result.summary == "deleted 3 inputs, 2 artifacts, 0 intermediates", result.summary
        assert [o.key async for o in s3.list_objects("inputs")] == [needed]
        assert [o.key async for o in s3.list_objects("jobs")] == [kept_art]
    finally:
        await s3.close()
