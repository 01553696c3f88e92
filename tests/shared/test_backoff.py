"""The shared backoff: doubling waits up to a cap, back to the first after a success."""

from __future__ import annotations

from splatq.shared.backoff import Backoff


def test_waits_double_up_to_the_cap_and_reset() -> None:
    backoff = Backoff(first_s=0.05, cap_s=0.3)
    assert [backoff.next() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    backoff.reset()
    assert backoff.next() == 0.05
