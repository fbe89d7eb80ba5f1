"""A short fault-injection run (about two minutes): real etcd cluster,
schedulers and workers under kill -9, SIGSTOP, etcd member crashes, cancel
and update storms; the history checker must find no violation.

The long run is ``make faults`` (``python -m tests.faults.harness``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.harness import HarnessConfig, run_harness
from tests.faults.report import render_markdown, render_text

pytestmark = pytest.mark.slow
SEED = 7
DURATION_S = 75.0


@pytest.mark.timeout(290)
def test_short_fault_injection_run_keeps_every_promise(tmp_path: Path) -> None:
    config = HarnessConfig(duration_s=DURATION_S, seed=SEED, work_dir=tmp_path)
    outcome = run_harness(config, command=f"pytest {__file__} (seed {SEED})")
    text = render_text(outcome)
    print(text)
    (tmp_path / "report.md").write_text(render_markdown(outcome))
    report = outcome.report
    assert report.ok, text
    assert len(outcome.faults) >= DURATION_S / 3, "too few faults were injected"
    assert report.slots_by_run > 100, "the workload hardly ran"
    assert report.attempts_by_state["lost"] > 0, "no attempt was lost: faults had no effect"
    assert report.executions > 0 and outcome.info.ledger_bad_lines == 0
