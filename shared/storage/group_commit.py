"""Group commit for small local-file writes: many create-if-absent writes made durable by one
flush of the filesystem instead of one `fsync` each.

The gateway stores every submitted image before it answers 202, and one `fsync` per image
caps it at the disk's flush rate (~1,500/s on the development VM, docs/benchmarks.md). Here a
dedicated thread takes every write queued at that moment, writes each to a temporary file,
flushes once (`syncfs(2)` on the root's filesystem), renames each into place, flushes once
more (the renames), and only then answers every caller, in one hand-off per event loop. Where
`syncfs` is missing (not Linux), each file and directory is fsynced instead: same guarantees,
no batching.

Crash safety: a caller is answered only after its object is durable under its final name; a
crash before that leaves at most a temporary file (swept by `LocalFileStorage.sweep_temp`),
never a partial object under a final name.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from splatq.shared.storage.files import temp_path, write_file

MAX_BATCH = 256
IDLE_EXIT_S = 30.0


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return syncfs


_SYNCFS = _load_syncfs()


@dataclass(slots=True)
class _Write:
    path: Path
    data: bytes
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[bool]
    temp: Path | None = None
    result: bool | BaseException = False


class GroupCommitWriter:
    """Durable create-if-absent writes under `root`, batched; one writer thread."""

    def __init__(self, root: Path, use_syncfs: bool = True) -> None:
        self.root = root
        self._syncfs = _SYNCFS if use_syncfs else None
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def put_if_absent(self, path: Path, data: bytes) -> bool:
        """Write `data` at `path` unless a file is there; True when this call wrote it.
        Raises OSError when the write or the flush failed (nothing is left at `path`)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        self._queue.put(_Write(path, data, loop, done))
        self._ensure_thread()  # after the put: an idle thread exiting now cannot miss it
        return await done

    def close(self) -> None:
        """Finish queued writes and stop the thread (idempotent)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    # -- the writer thread -------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        with self._lock:  # always: the thread clears `_thread` under this lock when idle
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="splatq-group-commit", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None  # the next write starts a new thread
                        return
                continue
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[_Write]) -> None:
        pending = []
        claimed: set[Path] = set()
        for w in batch:
            try:
                # The same object twice in one batch (concurrent identical uploads): the first
                # writes it, the others find it there, as they would one batch later.
                if w.path in claimed or w.path.is_file():
                    w.result = False
                    continue
                claimed.add(w.path)
                w.temp = self._write_temp(w.path, w.data)
                pending.append(w)
            except OSError as exc:
                w.result = exc
        try:
            self._flush([w.temp for w in pending if w.temp is not None])
            for w in pending:
                assert w.temp is not None
                os.replace(w.temp, w.path)
                w.temp = None
                w.result = True
            self._flush_renames([w.path for w in pending])
        except OSError as exc:
            for w in pending:
                # A renamed file holds complete, flushed data (only its name may not be
                # durable yet), so it stays; a caller's retry finds it.
                w.result = exc
                if w.temp is not None:
                    with contextlib.suppress(OSError):
                        w.temp.unlink()
        self._answer(batch)

    def _write_temp(self, path: Path, data: bytes) -> Path:
        temp = temp_path(path)
        write_file(temp, data, fsync=self._syncfs is None)
        return temp

    def _flush(self, temps: list[Path]) -> None:
        """Make the written data durable (the files were fsynced one by one without syncfs)."""
        if temps and self._syncfs is not None:
            self._syncfs_root()

    def _flush_renames(self, paths: list[Path]) -> None:
        if not paths:
            return
        if self._syncfs is not None:
            self._syncfs_root()
            return
        for directory in {p.parent for p in paths}:
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _syncfs_root(self) -> None:
        assert self._syncfs is not None
        fd = os.open(self.root, os.O_RDONLY)
        try:
            if self._syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"syncfs: {os.strerror(err)}")
        finally:
            os.close(fd)

    @staticmethod
    def _answer(batch: list[_Write]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Write]] = {}
        for w in batch:
            by_loop.setdefault(w.loop, []).append(w)
        for loop, writes in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, writes)


def _resolve(writes: list[_Write]) -> None:
    for w in writes:
        if w.done.done():
            continue
        if isinstance(w.result, BaseException):
            w.done.set_exception(w.result)
        else:
            w.done.set_result(w.result)
