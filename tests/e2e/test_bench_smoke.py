"""``etcdsched bench --smoke`` runs every scenario end to end and renders its
report: the benchmark is a user-facing command, and nothing else in the
suite would notice it breaking. Numbers are not judged here (speed is
measured in docs/benchmarks.md, never asserted in a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCENARIOS = ["raw", "throughput", "idle-lag", "burst", "scan", "memory", "failover"]


def test_the_smoke_bench_runs_every_scenario_and_renders_the_report(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    done = subprocess.run(
        [sys.executable, "-m", "etcdsched.bench", "--smoke",
         "--out-dir", str(tmp_path), "--docs", str(report)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
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
