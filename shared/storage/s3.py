"""S3 backend of `Storage` (aiobotocore): staged writes, CopyObject commits, presigned GETs.

No job logic and no reading of settings here: credentials come from botocore's own chain.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import mimetypes
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

import structlog
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore.exceptions import BotoCoreError, ClientError

from splatq.shared.storage.contract import (
    ObjectInfo,
    ObjectNotFound,
    Staged,
    StorageUnavailable,
    validate_key,
)
from splatq.shared.storage.files import TEMP_MARKER

log = structlog.get_logger("splatq.storage")

# Data above this size is uploaded in parts (CreateMultipartUpload/UploadPart/Complete...).
MULTIPART_THRESHOLD = 8 * 1024 * 1024
# Every part but the last must be >= 5 MiB; 10,000 parts of 8 MiB allow objects up to ~78 GiB.
PART_SIZE = 8 * 1024 * 1024
# CopyObject (used by commit) refuses sources above 5 GiB; stage()+commit() is bounded by it.
COPY_OBJECT_LIMIT = 5 * 1024**3

# put_if_absent refreshes an existing object's age (a CopyObject onto itself) only when it is
# older than this, so a popular input costs one copy per interval, not one per submission.
# Retention's input grace must exceed it (docs/operations.md#retention).
S3_REFRESH_AFTER_S = 300.0

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_BUCKET_MISSING_CODES = frozenset({"NoSuchBucket", "NotFound", "404"})


@contextlib.contextmanager
def _translate(action: str) -> Iterator[None]:
    """botocore errors → the storage hierarchy: a missing object is permanent, all else transient.

    Connection failures, timeouts, throttling and 5xx are what this is for; other client errors
    (access denied, a missing bucket) are also reported as `StorageUnavailable`: they are
    deployment faults that an operator fixes, not properties of the job.
    """
    try:
        yield
    except ClientError as exc:
        code = _error_code(exc)
        if code in _NOT_FOUND_CODES:
            raise ObjectNotFound(f"{action}: no such object") from None
        raise StorageUnavailable(f"{action}: S3 error {code or '?'}: {exc}") from exc
    except BotoCoreError as exc:
        raise StorageUnavailable(f"{action}: {exc}") from exc


def _error_code(exc: ClientError) -> str:
    response: dict[str, Any] = exc.response
    return str(response.get("Error", {}).get("Code", ""))


def _md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


def _content_type(key: str) -> str:
    return mimetypes.guess_type(key)[0] or "application/octet-stream"


def _content_disposition(filename: str) -> str:
    """`attachment` with an ASCII fallback name and the exact name in RFC 5987 form."""
    fallback = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename
    )
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


class S3Storage:
    """Objects at `s3://<bucket>/<prefix>/<key>`.

    `stage` uploads under a hidden temporary key next to the final one (`<dir>/.<name>.tmp-<hex>`);
    `commit` is CopyObject temp → final (atomic per object: the final key only ever holds a
    complete object) followed by DeleteObject of the temp. CopyObject refuses sources above
    5 GiB, so `commit` does too (`ValueError`); `put_bytes` has no such bound, since it uploads
    straight to the final key (PutObject and CompleteMultipartUpload are themselves atomic).
    Uploads above `MULTIPART_THRESHOLD` go in parts and are aborted on any failure, so no
    orphan parts remain. Every upload carries Content-MD5 (and botocore's default CRC32 where
    `request_checksum_calculation` is `when_supported`), so S3 rejects a corrupted body.

    One client, created on first use and kept until `close()`. `region=None` takes the region
    from the AWS config chain (AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config), else us-east-1.
    A custom `endpoint_url` (MinIO, moto, ...) uses path-style addressing. The credentials need
    s3:ListBucket as well as Get/Put/DeleteObject: without it S3 answers 403, not 404, for a
    missing key, and that surfaces as `StorageUnavailable` instead of `ObjectNotFound`.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = "us-east-1",
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        max_attempts: int = 3,
        refresh_after_s: float = S3_REFRESH_AFTER_S,
        list_page_size: int = 1000,
    ) -> None:
        if not bucket:
            raise ValueError("S3Storage needs a bucket name")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            validate_key(self.prefix)
        self.endpoint_url = endpoint_url or None
        self.region = region
        self.refresh_after_s = refresh_after_s
        self.list_page_size = list_page_size
        self._config = AioConfig(
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            signature_version="s3v4",  # botocore may presign with SigV2, which S3 is retiring
            s3={"addressing_style": "path"} if self.endpoint_url else None,
        )
        self._stack: AsyncExitStack | None = None
        self._s3: Any = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        where = f" via {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3Storage(s3://{self.bucket}/{self.prefix}{where})"

    # -- client lifecycle ------------------------------------------------------------------

    async def _client(self) -> Any:
        if self._s3 is not None:
            return self._s3
        async with self._lock:
            if self._s3 is None:
                session = AioSession()
                region = self.region or session.get_config_variable("region") or "us-east-1"
                stack = AsyncExitStack()
                try:
                    self._s3 = await stack.enter_async_context(
                        session.create_client(
                            "s3",
                            region_name=region,
                            endpoint_url=self.endpoint_url,
                            config=self._config,
                        )
                    )
                except BaseException:
                    await stack.aclose()
                    raise
                self._stack = stack
        return self._s3

    async def close(self) -> None:
        """Close the client and its connection pool; the next call opens a new one."""
        async with self._lock:
            stack, self._stack, self._s3 = self._stack, None, None
            if stack is not None:
                await stack.aclose()

    # -- keys ------------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        """Bucket key of a storage key (validated)."""
        return self._raw(validate_key(key))

    def _raw(self, key: str) -> str:
        """Bucket key of a key this backend generated itself (temporary keys are hidden)."""
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- Storage protocol --------------------------------------------------------------------

    async def get_bytes(self, key: str) -> bytes:
        return await self._get(self._full(key), f"reading {key!r}")

    async def put_bytes(self, key: str, data: bytes) -> None:
        """Upload straight to the final key: S3 never exposes a partially written object."""
        full = self._full(key)
        with _translate(f"writing {key!r}"):
            await self._upload(full, data, _content_type(key))

    async def stage(self, key: str, data: bytes) -> Staged:
        path = PurePosixPath(validate_key(key))
        temp = path.with_name(f".{path.name}{TEMP_MARKER}{secrets.token_hex(6)}")
        with _translate(f"staging {key!r}"):
            # The final key's type: CopyObject carries it over on commit.
            await self._upload(self._raw(str(temp)), data, _content_type(key))
        return Staged(key, str(temp), len(data))

    async def read_staged(self, staged: Staged) -> bytes:
        return await self._get(self._raw(staged.temp_key), f"reading staged {staged.key!r}")

    async def commit(self, staged: Staged) -> None:
        if staged.size > COPY_OBJECT_LIMIT:
            raise ValueError(
                f"cannot commit {staged.key!r}: {staged.size} bytes exceed CopyObject's 5 GiB "
                "limit (use put_bytes for objects this large)"
            )
        s3 = await self._client()
        temp = self._raw(staged.temp_key)
        with _translate(f"committing {staged.key!r}"):
            await s3.copy_object(
                Bucket=self.bucket,
                Key=self._full(staged.key),
                CopySource={"Bucket": self.bucket, "Key": temp},
                # A fresh whole-object CRC32 (not a multipart source's per-part composite), so
                # botocore verifies every later GET of the final key end to end.
                **self._checksum_algorithm(s3),
            )
        try:
            await s3.delete_object(Bucket=self.bucket, Key=temp)
        except (BotoCoreError, ClientError) as exc:
            # The object is committed; the leftover temp is garbage for sweep_temp.
            log.warning("storage.temp_not_deleted", key=temp, error=str(exc))

    async def discard(self, staged: Staged) -> None:
        s3 = await self._client()
        with _translate(f"discarding staged {staged.key!r}"):
            await s3.delete_object(Bucket=self.bucket, Key=self._raw(staged.temp_key))

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        """HEAD then PUT: content-addressed keys make the race harmless (same bytes). An
        existing object older than `refresh_after_s` is copied onto itself, which moves its
        LastModified to now (retention then sees it as new); gone by then (retention deleted
        it after the HEAD), it is written anew."""
        modified = await self.modified_at(key)
        if modified is not None:
            if time.time() - modified < self.refresh_after_s:
                return False
            full = self._full(key)
            s3 = await self._client()
            try:
                with _translate(f"refreshing {key!r}"):
                    await s3.copy_object(
                        Bucket=self.bucket,
                        Key=full,
                        CopySource={"Bucket": self.bucket, "Key": full},
                        MetadataDirective="REPLACE",
                        ContentType=_content_type(key),
                    )
                return False
            except ObjectNotFound:
                pass
        await self.put_bytes(key, data)
        return True

    async def exists(self, key: str) -> bool:
        return await self.modified_at(key) is not None

    async def modified_at(self, key: str) -> float | None:
        s3 = await self._client()
        try:
            with _translate(f"checking {key!r}"):
                head = await s3.head_object(Bucket=self.bucket, Key=self._full(key))
        except ObjectNotFound:
            return None
        return float(head["LastModified"].timestamp())

    async def list_objects(self, prefix: str, after: str = "") -> AsyncIterator[ObjectInfo]:
        """ListObjectsV2 pages (`list_page_size` keys each) in S3's key order (UTF-8 bytes), from
        StartAfter `after`; staged temporaries left out."""
        s3 = await self._client()
        listing = f"{self._full(prefix)}/"
        strip = len(self.prefix) + 1 if self.prefix else 0
        extra = {"StartAfter": self._full(after)} if after else {}
        paginator = s3.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=self.bucket,
            Prefix=listing,
            PaginationConfig={"PageSize": self.list_page_size},
            **extra,
        )
        with _translate(f"listing {prefix!r}"):
            async for page in pages:
                for obj in page.get("Contents", []):
                    key = str(obj["Key"])[strip:]
                    if TEMP_MARKER in key.rsplit("/", 1)[-1]:
                        continue
                    yield ObjectInfo(key, float(obj["LastModified"].timestamp()))

    async def delete(self, key: str) -> None:
        s3 = await self._client()
        with _translate(f"deleting {key!r}"):
            await s3.delete_object(Bucket=self.bucket, Key=self._full(key))

    async def sweep_temp(self, prefix: str) -> int:
        """Delete temporary objects directly under `prefix` (not in sub-"directories", like the
        local backend: a sweep of a parent must not remove another writer's in-flight stage)."""
        s3 = await self._client()
        listing = f"{self._full(prefix)}/"
        swept = 0
        with _translate(f"sweeping {prefix!r}"):
            paginator = s3.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=self.bucket, Prefix=listing, Delimiter="/")
            async for page in pages:
                stale = [
                    {"Key": obj["Key"]}
                    for obj in page.get("Contents", [])
                    if TEMP_MARKER in obj["Key"][len(listing) :]
                ]
                if not stale:
                    continue
                result = await s3.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": stale, "Quiet": True}
                )
                errors = result.get("Errors", [])
                if errors:
                    raise StorageUnavailable(
                        f"sweeping {prefix!r}: {len(errors)} deletes failed, e.g. {errors[0]}"
                    )
                swept += len(stale)
        return swept

    # -- S3-only ---------------------------------------------------------------------------

    async def presigned_get_url(
        self, key: str, expires_s: int = 3600, filename: str | None = None
    ) -> str:
        """A time-limited GET URL for `key` (the gateway redirects to it); with `filename`, the
        response carries `Content-Disposition: attachment` under that name. Signing is local:
        it neither checks that the object exists nor contacts S3."""
        s3 = await self._client()
        params: dict[str, str] = {"Bucket": self.bucket, "Key": self._full(key)}
        if filename is not None:
            params["ResponseContentDisposition"] = _content_disposition(filename)
        with _translate(f"presigning {key!r}"):
            url = await s3.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_s)
        return str(url)

    async def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (tests and development stacks)."""
        s3 = await self._client()
        with _translate(f"creating bucket {self.bucket!r}"):
            try:
                await s3.head_bucket(Bucket=self.bucket)
                return
            except ClientError as exc:
                if _error_code(exc) not in _BUCKET_MISSING_CODES:
                    raise
            region = s3.meta.region_name
            extra: dict[str, Any] = {}
            if region and region != "us-east-1":
                extra["CreateBucketConfiguration"] = {"LocationConstraint": region}
            try:
                await s3.create_bucket(Bucket=self.bucket, **extra)
            except ClientError as exc:
                if _error_code(exc) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                    raise

    # -- internals -------------------------------------------------------------------------

    async def _get(self, full_key: str, action: str) -> bytes:
        s3 = await self._client()
        with _translate(action):
            response = await s3.get_object(Bucket=self.bucket, Key=full_key)
            async with response["Body"] as body:
                data = await body.read()
        return bytes(data)

    async def _upload(self, full_key: str, data: bytes, content_type: str) -> None:
        s3 = await self._client()
        if len(data) > MULTIPART_THRESHOLD:
            await self._upload_multipart(s3, full_key, data, content_type)
            return
        await s3.put_object(
            Bucket=self.bucket,
            Key=full_key,
            Body=data,
            ContentLength=len(data),
            ContentMD5=_md5_b64(data),
            ContentType=content_type,
        )

    @staticmethod
    def _checksum_algorithm(s3: Any) -> dict[str, str]:
        """`ChecksumAlgorithm=CRC32` unless botocore is configured for checksums `when_required`
        (AWS_REQUEST_CHECKSUM_CALCULATION: S3-compatible stores without flexible checksums)."""
        if s3.meta.config.request_checksum_calculation == "when_supported":
            return {"ChecksumAlgorithm": "CRC32"}
        return {}

    async def _upload_multipart(
        self, s3: Any, full_key: str, data: bytes, content_type: str
    ) -> None:
        """Parts of `PART_SIZE`; on any failure (cancellation included) the upload is aborted."""
        # Like s3transfer: declare CRC32 for the upload so each part's checksum is verified
        # and listed on completion.
        checksum = self._checksum_algorithm(s3)
        created = await s3.create_multipart_upload(
            Bucket=self.bucket, Key=full_key, ContentType=content_type, **checksum
        )
        upload_id = created["UploadId"]
        try:
            parts: list[dict[str, Any]] = []
            for number, offset in enumerate(range(0, len(data), PART_SIZE), start=1):
                chunk = data[offset : offset + PART_SIZE]
                uploaded = await s3.upload_part(
                    Bucket=self.bucket,
                    Key=full_key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=chunk,
                    ContentLength=len(chunk),
                    ContentMD5=_md5_b64(chunk),
                    **checksum,
                )
                part: dict[str, Any] = {"PartNumber": number, "ETag": uploaded["ETag"]}
                if "ChecksumCRC32" in uploaded and checksum:
                    part["ChecksumCRC32"] = uploaded["ChecksumCRC32"]
                parts.append(part)
            await s3.complete_multipart_upload(
                Bucket=self.bucket,
                Key=full_key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            try:
                await s3.abort_multipart_upload(
                    Bucket=self.bucket, Key=full_key, UploadId=upload_id
                )
            except (BotoCoreError, ClientError) as exc:
                # Unreachable S3: the parts stay until a bucket lifecycle rule
                # (AbortIncompleteMultipartUpload) removes them.
                log.warning("storage.multipart_abort_failed", key=full_key, error=str(exc))
            raise
