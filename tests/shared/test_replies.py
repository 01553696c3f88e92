"""Every word the engine's job scripts answer with is a `Reply` member (a misspelt reply in Lua
fails here, not in a branch in production), and a run's reply maps to its exception."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from splatq.shared.engine.replies import Reply, run_reply
from splatq.shared.errors import LeaseLost

# `return {'word', ...}`, `return 'word'`, `local out = {'word', ...}`, and take's
# per-entry `{name, id, 'word', ...}`
_RETURNED = re.compile(r"(?:return|local out =) \{?'([a-z_]+)'")
_TAKE_ENTRY = re.compile(r"\{(?:stream_name|name), (?:entry_id|''), '([a-z_]+)'")


def _lua_sources() -> dict[str, str]:
    folder = resources.files("splatq.shared.engine") / "lua"
    return {p.name: p.read_text() for p in folder.iterdir() if p.name.endswith(".lua")}


def test_every_word_a_job_script_answers_with_is_a_reply() -> None:
    words: dict[str, set[str]] = {}
    for name, text in _lua_sources().items():
        for pattern in (_RETURNED, _TAKE_ENTRY):
            for word in pattern.findall(text):
                words.setdefault(word, set()).add(name)
    assert {"ok", "lease_lost", "started", "raw", "held", "created"} <= set(words)
    unknown = {w: sorted(f) for w, f in words.items() if w not in set(Reply)}
    assert unknown == {}
    # and no member is stale (finish_batch's per-job 'error' is built, not returned, there)
    assert set(Reply) - {Reply.ERROR} <= set(words)


def test_a_runs_reply_raises_when_the_run_lost_its_job() -> None:
    assert run_reply("job_1", "ok") is Reply.OK
    assert run_reply("job_1", "cancel_requested") is Reply.CANCEL_REQUESTED
    with pytest.raises(LeaseLost):
        run_reply("job_1", "lease_lost")
    with pytest.raises(ValueError, match="not_a_reply"):
        run_reply("job_1", "not_a_reply")
