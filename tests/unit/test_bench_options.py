"""What the throughput scenario offers each executor, and what counts as a
reduced (not publishable) run."""

from __future__ import annotations

from etcdsched.bench.options import BenchOptions, offered_rate, worker_slots_for


def test_each_executor_is_offered_its_own_rate() -> None:
    options = BenchOptions(rate=2000, process_rate=600)
    assert offered_rate(options, "noop") == 2000
    assert offered_rate(options, "process") == 600


def test_a_lower_process_rate_makes_the_run_reduced() -> None:
    assert not BenchOptions().reduced
    lower = BenchOptions(process_rate=BenchOptions().process_rate - 1)
    assert lower.reduced and any(d.startswith("process_rate=") for d in lower.deviations())


def test_noop_workers_get_room_for_the_lookahead_and_process_workers_do_not() -> None:
    options = BenchOptions(worker_slots=256, noop_worker_slots=4096)
    assert worker_slots_for(options, "noop") == 4096
    assert worker_slots_for(options, "process") == 256
