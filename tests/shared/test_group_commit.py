"""Group-committed local writes (the gateway's input objects): create-if-absent semantics under
concurrency, errors isolated to their write, the idle thread's exit, and a SIGKILL mid-batch
leaving no partial object under a final name."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from splatq.shared.storage import group_commit
from splatq.shared.storage.files import TEMP_MARKER
from splatq.shared.storage.group_commit import GroupCommitWriter, _Write
from splatq.shared.storage.store import LocalFileStorage
from splatq.shared.testing import eventually
from tests.helpers import REPO_ROOT


def _temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if TEMP_MARKER in p.name]


def _blob(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (1 + i % 50)


@pytest.mark.parametrize("use_syncfs", [True, False])
async def test_concurrent_writes_all_land_once_and_whole(tmp_path: Path, use_syncfs: bool) -> None:
    writer = GroupCommitWriter(tmp_path, use_syncfs=use_syncfs)
    try:
        paths = [tmp_path / "in" / f"{i % 7}" / f"{i}.bin" for i in range(200)]
        results = await asyncio.gather(
            *(writer.put_if_absent(p, _blob(i)) for i, p in enumerate(paths))
        )
        assert results == [True] * 200
        for i, p in enumerate(paths):
            assert p.read_bytes() == _blob(i)
        # Same keys again: nothing is written.
        again = await asyncio.gather(*(writer.put_if_absent(p, b"other") for p in paths[:20]))
        assert again == [False] * 20
        assert paths[0].read_bytes() == _blob(0)
        assert _temporaries(tmp_path) == []
    finally:
        writer.close()


async def test_one_key_written_concurrently_is_written_once(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    results = await asyncio.gather(
        *(storage.put_if_absent("inputs/ab/same.png", b"x" * 1000) for _ in range(25))
    )
    assert results.count(True) == 1
    assert (tmp_path / "inputs/ab/same.png").read_bytes() == b"x" * 1000


async def test_one_key_twice_in_one_batch_is_written_once(tmp_path: Path) -> None:
    """Two identical uploads in one batch: one True, one False (the gateway deletes an input
    it wrote itself when the enqueue is refused, so only one may think it did)."""
    writer = GroupCommitWriter(tmp_path)
    loop = asyncio.get_running_loop()
    batch = [_Write(tmp_path / "k", data, loop, loop.create_future()) for data in (b"1", b"2")]
    writer._commit(batch)  # one batch, as the writer thread forms it
    assert [await w.done for w in batch] == [True, False]
    assert (tmp_path / "k").read_bytes() == b"1"


async def test_a_failing_write_fails_alone(tmp_path: Path) -> None:
    """A path that cannot be created raises OSError for its caller; the rest of the batch
    lands."""
    (tmp_path / "blocker").write_bytes(b"a file where a directory should be")
    writer = GroupCommitWriter(tmp_path)
    try:
        good = [writer.put_if_absent(tmp_path / f"ok{i}", b"data") for i in range(10)]
        bad = writer.put_if_absent(tmp_path / "blocker" / "child", b"data")
        *oks, failure = await asyncio.gather(*good, bad, return_exceptions=True)
        assert oks == [True] * 10
        assert isinstance(failure, OSError)
        assert not (tmp_path / "blocker").is_dir()
    finally:
        writer.close()


async def test_the_idle_thread_exits_and_the_next_write_starts_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_commit, "IDLE_EXIT_S", 0.05)
    writer = GroupCommitWriter(tmp_path)
    assert await writer.put_if_absent(tmp_path / "a", b"1")

    async def idle() -> bool:
        return writer._thread is None

    await eventually(idle, timeout=5)
    assert await writer.put_if_absent(tmp_path / "b", b"2")
    assert (tmp_path / "b").read_bytes() == b"2"
    writer.close()


WRITER_SCRIPT = """
import asyncio, hashlib, sys
from pathlib import Path
from splatq.shared.storage.store import LocalFileStorage

async def main() -> None:
    storage = LocalFileStorage(Path(sys.argv[1]))
    i = 0
    while True:
        batch = []
        for _ in range(32):
            data = hashlib.sha256(str(i).encode()).digest() * (1 + i % 300)
            key = f"inputs/{hashlib.sha256(data).hexdigest()}.bin"
            batch.append(storage.put_if_absent(key, data))
            i += 1
        await asyncio.gather(*batch)
        print(i, flush=True)

asyncio.run(main())
"""


@pytest.mark.slow
def test_sigkill_mid_batch_leaves_no_partial_object(tmp_path: Path) -> None:
    """Kill -9 a process writing batches: every object under a final name is whole (its name
    is its content's hash); temporaries are swept."""
    root = tmp_path / "objects"
    for round_ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER_SCRIPT, str(root)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        assert proc.stdout is not None
        for _ in range(round_ + 1):  # let some batches commit; the kill lands in the next
            proc.stdout.readline()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finals = [p for p in (root / "inputs").iterdir() if TEMP_MARKER not in p.name]
    assert len(finals) >= 32
    for p in finals:
        assert hashlib.sha256(p.read_bytes()).hexdigest() == p.stem, p
    asyncio.run(LocalFileStorage(root).sweep_temp("inputs"))
    assert _temporaries(root) == []
