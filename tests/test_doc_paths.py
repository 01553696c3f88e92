"""Every path the README and the architecture page name exists in the tree: a module map that
names files that are gone (it happened) fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/architecture.md")
# A path is a backticked word starting at one of the tree's top-level folders or files.
_TOP = r"(?:shared|services|tests|bench|k8s|docs|docker|\.ci)/"
_PATH = re.compile(r"`(" + _TOP + r"[\w./*-]*)`")


def named_paths(doc: str) -> list[str]:
    text = (ROOT / doc).read_text()
    return sorted({m.group(1).rstrip(".") for m in _PATH.finditer(text)})


def exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def test_the_docs_name_paths() -> None:
    # A pattern that matched nothing would pass the test below vacuously.
    assert len(named_paths("docs/architecture.md")) > 40
    assert "shared/engine/queue.py" in named_paths("docs/architecture.md")


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc: str) -> None:
    missing = [path for path in named_paths(doc) if not exists(path)]
    assert missing == []
