"""``etcdsched bench --smoke`` runs every scenario end to end and renders its
report: the benchmark is a user-facing command, and nothing else in the
suite would notice it breaking. Numbers are not judged here (speed is
measured in docs/benchmarks.md, never asserted in a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIOS = ["raw", "throughput", "idle-lag", "burst", "midnight", "scan", "memory", "failover"]


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
    text = report.read_text()
    assert "SMOKE RUN" in text  # reduced sizes are never mistaken for results
    assert "## Targets" in text
    for name in SCENARIOS:
        assert f"(`{name}`)" in text
