"""The local-filesystem storage backend: atomic commits, content-addressed puts, key safety."""

from __future__ import annotations

import os
import time

import pytest

from splatq.shared.storage.store import LocalFileStorage, ObjectNotFound, artifact_key, input_key


async def test_put_if_absent_writes_once_and_creates_directories(
    storage: LocalFileStorage,
) -> None:
    """The first put writes (creating nested directories); a repeat of the key writes nothing."""
    key = input_key("ab" * 32, "png")
    assert await storage.put_if_absent(key, b"first")
    assert not await storage.put_if_absent(key, b"second")
    assert await storage.get_bytes(key) == b"first"
    assert [p.name for p in storage.path_of(key).parent.iterdir()] == [f"{'ab' * 32}.png"]


async def test_staged_objects_are_invisible_until_committed(storage: LocalFileStorage) -> None:
    """stage writes a hidden temporary file; commit renames it into place; discard removes it."""
    key = artifact_key("job_000ABC", "scene.ply")
    staged = await storage.stage(key, b"ply bytes")
    assert not await storage.exists(key)
    assert await storage.read_staged(staged) == b"ply bytes"
    await storage.commit(staged)
    assert await storage.get_bytes(key) == b"ply bytes"
    other = await storage.stage(artifact_key("job_000ABC", "scene.splat"), b"x")
    await storage.discard(other)
    assert sorted(p.name for p in storage.path_of("jobs/job_000ABC").iterdir()) == ["scene.ply"]


async def test_sweep_removes_only_temporary_files(storage: LocalFileStorage) -> None:
    """A killed writer's temporary files are swept; committed objects stay."""
    await storage.put_bytes(artifact_key("job_000ABC", "preview.png"), b"png")
    await storage.stage(artifact_key("job_000ABC", "scene.ply"), b"partial")
    assert await storage.sweep_temp("jobs/job_000ABC") == 1
    assert [p.name for p in storage.path_of("jobs/job_000ABC").iterdir()] == ["preview.png"]


async def test_missing_objects_and_hostile_keys(storage: LocalFileStorage) -> None:
    """A missing key is ObjectNotFound; keys that escape the root or hide files are refused."""
    with pytest.raises(ObjectNotFound):
        await storage.get_bytes("inputs/none.png")
    for key in ("../etc/passwd", "/abs/path", "a/../../b", "a//b", ".hidden/x", "a/.x", ""):
        with pytest.raises(ValueError, match="invalid storage key"):
            storage.path_of(key)


async def test_put_if_absent_refreshes_the_age_of_an_existing_object(
    storage: LocalFileStorage,
) -> None:
    """An existing object is not rewritten, but its modification time moves to now (what
    retention's age judges), so a re-uploaded input counts as new."""
    key = "inputs/ab/refresh.png"
    assert await storage.put_if_absent(key, b"first")
    os.utime(storage.path_of(key), (1_000_000, 1_000_000))
    assert not await storage.put_if_absent(key, b"second")
    modified = await storage.modified_at(key)
    assert modified is not None
    assert time.time() - modified < 60
    assert await storage.get_bytes(key) == b"first"
    assert await storage.modified_at("inputs/ab/none.png") is None
