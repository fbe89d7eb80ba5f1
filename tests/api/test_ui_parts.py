"""The dashboard's pure parts: the slot ledger's order, a run's place on
the state machine, start-lag quantiles from histogram buckets, and how
partitions and times are written (no etcd, no server)."""

from __future__ import annotations

import math

from markupsafe import Markup

from etcdsched.api.ui.ledger import ledger
from etcdsched.api.ui.pages_cluster import partition_ranges
from etcdsched.api.ui.pages_run import steps
from etcdsched.api.ui.recent import quantile
from etcdsched.api.ui.render import time_element
from etcdsched.model.records import Attempt, RunRecord, SkipRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState

SPEC = JobSpec.model_validate(
    {"trigger": {"kind": "interval", "every": "1m"}, "execution": {"argv": ["true"]}}
)


def run(slot: int, state: RunState = RunState.SUCCEEDED, **extra: object) -> RunRecord:
    return RunRecord.model_validate(
        {
            "id": f"t:j@{slot:014d}",
            "job_id": "t:j",
            "tenant": "t",
            "partition": 0,
            "slot_ms": slot,
            "not_before_ms": slot,
            "state": state,
            "spec": SPEC,
            "job_version": 1,
            "created_ms": slot,
            "updated_ms": slot,
            **extra,
        }
    )


def skip(first: int, last: int, count: int, reason: str = "overlap") -> SkipRecord:
    return SkipRecord.model_validate(
        {
            "job_id": "t:j",
            "first_slot_ms": first,
            "last_slot_ms": last,
            "count": count,
            "reason": reason,
            "created_ms": last,
        }
    )


def test_the_ledger_interleaves_runs_and_skips_in_slot_order() -> None:
    cells = ledger([run(60_000), run(240_000)], [skip(120_000, 180_000, 2)], complete=True)
    assert [(cell.kind, cell.slot_ms) for cell in cells] == [
        ("run", 60_000),
        ("skip", 120_000),
        ("run", 240_000),
    ]
    gap = cells[1]
    assert gap.label == "skipped x2: overlap"
    assert "the previous run was still going" in gap.title and "2 slots" in gap.title
    assert cells[0].href == "/ui/runs/t:j@00000000060000"


def test_a_partial_ledger_leaves_out_skips_older_than_its_oldest_run() -> None:
    old, recent = skip(0, 0, 1, "misfire"), skip(120_000, 120_000, 1, "paused")
    shown = ledger([run(60_000)], [old, recent], complete=False)
    assert [cell.slot_ms for cell in shown] == [60_000, 120_000]
    assert len(ledger([run(60_000)], [old, recent], complete=True)) == 3


def test_a_run_shows_where_it_is_and_what_it_never_reached() -> None:
    assert [(s.name, s.status) for s in steps(run(0, RunState.PENDING))] == [
        ("pending", "current"),
        ("assigned", "todo"),
        ("running", "todo"),
        ("ended", "todo"),
    ]
    cancelled = steps(run(0, RunState.CANCELLED))
    assert [s.status for s in cancelled] == ["done", "passed-by", "passed-by", "current"]
    assert cancelled[-1].name == "cancelled"
    attempt = Attempt(number=1, worker="w", assigned_ms=1, started_ms=2, ended_ms=3)
    failed = steps(run(0, RunState.FAILED, attempts=[attempt], attempt=1))
    assert [s.status for s in failed] == ["done", "done", "done", "current"]
    waiting = steps(run(0, RunState.RETRY_WAIT, attempts=[attempt], attempt=1))
    assert waiting[0].name == "retry_wait" and waiting[0].status == "current"


def test_quantiles_interpolate_within_buckets() -> None:
    buckets = [(0.01, 50.0), (0.1, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    assert quantile(0.5, buckets) == 0.01
    p99 = quantile(0.99, buckets)
    assert p99 is not None and math.isclose(p99, 0.1 + 0.9 * 0.9)
    assert quantile(0.5, [(0.01, 0.0), (math.inf, 0.0)]) is None
    assert quantile(0.99, [(0.01, 0.0), (math.inf, 4.0)]) == 0.01, "past the last bound"


def test_partitions_are_written_as_ranges() -> None:
    assert partition_ranges([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"
    assert partition_ranges([]) == ""


def test_times_are_utc_in_a_time_element() -> None:
    html = time_element(1_796_629_593_076, with_ms=True)
    assert isinstance(html, Markup)
    assert 'datetime="2026-12-07T07:46:33.076Z"' in html
    assert 'title="2026-12-07 07:46:33.076 UTC"' in html
    assert "&ndash;" in time_element(None)
