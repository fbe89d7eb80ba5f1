"""Benchmark settings: the full sizes the targets are defined for, a tiny
``--smoke`` preset, and the list of ways a run deviates from the full sizes
(printed on the report, so smoke numbers are never mistaken for results)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etcdsched.bench import SCENARIOS


@dataclass(frozen=True)
class BenchOptions:
    scenarios: tuple[str, ...] = SCENARIOS
    fsync: bool = True
    """etcd's fsync, as users run it; off is a tuned, labelled run."""
    out_dir: Path = Path("bench-results")
    docs: Path = Path("docs/benchmarks.md")
    data_dir: Path | None = None
    command_line: str = "etcdsched bench"
    smoke: bool = False
    # cluster-wide
    partitions: int = 64
    lease_ttl: int = 5
    lookahead_ms: int = 2000
    worker_slots: int = 256
    drain_timeout: float = 300.0
    # raw
    raw_seconds: float = 10.0
    raw_value_bytes: int = 1024
    # throughput
    duration: float = 60.0
    rate: int = 2000
    """Offered slots/s with the no-op executor: just above its ceiling here
    (2,000 offered: 1,882/s finished; 2,400: 1,704/s, see ADR 0014). Far
    above it the figure is overload rather than the ceiling."""
    process_rate: int = 600
    """Offered slots/s with real processes, near their ceiling (600 offered:
    573/s carried; 800: 547/s)."""
    noop_worker_slots: int = 4096
    """Worker capacity for the no-op executor. A run holds its slot from its
    placement, up to the lookahead before its instant, until the scheduler
    sees it finished: at 2,000/s and a 2 s lookahead that is about 4,000
    slots, and with 256 the slots, not the scheduler, set the rate (ADR 0014).
    Real processes keep ``worker_slots``: the worker forks each one ahead of
    its instant (ADR 0008), and 4,096 waiting forks made `true` take 3.4 s
    (412/s instead of 547/s at 800 offered)."""
    executors: tuple[str, ...] = ("noop", "process")
    schedulers: int = 1
    workers: int = 1
    # idle-lag
    idle_jobs: int = 1000
    idle_every: float = 60.0
    idle_duration: float = 120.0
    idle_executor: str = "process"
    idle_rounds: int = 3
    busy_every: float = 10.0
    busy_duration: float = 60.0
    # burst
    burst_sizes: tuple[int, ...] = (10_000, 100_000)
    burst_lead: float = 60.0
    burst_workers: int = 2
    burst_shape: str = "defaults"
    """``defaults``: one worker with N slots, the agent's default lookahead
    (what a user gets); ``tuned``: lookahead = lead, workers hold the burst."""
    burst_executor: str = "noop"
    # midnight
    midnight_jobs: int = 100_000
    midnight_capacity: float = 0.5
    """Worker slots as a share of the jobs."""
    midnight_jitter: float = 600.0
    midnight_lead: float = 60.0
    # scan
    scan_sizes: tuple[int, ...] = (10_000, 1_000_000)
    scan_due: int = 100
    scan_passes: int = 5
    # memory
    memory_jobs: int = 1_000_000
    memory_settle: float = 30.0
    memory_due_jobs: int = 100
    # failover
    failover_rounds: int = 3
    # soak
    soak_runs: int = 10_000
    soak_jobs: int = 10
    """Jobs sharing the runs: an interval is at least 1 s, so one job
    alone would take 2.8 hours to run 10,000 times."""
    soak_interval: float = 1.0
    soak_keep: int = 3
    soak_sample: float = 5.0
    soak_log_grace: float | None = None
    """Seconds; None: the scheduler's own (120 s). Short only for the smoke,
    which runs for less than the default grace."""
    # batch
    batch_jobs: int = 100_000
    """Jobs created in each batch configuration (1 and ``batch_apis`` API
    processes, answered with the records and with ids only)."""
    batch_size: int = 1000
    """Items per ``POST /v1/jobs:batch``: the API's maximum."""
    batch_apis: int = 2
    """API processes for the last batch configurations; 1 is measured too."""
    batch_in_flight: int = 2
    """Batch requests at once to each API process."""
    batch_single: int = 2000
    """Jobs created one per request (``POST /v1/jobs``), for comparison."""
    batch_single_in_flight: int = 16
    # ui
    ui_jobs: int = 10_000
    ui_requests: int = 30
    """Measured GETs of each dashboard page."""
    extra: dict[str, Any] = field(default_factory=dict)

    def deviations(self) -> list[str]:
        """How this run is smaller than the sizes the targets are defined for."""
        full = BenchOptions()
        out = []
        for name in _SIZE_FIELDS:
            mine, ref = getattr(self, name), getattr(full, name)
            if _smaller(mine, ref):
                out.append(f"{name}={_show(mine)} (full: {_show(ref)})")
        return out

    @property
    def reduced(self) -> bool:
        return self.smoke or bool(self.deviations())


_SIZE_FIELDS = (
    "raw_seconds",
    "duration",
    "rate",
    "process_rate",
    "idle_jobs",
    "idle_duration",
    "idle_rounds",
    "burst_sizes",
    "burst_lead",
    "midnight_jobs",
    "scan_sizes",
    "scan_passes",
    "memory_jobs",
    "memory_settle",
    "failover_rounds",
    "soak_runs",
    "batch_jobs",
    "batch_single",
    "ui_jobs",
    "ui_requests",
)

SMOKE: dict[str, Any] = {
    "partitions": 8,
    "drain_timeout": 60.0,
    "raw_seconds": 2.0,
    "duration": 10.0,
    "rate": 50,
    "process_rate": 50,
    "idle_jobs": 100,
    "idle_every": 2.0,
    "idle_duration": 10.0,
    "idle_rounds": 1,
    "busy_every": 1.0,
    "busy_duration": 6.0,
    "burst_sizes": (200, 1000),
    "burst_lead": 5.0,
    "midnight_jobs": 1000,
    "midnight_jitter": 5.0,
    "midnight_lead": 5.0,
    "scan_sizes": (1000, 10_000),
    "scan_due": 20,
    "scan_passes": 2,
    "memory_jobs": 10_000,
    "memory_settle": 5.0,
    "memory_due_jobs": 20,
    "failover_rounds": 1,
    "soak_runs": 60,
    "soak_jobs": 3,
    "soak_sample": 1.0,
    "soak_log_grace": 2.0,
    "batch_jobs": 2000,
    "batch_single": 100,
    "ui_jobs": 200,
    "ui_requests": 3,
}


def _smaller(mine: Any, ref: Any) -> bool:
    if isinstance(ref, tuple):
        mine, ref = max(mine, default=0), max(ref)
    return float(mine) < float(ref)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def build_options(smoke: bool, overrides: dict[str, Any]) -> BenchOptions:
    """Full defaults (or the smoke preset), then every flag the user gave."""
    values: dict[str, Any] = dict(SMOKE) if smoke else {}
    values.update({k: v for k, v in overrides.items() if v is not None and v != ()})
    known = {f.name for f in dataclasses.fields(BenchOptions)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown bench options: {sorted(unknown)}")
    return BenchOptions(smoke=smoke, **values)


def offered_rate(options: BenchOptions, executor: str) -> int:
    """Slots/s the throughput scenario offers to ``executor``."""
    return options.process_rate if executor == "process" else options.rate


def worker_slots_for(options: BenchOptions, executor: str) -> int:
    """Capacity of the throughput scenario's workers for ``executor``."""
    return options.worker_slots if executor == "process" else options.noop_worker_slots
