"""What ``etcdsched run get`` shows of a run's attempts (issue 29): who ran
each, start and end to the millisecond, the outcome and why, in words."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from etcdsched.api.schemas import RunView
from etcdsched.cli import wait
from etcdsched.cli.run_view import run_fields
from etcdsched.cli.warnings import RepeatedWarnings
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.statemachine import (
    assign_attempt,
    finish_attempt,
    start_attempt,
    transition,
)
from etcdsched.model.states import RunState

T0 = 1_796_618_297_000  # 2026-12-07T04:38:17Z


def _run() -> RunRecord:
    spec = JobSpec.model_validate(
        {"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}, "retry": {"max_attempts": 3}}
    )
    return RunRecord(
        id="default:j@1", job_id="default:j", tenant="default", partition=0, slot_ms=T0,
        not_before_ms=T0, created_ms=T0, updated_ms=T0, spec=spec, job_version=3,
        reason="waiting: no live worker",
    )  # fmt: skip


def _rows(text: str) -> dict[str, str]:
    """Each attempt row by its number."""
    table = text.split("\n\n")[1].splitlines()
    assert table[0].split() == ["ATTEMPT", "WORKER", "STARTED", "ENDED", "OUTCOME", "REASON"]
    return {line.split()[0]: line for line in table[1:]}


def test_each_attempt_says_its_worker_times_outcome_and_reason() -> None:
    run = start_attempt(assign_attempt(_run(), "w2", T0 + 5), T0 + 123, pid=7)
    run = finish_attempt(run, "lost", T0 + 40_456, reason="worker w2 vanished (lease expired)")
    run = transition(run, RunState.PENDING, T0 + 40_900)  # retry_wait, then due again
    run = start_attempt(assign_attempt(run, "w1", T0 + 41_000), T0 + 41_002, pid=9)
    text = run_fields(run)
    assert "slot:" in text and "2026-12-07T04:38:17.000Z" in text
    assert "job:     default:j (version 3)" in text
    rows = _rows(text)
    assert rows["1"].split()[:5] == [
        "1", "w2", "2026-12-07T04:38:17.123Z", "2026-12-07T04:38:57.456Z", "lost",
    ]  # fmt: skip
    assert rows["1"].endswith("worker w2 vanished (lease expired)")
    assert rows["2"].split()[:5] == ["2", "w1", "2026-12-07T04:38:58.002Z", "-", "running"]
    assert rows["2"].endswith("running (pid 9)")


@pytest.mark.parametrize(
    ("outcome", "exit_code", "reason", "said"),
    [
        ("succeeded", 0, "", "exit code 0"),
        ("failed", 3, "exit code 3", "exit code 3"),
        ("cancelled", None, "cancelled before start: superseded by slot x", "superseded by slot x"),
    ],
)
def test_an_ended_attempt_says_why(
    outcome: str, exit_code: int | None, reason: str, said: str
) -> None:
    run = start_attempt(assign_attempt(_run(), "w1", T0), T0 + 1, pid=1)
    run = finish_attempt(run, outcome, T0 + 2, exit_code=exit_code, reason=reason)
    assert _rows(run_fields(run))["1"].endswith(said)


def test_an_assigned_attempt_has_not_started() -> None:
    run = assign_attempt(_run(), "w1", T0 + 250)
    row = _rows(run_fields(run))["1"]
    assert row.endswith("assigned at 2026-12-07T04:38:17.250Z, not started yet")


class _FlakyClient:
    """Unreachable for its first ``failures`` polls, then the run has ended."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    async def get_run(self, run_id: str) -> RunView:
        if self.failures:
            self.failures -= 1
            raise aiohttp.ClientConnectionError("Connection refused")
        run = start_attempt(assign_attempt(_run(), "w1", T0), T0 + 1, pid=1)
        ended = finish_attempt(run, "succeeded", T0 + 2, exit_code=0)
        return RunView.model_validate(ended.model_dump())


def test_wait_outlives_an_unreachable_api_and_says_so_once() -> None:
    lines: list[str] = []
    client: Any = _FlakyClient(failures=5)
    warnings = RepeatedWarnings(lines.append)
    view = asyncio.run(wait.wait_for_run(client, "default:j@1", 60, 0.001, warnings))
    assert view.state == "succeeded"
    assert lines == [
        "warning: cannot reach the API, retrying: Connection refused",
        "warning: cannot reach the API, retrying: Connection refused"
        " (repeated 4 times in the last 1 s)",
    ]
