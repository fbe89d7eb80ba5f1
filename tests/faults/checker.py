"""A pure history checker for fault-injection runs (the README's promises;
docs/design.md, "Every write is a transaction").

It compares what etcd says happened (jobs, run records with their attempts,
skip records) with what the jobs themselves wrote to the ledger file
(``start``, a ``beat`` every 100 ms, ``end``; see ``tests/support/jobscript.py``)
and reports every broken promise:

* promise 1 — a slot is at most one run: ``duplicate_slot``; and a run is never
  executed twice at once: ``overlapping_attempts``, ``duplicate_attempt``.
* promise 2 — no due slot is silently lost: ``unexplained_slot``, ``run_and_skip``,
  ``skip_count`` (via :func:`etcdsched.store.ledger.check_slots`), ``stray_run``.
* promise 3 — a run whose worker vanished is rerun: ``not_terminal`` after quiesce.
* promise 4 — a zombie cannot corrupt a run: ``stale_outcome`` (an outcome the
  ledger does not back), ``unknown_attempt`` (the ledger saw an execution the
  run record does not list), ``orphan_process`` (still running after quiesce).
* webhooks: exactly one event per subscribed outcome (``webhook_*``, checked
  by :mod:`tests.faults.webhook_check` against what a receiver got).

An execution's *alive interval* is [its start, its last beat or end]. The
last beat can be up to 100 ms before the process really died, so an overlap
shorter than that may go unseen; every overlap reported is real. Only a pause
of the whole machine can legitimately produce one (README, guarantees).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from etcdsched.model.records import JobRecord, RunRecord, SkipRecord
from etcdsched.model.states import RunState
from etcdsched.model.triggers import slots_between
from etcdsched.store.ledger import MAX_SLOTS, check_slots

VIOLATION_KINDS = {
    "duplicate_slot": "more than one scheduled run for one slot",
    "run_and_skip": "a slot both run and recorded as skipped",
    "unexplained_slot": "a due slot with neither a run nor a skip record",
    "skip_count": "a skip record whose count differs from the slots it covers",
    "stray_run": "a scheduled run for an instant that is not a due slot",
    "overlapping_attempts": "two attempts of one run alive at the same time",
    "duplicate_attempt": "one attempt number executed by two processes",
    "not_terminal": "a run not terminal after quiesce",
    "stale_outcome": "an attempt recorded succeeded/failed that the ledger does not back",
    "unknown_attempt": "the ledger saw an execution that the run record does not list",
    "orphan_process": "a job process still alive after quiesce",
    "webhook_missing": "a subscribed outcome whose event the receiver never got",
    "webhook_unexpected": "an event no recorded outcome explains",
    "webhook_mismatch": "one event id received with two different bodies",
}


@dataclass(frozen=True)
class Violation:
    kind: str
    job_id: str
    run_id: str = ""
    detail: str = ""

    def __str__(self) -> str:
        where = self.run_id or self.job_id
        return f"{self.kind}: {where}: {self.detail}"


@dataclass(frozen=True)
class Execution:
    """One process of one attempt, as the ledger saw it."""

    run_id: str
    job_id: str
    attempt: int
    pid: int
    worker: str
    start_mono: float
    start_wall_ms: int
    last_mono: float
    last_wall_ms: int
    ended: bool
    exit_code: int | None

    def overlaps(self, other: Execution) -> bool:
        return self.start_mono < other.last_mono and other.start_mono < self.last_mono

    def describe(self) -> str:
        alive = self.last_mono - self.start_mono
        end = f"ended exit={self.exit_code}" if self.ended else "no end"
        return (
            f"attempt {self.attempt} pid {self.pid} on {self.worker} "
            f"start_wall={self.start_wall_ms} alive {alive:.2f}s ({end})"
        )


@dataclass(frozen=True)
class Percentiles:
    count: int
    p50: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Percentiles:
        ordered = sorted(values)
        if not ordered:
            return cls(0, None, None, None)

        def rank(q: float) -> float:  # nearest-rank percentile
            return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

        return cls(len(ordered), rank(0.50), rank(0.99), ordered[-1])


@dataclass(frozen=True)
class History:
    """Everything the checker reads. ``until_ms`` maps a job to the end of
    its accounted window (its next pending slot); jobs without an entry are
    accounted up to ``quiesce_ms``. ``alive_pids``: job processes found still
    running after quiesce. ``worker_loads``: the run ids each live worker still
    has an assignment for (its used capacity) after quiesce."""

    jobs: list[JobRecord]
    runs: list[RunRecord]
    skips: list[SkipRecord]
    until_ms: Mapping[str, int]
    quiesce_ms: int
    ledger: list[dict[str, Any]]
    alive_pids: frozenset[int] = frozenset()
    worker_loads: Mapping[str, list[str]] = field(default_factory=dict)


@dataclass
class HistoryReport:
    jobs: int = 0
    slots_expected: int = 0
    slots_by_run: int = 0
    slots_by_skip: int = 0
    runs_by_state: Counter[str] = field(default_factory=Counter)
    runs_by_kind: Counter[str] = field(default_factory=Counter)
    attempts_by_state: Counter[str] = field(default_factory=Counter)
    executions: int = 0
    skips_by_reason: Counter[str] = field(default_factory=Counter)
    skip_records: int = 0
    rerun_delays_ms: list[int] = field(default_factory=list)
    start_lags_ms: list[int] = field(default_factory=list)
    claim_lags_ms: list[int] = field(default_factory=list)
    """First attempt: the worker's claim (``started_ms``) minus ``not_before_ms``."""
    spawn_lags_ms: list[int] = field(default_factory=list)
    """First attempt: the job's own start line minus the worker's claim."""
    violations: list[Violation] = field(default_factory=list)
    open_attempts: list[str] = field(default_factory=list)
    """Notes, not violations: terminal runs whose last attempt still says
    assigned/running (e.g. cancelled before it started)."""
    leaked_capacity: list[str] = field(default_factory=list)
    """Notes: ``worker: run`` pairs a live worker still counts as using a slot
    after every run ended; such a slot is never placed again."""

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def runs(self) -> int:
        return sum(self.runs_by_state.values())

    @property
    def attempts(self) -> int:
        return sum(self.attempts_by_state.values())

    def violation_counts(self) -> Counter[str]:
        return Counter(v.kind for v in self.violations)

    def rerun_delay(self) -> Percentiles:
        return Percentiles.of(self.rerun_delays_ms)

    def start_lag(self) -> Percentiles:
        return Percentiles.of(self.start_lags_ms)

    def claim_lag(self) -> Percentiles:
        return Percentiles.of(self.claim_lags_ms)

    def spawn_lag(self) -> Percentiles:
        return Percentiles.of(self.spawn_lags_ms)


def check_history(history: History) -> HistoryReport:
    report = HistoryReport(jobs=len(history.jobs))
    executions = executions_from_ledger(history.ledger)
    report.executions = len(executions)
    _count(history, report)
    _check_slots(history, report)
    by_run: dict[str, list[Execution]] = defaultdict(list)
    for execution in executions:
        by_run[execution.run_id].append(execution)
    _check_executions(by_run, report)
    _check_records(history.runs, by_run, report)
    _check_orphans(executions, history.alive_pids, report)
    for worker, run_ids in sorted(history.worker_loads.items()):
        report.leaked_capacity += [f"{worker}: {run_id}" for run_id in run_ids]
    _measure(history.runs, by_run, report)
    return report


def executions_from_ledger(lines: Iterable[Mapping[str, Any]]) -> list[Execution]:
    """Group ledger lines by process: (run, attempt, pid) — pids get reused."""
    groups: dict[tuple[str, int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for line in lines:
        if line.get("run"):
            groups[(str(line["run"]), int(line["attempt"]), int(line["pid"]))].append(line)
    return [_execution(key, group) for key, group in groups.items()]


def _execution(key: tuple[str, int, int], group: list[Mapping[str, Any]]) -> Execution:
    run_id, attempt, pid = key
    first = min(group, key=lambda line: float(line["mono"]))
    last = max(group, key=lambda line: float(line["mono"]))
    ends = [line for line in group if line["event"] == "end"]
    exit_code = ends[0].get("exit") if ends else None
    return Execution(
        run_id=run_id,
        job_id=str(first.get("job") or run_id.rpartition("@")[0]),
        attempt=attempt,
        pid=pid,
        worker=str(first.get("worker") or ""),
        start_mono=float(first["mono"]),
        start_wall_ms=int(first["wall_ms"]),
        last_mono=float(last["mono"]),
        last_wall_ms=int(last["wall_ms"]),
        ended=bool(ends),
        exit_code=None if exit_code is None else int(exit_code),
    )


def _count(history: History, report: HistoryReport) -> None:
    for run in history.runs:
        report.runs_by_state[run.state.value] += 1
        report.runs_by_kind[run.kind] += 1
        for attempt in run.attempts:
            report.attempts_by_state[attempt.state.value] += 1
        still_open = (RunState.ASSIGNED, RunState.RUNNING)
        if run.state.terminal and run.attempts and run.attempts[-1].state in still_open:
            report.open_attempts.append(run.id)
    for skip in history.skips:
        report.skips_by_reason[skip.reason] += skip.count
    report.skip_records = len(history.skips)


# -- promises 1 / 2: every slot is exactly one run or one skip ------------------------


def _check_slots(history: History, report: HistoryReport) -> None:
    runs_by_job: dict[str, list[RunRecord]] = defaultdict(list)
    for run in history.runs:
        if run.kind in ("scheduled", "backfill"):
            runs_by_job[run.job_id].append(run)
    skips_by_job: dict[str, list[SkipRecord]] = defaultdict(list)
    for skip in history.skips:
        skips_by_job[skip.job_id].append(skip)
    for job in history.jobs:
        until = history.until_ms.get(job.id, history.quiesce_ms)
        _check_job_slots(job, until, runs_by_job[job.id], skips_by_job[job.id], report)


def _check_job_slots(
    job: JobRecord,
    until: int,
    runs: list[RunRecord],
    skips: list[SkipRecord],
    report: HistoryReport,
) -> None:
    backfilled = {run.slot_ms for run in runs if run.kind == "backfill"}
    runs = [run for run in runs if run.kind == "scheduled"]
    per_slot = Counter(run.slot_ms for run in runs)
    for slot, count in sorted(per_slot.items()):
        if count > 1:
            ids = [r.id for r in runs if r.slot_ms == slot]
            report.violations.append(Violation("duplicate_slot", job.id, ids[0], f"runs {ids}"))
    trigger, anchor = job.spec.trigger, job.anchor_ms
    ledger = check_slots(job.id, trigger, anchor, until, set(per_slot), skips, backfilled)
    report.slots_expected += ledger.expected
    report.slots_by_run += ledger.by_run
    report.slots_by_skip += ledger.by_skip
    for slot in ledger.unexplained:
        report.violations.append(Violation("unexplained_slot", job.id, detail=f"slot {slot}"))
    for slot in ledger.doubly_explained:
        skip = next(s for s in skips if s.first_slot_ms <= slot <= s.last_slot_ms)
        detail = f"slot {slot} ran and is skipped ({skip.reason}: {skip.detail})"
        report.violations.append(Violation("run_and_skip", job.id, detail=detail))
    for skip in ledger.skip_count_mismatches:
        detail = f"{skip.reason} [{skip.first_slot_ms}, {skip.last_slot_ms}] count {skip.count}"
        report.violations.append(Violation("skip_count", job.id, detail=detail))
    expected = set(slots_between(trigger, anchor - 1, until - 1, anchor, MAX_SLOTS))
    for run in runs:
        if run.slot_ms not in expected:
            detail = f"slot {run.slot_ms} is not a due slot before {until}"
            report.violations.append(Violation("stray_run", job.id, run.id, detail))


# -- promises 1 / 4: what the processes did --------------------------------------------


def _check_executions(by_run: Mapping[str, list[Execution]], report: HistoryReport) -> None:
    for run_id, executions in by_run.items():
        ordered = sorted(executions, key=lambda e: e.start_mono)
        for i, first in enumerate(ordered):
            for second in ordered[i + 1 :]:
                _compare_pair(run_id, first, second, report)


def _compare_pair(run_id: str, first: Execution, second: Execution, report: HistoryReport) -> None:
    if first.attempt == second.attempt:
        detail = f"{first.describe()}; {second.describe()}"
        report.violations.append(Violation("duplicate_attempt", first.job_id, run_id, detail))
    elif first.overlaps(second):
        overlap = min(first.last_mono, second.last_mono) - second.start_mono
        detail = f"{overlap:.3f}s overlap: {first.describe()}; {second.describe()}"
        report.violations.append(Violation("overlapping_attempts", first.job_id, run_id, detail))


def _check_records(
    runs: list[RunRecord], by_run: Mapping[str, list[Execution]], report: HistoryReport
) -> None:
    known = {run.id for run in runs}
    for run_id, executions in by_run.items():
        if run_id not in known:
            for execution in executions:
                detail = f"{execution.describe()}; no run record"
                report.violations.append(
                    Violation("unknown_attempt", execution.job_id, run_id, detail)
                )
    for run in runs:
        if not run.state.terminal:
            detail = f"state {run.state.value} (attempt {run.attempt}, reason {run.reason!r})"
            report.violations.append(Violation("not_terminal", run.job_id, run.id, detail))
        _check_run_attempts(run, by_run.get(run.id, []), report)


def _check_run_attempts(run: RunRecord, executions: list[Execution], report: HistoryReport) -> None:
    recorded = {attempt.number: attempt for attempt in run.attempts}
    for execution in executions:
        attempt = recorded.get(execution.attempt)
        if attempt is None or attempt.worker != execution.worker:
            listed = [(a.number, a.worker, a.state.value) for a in run.attempts]
            detail = f"{execution.describe()}; the record lists {listed}"
            report.violations.append(Violation("unknown_attempt", run.job_id, run.id, detail))
    for attempt in run.attempts:
        if attempt.state is RunState.SUCCEEDED:
            wanted: int | None = 0
        elif attempt.state is RunState.FAILED and attempt.exit_code is not None:
            wanted = attempt.exit_code
        else:
            continue  # killed, lost, timed out, cancelled: no end line to expect
        backing = [
            e for e in executions if e.attempt == attempt.number and e.ended
            and e.exit_code in (wanted, None)
        ]  # fmt: skip
        if not backing:
            mine = [e.describe() for e in executions if e.attempt == attempt.number]
            detail = (
                f"attempt {attempt.number} on {attempt.worker} recorded {attempt.state.value} "
                f"exit={attempt.exit_code}, ledger: {mine or 'never started'}"
            )
            report.violations.append(Violation("stale_outcome", run.job_id, run.id, detail))


def _check_orphans(
    executions: list[Execution], alive_pids: frozenset[int], report: HistoryReport
) -> None:
    for pid in sorted(alive_pids):
        mine = [e for e in executions if e.pid == pid]
        latest = max(mine, key=lambda e: e.start_mono, default=None)
        if latest is None:
            report.violations.append(Violation("orphan_process", "", detail=f"pid {pid}"))
        else:
            report.violations.append(
                Violation("orphan_process", latest.job_id, latest.run_id, latest.describe())
            )


# -- metrics -----------------------------------------------------------------------


def _measure(
    runs: list[RunRecord], by_run: Mapping[str, list[Execution]], report: HistoryReport
) -> None:
    for run in runs:
        executions = by_run.get(run.id, [])
        if not executions:
            continue
        first = min(executions, key=lambda e: e.start_wall_ms)
        report.start_lags_ms.append(first.start_wall_ms - run.not_before_ms)
        claimed = next((a for a in run.attempts if a.number == first.attempt), None)
        if claimed is not None and claimed.started_ms is not None:
            report.claim_lags_ms.append(claimed.started_ms - run.not_before_ms)
            report.spawn_lags_ms.append(first.start_wall_ms - claimed.started_ms)
        for attempt in run.attempts:
            if attempt.state is not RunState.LOST:
                continue
            lost = [e.last_wall_ms for e in executions if e.attempt == attempt.number]
            rerun = [e.start_wall_ms for e in executions if e.attempt == attempt.number + 1]
            if lost and rerun:
                report.rerun_delays_ms.append(min(rerun) - max(lost))
