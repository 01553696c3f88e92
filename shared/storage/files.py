"""Small local-file primitives shared by the storage backend and the group-commit writer:
temporary names, a whole-file write (optionally fsynced), and a durable create-if-absent.
Synchronous; callers run them off the event loop."""

from __future__ import annotations

import itertools
import os
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
