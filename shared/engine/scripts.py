"""Loads the Lua scripts in `shared/engine/lua/`, prefixed with the generated transition table.

Runs them by SHA with one reload-and-retry when Redis answers NOSCRIPT (after a restart the
script cache is empty), and makes every script that writes safe to resend: it must not hold
any business logic itself.

Why resends happen: a reply lost after Redis ran the script (a cut connection, a timeout)
makes redis-py's retry -- or a caller's own retry loop -- send the same EVALSHA again. Each
such script is wrapped in a *replay memo*: the first execution stores its reply under a
request id chosen once per logical call (`ScriptCall.request_id`), in the same hash slot as
the script's first key, and a resend with that id gets the stored reply back instead of
running twice. The memo lives `replay_ttl_ms`; a resend later than that runs the script
again, which each script's own compare-and-set checks keep harmless.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from splatq.shared.backoff import Backoff
from splatq.shared.engine.events import EVENT_NAMESPACE
from splatq.shared.engine.history import lua_constants as history_lua_constants
from splatq.shared.engine.states import lua_transition_table
from splatq.shared.redis.replay import replay_key

Arg = str | int | float | bytes
_INCLUDE = re.compile(r"^--@include ([a-z_]+) as ([A-Za-z_]\w*)$", re.MULTILINE)
ARG_TYPES = frozenset({str, int, float, bytes})
DEFAULT_REPLAY_TTL_MS = 60_000
DEFAULT_JOB_RETENTION_MS = 7 * 24 * 3600 * 1000


def _retention_constant(job_retention_ms: int) -> str:
    """The record retention (SPLATQ_JOB_RETENTION_S) as a Lua constant the helpers use (the
    job's event history TTL, the listing index trim): generated, like the transition table,
    so every script that emits an event gets it without another argument."""
    if job_retention_ms <= 0:
        raise ValueError("job_retention_ms must be positive")
    return (
        "-- The job record retention in ms (generated from SPLATQ_JOB_RETENTION_S).\n"
        f"local JOB_RETENTION_MS = {int(job_retention_ms)}\n"
    )


def _event_prefix_constant() -> str:
    """The event names' namespace as a Lua constant: a history item stores an event's name
    without it (shared/engine/history.py puts it back)."""
    return (
        "-- The event names' namespace (generated from shared/engine/events.py).\n"
        f"local EVENT_PREFIX = '{EVENT_NAMESPACE}.'\n"
    )


class LuaScript(StrEnum):
    """A family of Lua scripts: one member per file `<PACKAGE>/lua/<value>.lua`, owned by the
    package that runs them (the engine's job scripts here, the webhooks' and the scheduled
    maintenance's in theirs). A store registers its family with the runner it uses
    (`ScriptRunner.register`); every family gets the engine's Lua helpers."""

    @classmethod
    def package(cls) -> str:
        raise NotImplementedError

    @property
    def replay_safe(self) -> bool:
        """True when the script is safe to resend without the generic replay memo (so it
        skips the memo's extra GET, SET and JSON encoding); the default is memoized."""
        return False

    @classmethod
    def helper_source(cls) -> str:
        """Lua helpers of this family's own (`<PACKAGE>/lua/_helpers.lua` when it exists),
        included per script like the engine's: each script gets those it names."""
        path = resources.files(cls.package()) / "lua" / "_helpers.lua"
        return path.read_text() if path.is_file() else ""

    def source(self) -> str:
        """The script's text, with each `--@include <script> as <name>` line replaced by
        that script of the same package wrapped as `local function <name>(KEYS, ARGV)`: one
        script's logic run many times by another (finish_batch runs finish per job)."""
        text = self._text(self.value)
        return _INCLUDE.sub(
            lambda m: f"local function {m.group(2)}(KEYS, ARGV)\n{self._text(m.group(1))}\nend\n",
            text,
        )

    def _text(self, name: str) -> str:
        return (resources.files(self.package()) / "lua" / f"{name}.lua").read_text()


class Script(LuaScript):
    """The engine's job scripts (shared/engine/lua/)."""

    ENQUEUE = "enqueue"
    CLAIM = "claim"
    START = "start"
    TAKE = "take"
    RENEW = "renew"
    PROGRESS = "progress"
    FINISH = "finish"
    # Many finishes of one partition in one call (finish.lua's logic per job).
    FINISH_BATCH = "finish_batch"
    ADVANCE = "advance"
    CLEANUP_DONE = "cleanup_done"
    ANNOUNCE = "announce"
    METER = "meter"
    # A running job's own notes (a remote backend's prediction id, its upstream's request id).
    NOTE = "note"
    RECLAIM = "reclaim"
    PROMOTE = "promote"
    CANCEL = "cancel"
    DEAD_LETTER_ENTRY = "dead_letter_entry"
    PRUNE_CONSUMERS = "prune_consumers"
    RATE_LIMIT = "rate_limit"
    # A job's events after a point (SSE, `Prefer: wait`), registering a watcher when none.
    HISTORY = "history"
    REDRIVE = "redrive"
    FLEET_TICK = "fleet_tick"

    @classmethod
    def package(cls) -> str:
        return "splatq.shared.engine"

    @property
    def replay_safe(self) -> bool:
        return self in _REPLAY_SAFE


# Safe to resend on their own: pure compare-and-set (renew, prune_consumers, the fleet
# clock); a rate limiter (a resend at worst takes one more token: not worth
# a GET, a SET and a JSON encoding on every submission); or made safe more cheaply on the
# hot path -- enqueue (a resend finds its own fresh job id and answers 'exists', which
# JobQueue.enqueue resolves by reading that job), finish and advance (the job hash's `last_commit`
# field), announce and meter (the field they write once), take (a compact memo of entry ids,
# not job hashes).
# Everything else is memoized: a resend must answer what the first execution did.
_REPLAY_SAFE = frozenset({
    Script.RENEW, Script.PRUNE_CONSUMERS, Script.ENQUEUE, Script.FINISH, Script.FINISH_BATCH,
    Script.ADVANCE, Script.CLEANUP_DONE, Script.ANNOUNCE, Script.METER, Script.TAKE,
    Script.FLEET_TICK, Script.RATE_LIMIT, Script.HISTORY,
})  # fmt: skip

# The memo wrapper: the request's memo key is the last KEYS entry and its TTL the last ARGV
# entry; both are removed before the body runs, so bodies see exactly their own arguments.
_MEMO_HEAD = """
local __memo_key = KEYS[#KEYS]
KEYS[#KEYS] = nil
local __memo_ttl = ARGV[#ARGV]
ARGV[#ARGV] = nil
local __prior = redis.call('GET', __memo_key)
if __prior then return cjson.decode(__prior) end
local __reply = (function()
"""
_MEMO_TAIL = """
end)()
redis.call('SET', __memo_key, cjson.encode(__reply), 'PX', __memo_ttl)
return __reply
"""


# Request ids: a random per-process prefix and a counter -- unique across processes without
# a system call per script call (this is on the hot path of every commit).
_REQUEST_PREFIX = secrets.token_hex(8)
_request_counter = itertools.count(1)


def new_request_id() -> str:
    return f"{_REQUEST_PREFIX}{next(_request_counter):x}"


def _preamble() -> str:
    return (resources.files("splatq.shared.engine") / "lua" / "_preamble.lua").read_text()


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One script invocation: which script, its KEYS and its ARGV."""

    script: LuaScript
    keys: Sequence[str]
    args: Sequence[Arg]
    # One id per logical call, kept across every resend of it (see the module docstring);
    # given to the memoized scripts only (the others need none).
    request_id: str = ""

    def __post_init__(self) -> None:
        if not self.request_id and not self.script.replay_safe:
            object.__setattr__(self, "request_id", new_request_id())

    def problem(self) -> TypeError | None:
        """Why this call cannot be sent (an argument Redis cannot encode), or None. Checked
        before packing, so one bad call fails alone instead of failing its whole pipeline."""
        if ARG_TYPES.issuperset(map(type, self.args)):  # the fast path, in C
            return None
        for i, a in enumerate(self.args):
            if type(a) not in ARG_TYPES:
                return TypeError(
                    f"{self.script.value}: argument {i + 1} is {type(a).__name__}, not str/int/"
                    "float/bytes"
                )
        return None


class ScriptRunner:
    """Runs scripts singly or many per round trip (a pipeline of EVALSHA)."""

    def __init__(
        self,
        redis: Redis,
        replay_ttl_ms: int = DEFAULT_REPLAY_TTL_MS,
        job_retention_ms: int = DEFAULT_JOB_RETENTION_MS,
    ) -> None:
        self._base_helpers = (
            lua_transition_table()
            + _retention_constant(job_retention_ms)
            + _event_prefix_constant()
            + history_lua_constants()
            + _preamble()
        )
        self._helpers = LuaHelpers(self._base_helpers)
        self._redis = redis
        self._cluster = isinstance(redis, RedisCluster)
        self._replay_ttl_ms = replay_ttl_ms
        self._bodies: dict[LuaScript, str] = {}
        self._shas: dict[LuaScript, str] = {}
        self._families: set[type[LuaScript]] = set()
        self.register(Script)

    def register(self, family: type[LuaScript]) -> None:
        """Add a family of scripts (idempotent). Each script carries only the helpers it uses
        (and theirs): Redis runs the whole text on every call, so an unused helper costs every
        call its definition. A family registered after `load` is loaded by its first call's
        NOSCRIPT (run_many reloads every registered script then)."""
        if family in self._families:
            return
        taken = {s.value for s in self._bodies}
        clash = sorted(taken & {s.value for s in family})
        if clash:
            raise ValueError(f"{family.__name__}: script names already registered: {clash}")
        own = family.helper_source()
        helpers = LuaHelpers(self._base_helpers + "\n" + own) if own else self._helpers
        for script in family:
            body = helpers.include_for(_wrap(script, script.source()))
            self._bodies[script] = body
            self._shas[script] = hashlib.sha1(body.encode()).hexdigest()
        self._families.add(family)

    def sha(self, script: LuaScript) -> str:
        """The SHA1 an EVALSHA of `script` names (its family registered if it was not)."""
        self.register(type(script))
        return self._shas[script]

    async def load(self) -> None:
        """SCRIPT LOAD everything (idempotent); also called after a NOSCRIPT. One call per
        script, not a pipeline: a cluster client sends SCRIPT LOAD to every primary, which it
        refuses to do inside a pipeline."""
        for body in self._bodies.values():
            await self._redis.script_load(body)

    async def run(self, call: ScriptCall, resend_for_s: float = 0.0) -> Any:
        return (await self.run_many([call], resend_for_s))[0]

    async def run_many(self, calls: Sequence[ScriptCall], resend_for_s: float = 0.0) -> list[Any]:
        """Results in call order; a per-call Redis error is returned as the exception object.

        With `resend_for_s`, a connection error or timeout (the reply may be lost after the
        scripts ran) resends the very same calls -- same request ids, so the replay memo
        answers -- until that many seconds have passed; then the error is raised."""
        if not calls:
            return []
        try:
            results = await self._send(calls, resend_for_s)
        except (TypeError, DataError):
            # An argument Redis cannot encode. Commands are packed before anything is sent,
            # so nothing ran: each bad call fails alone and the others are sent.
            results = [c.problem() for c in calls]
            good = [i for i, r in enumerate(results) if r is None]
            if len(good) == len(calls):
                raise
            sent = await self._send([calls[i] for i in good], resend_for_s)
            for i, r in zip(good, sent, strict=True):
                results[i] = r
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            # Only the NOSCRIPT calls did not run; re-running exactly those is safe.
            await self.load()
            retried = await self._execute([calls[i] for i in missing])
            for i, r in zip(missing, retried, strict=True):
                results[i] = r
        return results

    async def _send(self, calls: Sequence[ScriptCall], resend_for_s: float) -> list[Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + resend_for_s
        backoff = Backoff()
        while True:
            try:
                return await self._execute(calls)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                if loop.time() + backoff.delay_s > deadline:
                    raise
                await backoff.sleep()

    def _command(self, call: ScriptCall) -> list[Any]:
        """EVALSHA's arguments: the memoized scripts get their memo key and TTL appended."""
        if call.script.replay_safe:
            return [self._shas[call.script], len(call.keys), *call.keys, *call.args]
        memo = replay_key(call.keys[0], call.request_id)
        return [
            self._shas[call.script],
            len(call.keys) + 1,
            *call.keys,
            memo,
            *call.args,
            self._replay_ttl_ms,
        ]

    async def _evalsha(self, call: ScriptCall) -> Any:
        return await self._redis.evalsha(*self._command(call))  # type: ignore[misc]

    async def _execute(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if not calls:
            return []
        if self._cluster:
            # redis-py refuses EVALSHA in cluster pipelines; concurrent calls, each routed to
            # the node of its slot, keep the one-round-trip-per-batch property per node.
            return list(await asyncio.gather(
                *(self._evalsha(c) for c in calls),
                return_exceptions=True,
            ))  # fmt: skip
        pipe = self._redis.pipeline(transaction=False)
        for c in calls:
            pipe.evalsha(*self._command(c))
        return list(await pipe.execute(raise_on_error=False))


_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)")
_WORD = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"--[^\n]*")


class LuaHelpers:
    """The shared Lua helpers (`_preamble.lua` and the generated transition table), cut into
    one chunk per top-level `local` definition with the comment above it, so that each script
    gets only the definitions it names, directly or through other helpers, in file order."""

    def __init__(self, source: str) -> None:
        lines = source.splitlines()
        starts = [i for i, line in enumerate(lines) if _DEFINITION.match(line)]
        bounds: list[int] = []
        for def_line in starts:
            first = def_line
            while first > 0 and lines[first - 1].startswith("--"):
                first -= 1
            bounds.append(max(first, bounds[-1] + 1) if bounds else first)
        self._chunks: list[tuple[str, str]] = []  # (defined name, text)
        for n, start in enumerate(bounds):
            end = bounds[n + 1] if n + 1 < len(bounds) else len(lines)
            text = "\n".join(lines[start:end]).rstrip() + "\n"
            match = _DEFINITION.match(lines[starts[n]])
            assert match is not None
            self._chunks.append((match.group(1), text))
        names = {name for name, _ in self._chunks}
        self._uses = {
            name: {w for w in _code_words(text) if w in names and w != name}
            for name, text in self._chunks
        }

    def include_for(self, body: str) -> str:
        needed = {w for w in _code_words(body) if w in self._uses}
        todo = list(needed)
        while todo:
            for dep in self._uses[todo.pop()]:
                if dep not in needed:
                    needed.add(dep)
                    todo.append(dep)
        head = "".join(text for name, text in self._chunks if name in needed)
        return head + "\n" + body


def _code_words(text: str) -> set[str]:
    """The identifiers of Lua code, comments left out (they name helpers they do not use)."""
    return set(_WORD.findall(_COMMENT.sub("", text)))


def _wrap(script: LuaScript, body: str) -> str:
    return body if script.replay_safe else _MEMO_HEAD + body + _MEMO_TAIL
