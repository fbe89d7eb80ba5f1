"""The webhook rules of the fault checker on hand-made histories: a lost
event, an event for an outcome that did not happen, one id with two
bodies are caught; repeats of one event are not violations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from etcdsched.model.notify_events import event_id
from etcdsched.model.records import RunRecord, SkipRecord
from etcdsched.model.states import RunState
from tests.faults.test_checker import SEC, T0, attempt, run
from tests.faults.webhook_check import check_webhooks, expected_events, read_received
from tests.faults.workload import WEBHOOK


def post(eid: str, kind: str, subject: str, **body: Any) -> dict[str, Any]:
    return {"event_id": eid, "body": {"id": eid, "type": kind, "run": {"id": subject}, **body}}


def outcome_post(rec: RunRecord, kind: str) -> dict[str, Any]:
    return post(event_id(rec.id, rec.attempt, kind, WEBHOOK), kind, rec.id)


def skip(first_ms: int, reason: str = "overlap") -> SkipRecord:
    return SkipRecord(job_id="j", first_slot_ms=first_ms, last_slot_ms=first_ms, count=1,
                      reason=reason, created_ms=first_ms)  # fmt: skip


SUCCEEDED = run(T0, RunState.SUCCEEDED, [attempt(1, RunState.SUCCEEDED)])
FAILED = run(T0 + SEC, RunState.FAILED, [attempt(1, RunState.FAILED, exit_code=1),
                                          attempt(2, RunState.FAILED, exit_code=1)])  # fmt: skip
CANCELLED = run(T0 + 2 * SEC, RunState.CANCELLED, [])
RUNNING = run(T0 + 3 * SEC, RunState.RUNNING, [attempt(1, RunState.RUNNING)])


def test_every_subscribed_outcome_delivered_once_or_repeated_is_clean() -> None:
    runs = [SUCCEEDED, FAILED, CANCELLED, RUNNING]
    skips = [skip(T0 + 4 * SEC), skip(T0 + 5 * SEC, reason="paused")]
    subject = f"j@{T0 + 4 * SEC:014d}"
    posts = [
        outcome_post(SUCCEEDED, "run.succeeded"),
        outcome_post(FAILED, "run.failed"),
        outcome_post(FAILED, "run.failed"),  # a retry of the same event
        post(event_id(subject, 0, "slot.skipped", WEBHOOK), "slot.skipped", subject),
    ]
    report = check_webhooks(runs, skips, posts)
    assert report.violations == []
    assert (report.expected, report.delivered, report.posts, report.repeats) == (3, 3, 4, 1)
    assert "3 events expected" in report.summary()


def test_the_event_of_the_last_attempt_only_is_expected() -> None:
    (eid,) = expected_events([FAILED], [])
    assert eid == event_id(FAILED.id, 2, "run.failed", WEBHOOK)
    stale = post(event_id(FAILED.id, 1, "run.failed", WEBHOOK), "run.failed", FAILED.id)
    kinds = [v.kind for v in check_webhooks([FAILED], [], [stale]).violations]
    assert sorted(kinds) == ["webhook_missing", "webhook_unexpected"]


def test_a_lost_event_is_missing() -> None:
    (violation,) = check_webhooks([SUCCEEDED], [], []).violations
    assert violation.kind == "webhook_missing" and SUCCEEDED.id in violation.detail


def test_an_event_for_an_outcome_that_did_not_happen_is_unexpected() -> None:
    wrong_kind = outcome_post(SUCCEEDED, "run.failed")
    for_cancelled = outcome_post(CANCELLED, "run.failed")
    report = check_webhooks([SUCCEEDED, CANCELLED], [], [
        outcome_post(SUCCEEDED, "run.succeeded"), wrong_kind, for_cancelled])  # fmt: skip
    assert [v.kind for v in report.violations] == ["webhook_unexpected"] * 2
    assert {v.run_id for v in report.violations} == {SUCCEEDED.id, CANCELLED.id}


def test_one_id_with_two_bodies_is_a_mismatch() -> None:
    first = outcome_post(SUCCEEDED, "run.succeeded")
    other = {**first, "body": {**first["body"], "text": "something else"}}
    (violation,) = check_webhooks([SUCCEEDED], [], [first, other]).violations
    assert violation.kind == "webhook_mismatch"


def test_the_record_is_read_tolerating_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "webhooks.jsonl"
    path.write_text(json.dumps(outcome_post(SUCCEEDED, "run.succeeded")) + '\n{"event_')
    assert len(read_received(path)) == 1 and read_received(tmp_path / "none") == []
