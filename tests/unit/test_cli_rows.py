"""What the CLI's run table shows: a finished run keeps the worker of its
last attempt (issue 29: the column said ``-`` once a run had finished)."""

from __future__ import annotations

from etcdsched.cli.support import run_rows
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.statemachine import assign_attempt, finish_attempt, start_attempt


def _finished_run() -> RunRecord:
    spec = JobSpec.model_validate({"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}})
    run = RunRecord(
        id="default:j@00000000001000", job_id="default:j", tenant="default", partition=0,
        slot_ms=1000, not_before_ms=1000, created_ms=1000, updated_ms=1000, spec=spec,
        job_version=1,
    )  # fmt: skip
    run = start_attempt(assign_attempt(run, "w7", 1000), 1001, pid=42)
    return finish_attempt(run, "succeeded", 1002, exit_code=0)


def test_a_finished_run_shows_the_worker_of_its_last_attempt() -> None:
    run = _finished_run()
    assert run.worker is None
    row = next(line for line in run_rows([run]).splitlines() if run.id in line)
    assert "w7" in row.split()
