"""The charging policy: what a job's end means for its tenant's GPU quota. Pure.

A job's work is metered per unit as its runs finish it (shared/engine/metering.py): each unit
once, with the time the run that did it measured, however often a retry or a redrive reuses it.
When the job ends the settler applies one verdict to the units the job holds then:

- **completed** and **canceled**: *charge* them. A canceled job was charged for the work done
  before the cancel landed (a cancel lands at the next stage boundary, so the stage that was
  running finishes its work; a progressive job's quick result is the tenant's to download).
- **failed** with a code in `charged_codes` (the input's own fault, or a poison job that
  crash attribution dead-lettered): *charge* them, like a completion.
- **failed** otherwise (a platform fault: out of memory, a timeout, lost intermediates, a
  bug): *waive* -- the reservation is given back and nothing is charged now. The units stay
  on the job: if it is redriven and completes, the work it reuses is charged then; a redrive
  with --from-stage discards the units of the stages it runs again, so wasted work is never
  charged.

Charging is per unit and once (the job's saga ledger records each unit it charged), so a
repeated event, a second terminal event after a redrive, or the sweep charging what an event
already did, adds nothing. The measured time is the only input: the reservation made at
submission decides admission, never the charge.
"""

from __future__ import annotations

from collections.abc import Set
from enum import StrEnum

from splatq.shared.engine.events import EventType


class Verdict(StrEnum):
    CHARGE = "charge"  # charge the job's metered units (each once) and close its reservation
    WAIVE = "waive"  # close its reservation, charge nothing now


def verdict_for_event(
    event_type: str, error_code: str, charged_codes: Set[str]
) -> tuple[Verdict, str] | None:
    """(verdict, outcome) for a job event, or None when the event ends nothing."""
    if event_type == EventType.COMPLETED:
        return Verdict.CHARGE, "completed"
    if event_type == EventType.CANCELED:
        return Verdict.CHARGE, "canceled"
    if event_type == EventType.FAILED:
        return verdict_for_failure(error_code, charged_codes), "failed"
    return None


def verdict_for_failure(error_code: str, charged_codes: Set[str]) -> Verdict:
    return Verdict.CHARGE if error_code in charged_codes else Verdict.WAIVE


def verdict_for_status(
    status: str | None, error_code: str, charged_codes: Set[str]
) -> tuple[Verdict, str] | None:
    """The same policy from a job's record (the sweep): None while the job is on its way;
    a record that is gone waives (nothing is known of its work)."""
    if status is None:
        return Verdict.WAIVE, "expired"
    if status in ("completed", "canceled"):
        return Verdict.CHARGE, status
    if status == "failed":
        return verdict_for_failure(error_code, charged_codes), "failed"
    return None
