"""Small local-file primitives shared by the storage backend and the group-commit writer:
temporary names, a whole-file write (optionally fsynced), and a durable create-if-absent.
Synchronous; callers run them off the event loop."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

TEMP_MARKER = ".tmp-"
_TEMP_SEQ = itertools.count()


def temp_path(path: Path) -> Path:
    """A hidden sibling name for staging `path`, unique within this host's processes."""
    return path.with_name(f".{path.name}{TEMP_MARKER}{next(_TEMP_SEQ)}-{os.getpid()}")


def write_file(path: Path, data: bytes, fsync: bool = True) -> None:
    """Create or truncate `path` and write `data`, fsynced unless told otherwise. Directories
    are created only when missing: every system call counts on the submission path."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_if_absent(path: Path, data: bytes) -> bool:
    """One file, fsynced under a temporary name, renamed into place unless `path` exists;
    True when this call wrote it."""
    if path.is_file():
        return False
    temp = temp_path(path)
    write_file(temp, data)
    os.replace(temp, path)
    return True


def refresh_mtime(path: Path) -> bool:
    """Set `path`'s modification time to now; False when it does not exist (any more)."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    return True


def walk_files(root: Path, directory: Path, after: str) -> Iterator[tuple[str, float]]:
    """(key relative to `root`, mtime) of every file under `directory`, in key order by path
    segment, strictly after key `after`; staged temporaries and hidden names left out."""
    mark = tuple(after.split("/")) if after else ()
    yield from _walk(root, directory, mark)


def _walk(root: Path, directory: Path, mark: tuple[str, ...]) -> Iterator[tuple[str, float]]:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if TEMP_MARKER in entry.name or entry.name.startswith("."):
            continue
        path = Path(entry.path)
        parts = path.relative_to(root).parts
        if entry.is_dir(follow_symlinks=False):
            if not mark or parts >= mark[: len(parts)]:
                yield from _walk(root, path, mark)
        elif parts > mark:
            try:
                yield "/".join(parts), entry.stat().st_mtime
            except FileNotFoundError:
                continue
