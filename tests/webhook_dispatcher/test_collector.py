"""The collector setting a running dispatcher uses is put back when the last one stops."""

from __future__ import annotations

import gc

from splatq.services.webhook_dispatcher.collector import YOUNG_THRESHOLD, tuned_collector


def test_the_collector_is_tuned_while_dispatchers_run_and_put_back_after() -> None:
    before = gc.get_threshold()
    with tuned_collector():
        assert gc.get_threshold()[0] == max(YOUNG_THRESHOLD, before[0])
        assert gc.get_freeze_count() > 0
        with tuned_collector():  # a second dispatcher in the same process
            pass
        assert gc.get_threshold()[0] == max(YOUNG_THRESHOLD, before[0])  # the first still runs
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
