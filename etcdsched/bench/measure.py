"""Turning run records into numbers: start lag, per-second rates, percentiles.

Every timing comes from the run records themselves (``created_ms``, each
attempt's ``assigned_ms``/``started_ms``/``ended_ms``), written by the
scheduler and worker processes on this one machine, so they share a clock.
Start lag = first attempt's ``started_ms`` - the run's ``not_before_ms``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from etcdsched.model.records import RunRecord
from etcdsched.store.cache import list_all
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Store, prefix_end

STAGES = ("fired", "placed", "started", "finished")


@dataclass(frozen=True)
class RunTimes:
    run_id: str
    job_id: str
    slot_ms: int
    not_before_ms: int
    created_ms: int
    assigned_ms: int | None
    started_ms: int | None
    ended_ms: int | None
    terminal: bool
    attempts: int
    created_by: str
    state: str = ""

    @property
    def lag_ms(self) -> int | None:
        return None if self.started_ms is None else self.started_ms - self.not_before_ms

    def stage_ms(self, stage: str) -> int | None:
        return {
            "fired": self.created_ms,
            "placed": self.assigned_ms,
            "started": self.started_ms,
            "finished": self.ended_ms if self.terminal else None,
        }[stage]


def run_times(run: RunRecord) -> RunTimes:
    first = run.attempts[0] if run.attempts else None
    last = run.attempts[-1] if run.attempts else None
    return RunTimes(
        run_id=run.id,
        job_id=run.job_id,
        slot_ms=run.slot_ms,
        not_before_ms=run.not_before_ms,
        created_ms=run.created_ms,
        assigned_ms=first.assigned_ms if first else None,
        started_ms=first.started_ms if first else None,
        ended_ms=last.ended_ms if last else None,
        terminal=run.state.terminal,
        attempts=len(run.attempts),
        created_by=run.created_by,
        state=run.state.value,
    )


async def read_runs(store: Store, keys: Keys) -> list[RunTimes]:
    """Every run record under the prefix (paged reads at one revision)."""
    prefix = keys.runs_prefix()
    items, _ = await list_all(store, prefix, prefix_end(prefix))
    return [run_times(kv.decode(RunRecord).value) for kv in items.values()]


async def count_keys(store: Store, prefix: str) -> int:
    result = await store.range(prefix, count_only=True)
    return result.count


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (``q`` in 0..100)."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def summary(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}
    return {
        "count": len(ordered),
        "mean": sum(ordered) / len(ordered),
        "min": float(ordered[0]),
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
        "max": float(ordered[-1]),
    }


def quantile_curve(values: Sequence[float], points: int = 400) -> list[list[float]]:
    """``[[fraction, value], ...]``: enough of the distribution to draw its
    CDF without storing every sample in the results file."""
    ordered = sorted(values)
    if not ordered:
        return []
    n = len(ordered)
    picks = sorted({min(n - 1, round(i * (n - 1) / (points - 1))) for i in range(points)})
    return [[(i + 1) / n, float(ordered[i])] for i in picks]


def lags(times: Sequence[RunTimes]) -> list[float]:
    return [float(t.lag_ms) for t in times if t.lag_ms is not None]


STAGE_GAPS = {
    "fired -> placed": ("created_ms", "assigned_ms"),
    "placed -> started": ("assigned_ms", "started_ms"),
    "started -> finished": ("started_ms", "ended_ms"),
}
"""Where a run's time goes (first attempt); a run waits for its not-before
on the worker when it was placed ahead of its slot."""


def stage_gaps(times: Sequence[RunTimes]) -> dict[str, dict[str, float]]:
    """Summary of each stage's duration over the runs that passed it."""
    gaps = {}
    for name, (start, end) in STAGE_GAPS.items():
        values = [
            float(b - a)
            for t in times
            if (a := getattr(t, start)) is not None and (b := getattr(t, end)) is not None
        ]
        gaps[name] = summary(sorted(values))
    return gaps


def per_second(times: Sequence[RunTimes], t0_ms: int, seconds: int) -> dict[str, list[int]]:
    """Per stage, how many runs reached it in each second after ``t0_ms``."""
    series = {stage: [0] * seconds for stage in STAGES}
    for t in times:
        for stage in STAGES:
            at = t.stage_ms(stage)
            if at is None:
                continue
            bucket = (at - t0_ms) // 1000
            if 0 <= bucket < seconds:
                series[stage][bucket] += 1
    return series


def window_rate(counts: Sequence[int], start_s: int, end_s: int) -> float:
    """Mean per-second count over ``[start_s, end_s)``."""
    window = counts[start_s:end_s]
    return sum(window) / len(window) if window else 0.0
