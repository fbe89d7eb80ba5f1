"""The history checker on hand-made histories: each broken promise is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from etcdsched.model.records import Attempt, JobRecord, RunRecord, SkipRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState
from etcdsched.store.runs import RunOrigin, new_run
from tests.faults.checker import History, HistoryReport, Percentiles, check_history
from tests.faults.collect import archived_runs

T0 = 1_700_000_000_000  # job creation instant (anchor)
SEC = 1000
MONO0 = 5000.0  # monotonic clock at T0


def every_second() -> JobSpec:
    return JobSpec.model_validate(
        {"trigger": {"kind": "interval", "every": "1s"}, "execution": {"argv": ["true"]}}
    )


def job(job_id: str = "j") -> JobRecord:
    return JobRecord(id=job_id, spec=every_second(), created_ms=T0, updated_ms=T0, anchor_ms=T0)


def attempt(
    number: int,
    state: RunState,
    worker: str = "w1",
    exit_code: int | None = 0,
    started_ms: int = T0,
) -> Attempt:
    return Attempt(
        number=number,
        worker=worker,
        state=state,
        assigned_ms=started_ms,
        started_ms=started_ms,
        ended_ms=started_ms + SEC,
        exit_code=exit_code,
    )


def run(slot_ms: int, state: RunState, attempts: list[Attempt], job_id: str = "j") -> RunRecord:
    record = new_run(RunOrigin(job_id, every_second(), 1), slot_ms, slot_ms, 8)
    return record.model_copy(
        update={"state": state, "attempts": attempts, "attempt": len(attempts)}
    )


def line(
    event: str, rec: RunRecord, number: int, pid: int, at_s: float, **extra: Any
) -> dict[str, Any]:
    worker = next((a.worker for a in rec.attempts if a.number == number), "w1")
    return {
        "event": event,
        "job": rec.job_id,
        "run": rec.id,
        "attempt": number,
        "slot_ms": rec.slot_ms,
        "worker": extra.pop("worker", worker),
        "pid": pid,
        "mono": MONO0 + at_s,
        "wall_ms": T0 + int(at_s * 1000),
        **extra,
    }


def executed(
    rec: RunRecord, number: int, pid: int, start_s: float, end_s: float
) -> list[dict[str, Any]]:
    """Start, beats every 100 ms, end (exit 0)."""
    beats = [
        line("beat", rec, number, pid, start_s + k / 10)
        for k in range(1, round((end_s - start_s) * 10))
    ]
    return [
        line("start", rec, number, pid, start_s),
        *beats,
        line("end", rec, number, pid, end_s, exit=0),
    ]


def clean_history() -> tuple[list[RunRecord], list[dict[str, Any]]]:
    """Slots T0, T0+1s, T0+2s: the first ran clean, the second was lost once
    and rerun, the third was skipped (see skips)."""
    first = run(T0, RunState.SUCCEEDED, [attempt(1, RunState.SUCCEEDED)])
    second = run(
        T0 + SEC,
        RunState.SUCCEEDED,
        [
            attempt(1, RunState.LOST, "w1", None, started_ms=T0 + SEC),
            attempt(2, RunState.SUCCEEDED, "w2", started_ms=T0 + 4 * SEC),
        ],
    )
    ledger = [
        *executed(first, 1, 100, 0.01, 0.5),
        *executed(second, 1, 101, 1.0, 1.6)[:-1],  # killed: no end line
        *executed(second, 2, 102, 4.0, 4.5),
    ]
    return [first, second], ledger


def skip_third() -> SkipRecord:
    return SkipRecord(
        job_id="j",
        first_slot_ms=T0 + 2 * SEC,
        last_slot_ms=T0 + 2 * SEC,
        count=1,
        reason="overlap",
        created_ms=T0 + 2 * SEC,
    )


def check(runs: list[RunRecord], ledger: list[dict[str, Any]], **extra: Any) -> HistoryReport:
    history = History(
        jobs=[job()],
        runs=runs,
        skips=extra.pop("skips", [skip_third()]),
        until_ms={"j": T0 + 3 * SEC},
        quiesce_ms=T0 + 10 * SEC,
        ledger=ledger,
        **extra,
    )
    return check_history(history)


def kinds(report: HistoryReport) -> set[str]:
    return {v.kind for v in report.violations}


def test_clean_history_passes_with_counts_and_metrics() -> None:
    report = check(*clean_history())
    assert report.ok, report.violations
    assert (report.slots_expected, report.slots_by_run, report.slots_by_skip) == (3, 2, 1)
    assert report.runs_by_state == {"succeeded": 2}
    assert report.attempts == 3 and report.executions == 3
    assert report.skips_by_reason == {"overlap": 1}
    assert report.rerun_delays_ms == [4000 - 1500]  # rerun start - last beat of the lost one
    assert sorted(report.start_lags_ms) == [0, 10]
    assert sorted(report.claim_lags_ms) == [0, 0] and sorted(report.spawn_lags_ms) == [0, 10]
    assert report.open_attempts == []
    assert report.rerun_delay() == Percentiles(1, 2500, 2500, 2500)


def test_double_launch_two_overlapping_attempts_is_caught() -> None:
    runs, ledger = clean_history()
    second = runs[1]
    # the "lost" attempt kept running while the rerun started: a zombie
    ledger = [e for e in ledger if not (e["run"] == second.id and e["attempt"] == 1)]
    ledger += executed(second, 1, 101, 1.0, 4.3)[:-1]
    report = check(runs, ledger)
    assert kinds(report) == {"overlapping_attempts"}
    (violation,) = report.violations
    assert violation.run_id == second.id and "0.200s overlap" in violation.detail


def test_same_attempt_started_by_two_processes_is_caught() -> None:
    runs, ledger = clean_history()
    ledger += executed(runs[0], 1, 200, 7.0, 7.5)
    assert "duplicate_attempt" in kinds(check(runs, ledger))


def test_lost_slot_is_caught() -> None:
    runs, ledger = clean_history()
    report = check(runs, ledger, skips=[])
    assert kinds(report) == {"unexplained_slot"}
    assert report.violations[0].detail == f"slot {T0 + 2 * SEC}"


def test_slot_both_run_and_skipped_and_wrong_skip_count_are_caught() -> None:
    runs, ledger = clean_history()
    third = run(T0 + 2 * SEC, RunState.SKIPPED, [])
    bad_count = skip_third().model_copy(update={"first_slot_ms": T0 + 2 * SEC, "count": 2})
    report = check([*runs, third], ledger, skips=[bad_count])
    assert kinds(report) == {"run_and_skip", "skip_count"}


def test_run_for_an_instant_that_is_not_a_slot_is_caught() -> None:
    runs, ledger = clean_history()
    stray = run(T0 + 2 * SEC + 7, RunState.SKIPPED, [])
    assert kinds(check([*runs, stray], ledger)) == {"stray_run"}


def test_stale_report_succeeded_without_end_line_is_caught() -> None:
    runs, ledger = clean_history()
    second = runs[1]
    # the fenced attempt 1 is recorded as succeeded although it never ended
    runs[1] = second.model_copy(
        update={"attempts": [attempt(1, RunState.SUCCEEDED), second.attempts[1]]}
    )
    report = check(runs, ledger)
    assert kinds(report) == {"stale_outcome"}
    assert "attempt 1 on w1 recorded succeeded" in report.violations[0].detail


def test_failed_exit_code_must_match_the_end_line() -> None:
    runs, ledger = clean_history()
    runs[0] = runs[0].model_copy(
        update={"state": RunState.FAILED, "attempts": [attempt(1, RunState.FAILED, exit_code=1)]}
    )
    assert kinds(check(runs, ledger)) == {"stale_outcome"}  # the process exited 0


def test_superseded_attempt_missing_from_the_record_is_caught() -> None:
    runs, ledger = clean_history()
    # an attempt 2 ran although the record only knows attempt 1, whose
    # outcome therefore came from an attempt the ledger says was superseded
    ledger += executed(runs[0], 2, 300, 8.0, 8.2)
    report = check(runs, ledger)
    assert kinds(report) == {"unknown_attempt"}


def test_execution_on_another_worker_than_recorded_is_caught() -> None:
    runs, ledger = clean_history()
    ledger = [{**e, "worker": "w9"} if e["pid"] == 100 else e for e in ledger]
    assert kinds(check(runs, ledger)) == {"unknown_attempt"}


def test_run_not_terminal_after_quiesce_and_orphan_are_caught() -> None:
    runs, ledger = clean_history()
    runs[0] = runs[0].model_copy(update={"state": RunState.RUNNING})
    report = check(runs, ledger, alive_pids=frozenset({100}))
    assert kinds(report) == {"not_terminal", "orphan_process"}


def test_percentiles_use_nearest_rank() -> None:
    values = list(range(1, 101))
    assert Percentiles.of(values) == Percentiles(100, 50, 99, 100)
    assert Percentiles.of([]) == Percentiles(0, None, None, None)


def test_terminal_run_with_an_open_attempt_is_noted_not_failed() -> None:
    runs, ledger = clean_history()
    unstarted = run(T0 + 2 * SEC, RunState.CANCELLED, [attempt(1, RunState.ASSIGNED)])
    report = check([*runs, unstarted], ledger, skips=[])
    assert report.ok, report.violations
    assert report.open_attempts == [unstarted.id]


def test_capacity_still_held_after_quiesce_is_noted() -> None:
    runs, ledger = clean_history()
    report = check(runs, ledger, worker_loads={"w2": [runs[1].id]})
    assert report.ok and report.leaked_capacity == [f"w2: {runs[1].id}"]


def test_a_run_archived_twice_is_one_run(tmp_path: Path) -> None:
    """Retention archives before it deletes: the same line can land twice."""
    runs, _ = clean_history()
    archive = tmp_path / runs[0].job_id / "archive.jsonl"
    archive.parent.mkdir()
    line = runs[0].model_dump_json()
    archive.write_text(f"{line}\n{line}\n{runs[1].model_dump_json()}\n")
    assert sorted(r.id for r in archived_runs(tmp_path)) == sorted([runs[0].id, runs[1].id])
