"""``etcdsched bench --smoke`` runs every scenario end to end (``batch`` and
``ui`` included) and renders its report: the benchmark is a user-facing
command, and nothing else in the suite would notice it breaking. Numbers
are not judged here (speed is measured in docs/benchmarks.md, never
asserted in a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCENARIOS = [
    "raw", "throughput", "idle-lag", "burst", "midnight", "scan", "memory", "failover", "soak",
    "batch", "ui",
]  # fmt: skip


BENCH_TIMEOUT_S = 420
"""Below the test's own timeout: on expiry the bench gets SIGTERM, which it
turns into its cleanup (agents and etcd stopped), never SIGKILL, which
would leave them running."""


def _run_bench(args: list[str]) -> tuple[int, str]:
    bench = subprocess.Popen(
        [sys.executable, "-m", "etcdsched.bench", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _, stderr = bench.communicate(timeout=BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        bench.terminate()
        _, stderr = bench.communicate(timeout=60)
        pytest.fail(f"smoke bench still running after {BENCH_TIMEOUT_S} s: {stderr[-3000:]}")
    return bench.returncode, stderr


@pytest.mark.timeout(BENCH_TIMEOUT_S + 90)
def test_the_smoke_bench_runs_every_scenario_and_renders_the_report(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    args = ["--smoke", "--unsafe-no-fsync", "--out-dir", str(tmp_path), "--docs", str(report)]
    returncode, stderr = _run_bench(args)  # fsync off: the smoke checks code paths, not speed
    assert returncode == 0, stderr[-3000:]
    (results,) = tmp_path.glob("*.json")
    data = json.loads(results.read_text())
    assert data["meta"]["smoke"] is True
    assert data["meta"]["versions"]["etcd"]
    assert [s["name"] for s in data["scenarios"]] == SCENARIOS
    assert all(s["tables"] and s["tables"][0]["rows"] for s in data["scenarios"])
    by_name = {s["name"]: s for s in data["scenarios"]}
    _check_batch(by_name["batch"])
    _check_ui(by_name["ui"])
    text = report.read_text()
    assert "SMOKE RUN" in text  # reduced sizes are never mistaken for results
    assert "## Targets" in text
    for name in SCENARIOS:
        assert f"(`{name}`)" in text


def _check_batch(scenario: dict[str, Any]) -> None:
    """Batches through 1 and 2 APIs (records, ids only), then single creates
    one and 16 at a time: each created every job, at some rate, and the
    issue 28 target is judged on the fastest batch."""
    table = scenario["tables"][0]
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["rows"]]
    shapes = [(r["how"].split()[0], r["APIs"], r["answer"], r["in flight per API"]) for r in rows]
    assert shapes == [
        ("batch", 1, "job records", 2), ("batch", 1, "ids only", 2),
        ("batch", 2, "job records", 2), ("batch", 2, "ids only", 2),
        ("one", 1, "job records", 1), ("one", 1, "job records", 16),
    ]  # fmt: skip
    assert all(r["jobs/s"] > 0 and r["total µs/job"] > 0 for r in rows)
    (target,) = scenario["targets"]
    assert target["limit"] == 10_000
    assert target["value"] == max(r["jobs/s"] for r in rows[:4])


def _check_ui(scenario: dict[str, Any]) -> None:
    """Every dashboard page answered each measured request (3 in the smoke)."""
    rows = scenario["tables"][0]["rows"]
    assert len(rows) == 6
    assert all(row[-1] == 3 and 0 < row[1] <= row[3] for row in rows)
    assert [t["limit"] for t in scenario["targets"]] == [300.0, 300.0]


SOAK_KEEP = 3
SOAK_SLACK = 9
"""Runs of one job in etcd beyond keep_last: those ended since the last
sweep of its partition (every 5 s, ``reconcile_every``: 5 at one a second),
two staged by the 2 s lookahead, the one going, and the 10% retention slack
(1). The 10,000-run soak saw at most 6 (docs/benchmarks/reading.md)."""


@pytest.mark.timeout(120)
def test_the_soak_keeps_each_jobs_history_and_logs_bounded(tmp_path: Path) -> None:
    """The smoke soak (60 runs of 3 jobs every second, keep_last 3, a 2 s
    log delete grace where the scheduler has that setting) stays bounded:
    run records and log directories per job, sampled every second."""
    args = ["--smoke", "--scenario", "soak", "--unsafe-no-fsync", "--out-dir", str(tmp_path),
            "--docs", str(tmp_path / "benchmarks.md")]  # fmt: skip
    returncode, stderr = _run_bench(args)
    assert returncode == 0, stderr[-3000:]
    (scenario,) = json.loads(next(tmp_path.glob("*.json")).read_text())["scenarios"]
    series, metrics = scenario["series"], scenario["metrics"]
    assert metrics["expected"] == 60
    assert series["runs"][-1] >= 60  # every run ended (one archived twice counts twice)
    assert metrics["records_job_max"] <= SOAK_KEEP + SOAK_SLACK
    assert max(series["records"]) <= 3 * (SOAK_KEEP + SOAK_SLACK)
    # a trimmed run's logs wait out the grace: with the default 120 s (no
    # setting in this version) the bound is loose, with 2 s it is tight
    grace_runs = metrics["grace_ms"] / 1000 / scenario["params"]["interval_s"]
    assert max(series["run_dirs_job_max"]) <= SOAK_KEEP + SOAK_SLACK + grace_runs
    assert series["archive_bytes"][-1] > 0  # what left etcd was archived
    assert "(`soak`)" in (tmp_path / "benchmarks.md").read_text()
