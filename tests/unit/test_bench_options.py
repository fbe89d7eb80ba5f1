"""What the throughput scenario offers each executor, and what counts as a
reduced (not publishable) run."""

from __future__ import annotations

from etcdsched.bench.options import BenchOptions, offered_rate


def test_each_executor_is_offered_its_own_rate() -> None:
    options = BenchOptions(rate=2000, process_rate=600)
    assert offered_rate(options, "noop") == 2000
    assert offered_rate(options, "process") == 600


def test_a_lower_process_rate_makes_the_run_reduced() -> None:
    assert not BenchOptions().reduced
    lower = BenchOptions(process_rate=BenchOptions().process_rate - 1)
    assert lower.reduced and any(d.startswith("process_rate=") for d in lower.deviations())
