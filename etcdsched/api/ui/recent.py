"""Start lag p50/p99 and firing-brake holds over the last minutes, from
this process's own Prometheus metrics.

etcd keeps no index of recently ended runs, and reading every job's runs
to find them is what the design never does (design.md, "Nothing scans
every job"). The workers measure every start already
(``etcdsched_start_lag_seconds``: the attempt's start minus its
not-before instant) and the schedulers count each hold of the firing brake
(``etcdsched_firing_held``). Both are cumulative, so the cluster page keeps
snapshots of them and shows the difference between now and the snapshot
from about :data:`WINDOW_MS` ago; the quantiles are interpolated within
histogram buckets as Prometheus's ``histogram_quantile`` does. The numbers
cover the workers and schedulers of *this* process (an agent running all
roles, or ``etcdsched up``); an API-only process has none, and the page
says so.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from etcdsched.runtime.clock import Clock

WINDOW_MS = 5 * 60_000
LAG_METRIC = "etcdsched_start_lag_seconds"
HELD_METRIC = "etcdsched_firing_held"
MAX_SNAPSHOTS = 1000


@dataclass(frozen=True)
class Snapshot:
    at_ms: int
    buckets: tuple[tuple[float, float], ...]
    """(upper bound, cumulative count), ascending; the last bound is +Inf."""
    held: float


@dataclass(frozen=True)
class Recent:
    """What happened between ``since_ms`` and now."""

    since_ms: int
    starts: int
    p50_s: float | None
    p99_s: float | None
    held: int


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of cumulative ``buckets``, interpolated linearly
    within the bucket it falls in; the last finite bound if it falls in
    +Inf; None without observations."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            share = (rank - below) / inside if inside > 0 else 1.0
            return lower + (bound - lower) * share
        lower, below = bound, cumulative
    return lower


def read_snapshot(registry: CollectorRegistry, now_ms: int) -> Snapshot:
    buckets: dict[float, float] = {}
    held = 0.0
    for family in registry.collect():
        if family.name == LAG_METRIC:
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + sample.value
        elif family.name == HELD_METRIC:
            held += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return Snapshot(now_ms, tuple(sorted(buckets.items())), held)


class RecentMetrics:
    """Snapshots taken when the page is viewed (and once at start)."""

    def __init__(self, registry: CollectorRegistry, clock: Clock) -> None:
        self._registry = registry
        self._clock = clock
        self._snapshots: deque[Snapshot] = deque(maxlen=MAX_SNAPSHOTS)
        self._snapshots.append(read_snapshot(registry, clock.now_ms()))

    def observe(self) -> Recent:
        """Take a snapshot; the difference to the newest one at least
        :data:`WINDOW_MS` old (or the oldest kept, for a young process)."""
        now = read_snapshot(self._registry, self._clock.now_ms())
        while len(self._snapshots) > 1 and self._snapshots[1].at_ms <= now.at_ms - WINDOW_MS:
            self._snapshots.popleft()
        base = self._snapshots[0]
        self._snapshots.append(now)
        before = dict(base.buckets)
        delta = [(bound, count - before.get(bound, 0.0)) for bound, count in now.buckets]
        starts = int(delta[-1][1]) if delta else 0
        return Recent(
            since_ms=base.at_ms,
            starts=starts,
            p50_s=quantile(0.5, delta),
            p99_s=quantile(0.99, delta),
            held=int(now.held - base.held),
        )
