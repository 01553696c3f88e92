"""A worker's writes of what its runs produced: every finished run's commit (finish.lua),
batched with every other one ready at the same moment into one round trip (`Batcher`), and a
stage's advance (advance.lua); each resent until its answer is definite. A lost reply or a
transient error reply (OOM, READONLY) is resent with the same request id, which the script
recognises in the job's `last_commit` and answers as the first execution did; the run's lease
token stays valid meanwhile (the heartbeat re-takes a lapsed lease nobody else took)."""

from __future__ import annotations

from typing import Any

from splatq.shared.backoff import Backoff
from splatq.shared.engine.batcher import Batcher
from splatq.shared.engine.fleet import REDIS_ERRORS
from splatq.shared.engine.metrics import EngineMetrics
from splatq.shared.engine.queue_types import Advance, Finish
from splatq.shared.engine.runs import Runs

# The longest wait between two resends of one commit.
RESEND_CAP_S = 2.0


class Committer:
    def __init__(self, runs: Runs, log: Any, metrics: EngineMetrics | None) -> None:
        self.queue = runs
        self.log = log
        self.metrics = metrics
        self._batches: Batcher[Finish, tuple[str, str]] = Batcher(self._commit_batch)

    async def run(self) -> None:
        """The batching loop (a worker's task, until cancelled)."""
        await self._batches.run()

    async def join(self) -> None:
        """Until every commit handed over so far has been sent and answered."""
        await self._batches.join()

    def queued(self) -> int:
        return self._batches.queued()

    async def commit(self, finish: Finish) -> tuple[str, str]:
        """One outcome's commit: (outcome, detail), definite."""
        return await self._batches.submit(finish)

    async def advance(self, request: Advance) -> tuple[str, str]:
        """A stage's advance: (result, detail), definite."""
        backoff = Backoff(cap_s=RESEND_CAP_S)
        while True:
            try:
                result, detail = await self.queue.advance(request)
            except REDIS_ERRORS as exc:
                result, detail = "retry", str(exc)
            if result not in ("retry", "transient"):
                return result, detail
            self.log.warning("advance.resend", error=detail[:300])
            await backoff.sleep()

    async def _commit_batch(self, batch: list[Finish]) -> list[tuple[str, str]]:
        """Send a batch until each call has a definite answer."""
        answers: dict[int, tuple[str, str]] = {}
        todo = list(range(len(batch)))
        backoff = Backoff(cap_s=RESEND_CAP_S)
        while todo:
            try:
                results = await self.queue.finish_many([batch[i] for i in todo])
            except REDIS_ERRORS as exc:
                self.log.warning("commit.redis_unavailable", error=str(exc), jobs=len(todo))
                results = [("retry", str(exc))] * len(todo)
            except Exception as exc:
                self.log.exception("commit.failed", jobs=len(todo))
                results = [("error", str(exc))] * len(todo)
            retry: list[int] = []
            for i, (outcome, detail) in zip(todo, results, strict=True):
                if outcome == "retry":
                    retry.append(i)
                elif outcome == "transient":
                    # OOM, READONLY...: the script did not run; the same call is sent again.
                    retry.append(i)
                    self.log.warning("commit.error_reply", error=detail[:300])
                    if self.metrics is not None:
                        self.metrics.error_replies.labels("commit", "transient").inc()
                else:
                    answers[i] = (outcome, detail)
            todo = retry
            if todo:
                await backoff.sleep()
        return [answers[i] for i in range(len(batch))]
