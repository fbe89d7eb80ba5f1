"""Dependencies end to end, on a real etcd (docs/dependencies.md): a run of a
``depends_on`` job waits for the latest upstream run at or before its slot,
whatever the two schedules; an ``after`` job runs each time its upstream
jobs have ended as asked. (Same-schedule and upstream-failure cases are in
test_policies.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from etcdsched.model.errors import InvalidInput
from etcdsched.model.states import RunState
from tests.support.e2e_jobs import (
    every_second,
    intervals,
    iso,
    ledger_ok,
    next_whole_second_ms,
    now_ms,
    spec,
    start_worker,
    terminal,
    wait_runs,
    wait_until_ms,
)
from tests.support.eventually import assert_eventually
from tests.support.ledgerfile import job_argv
from tests.support.services import Services, full_id

HOUR_AHEAD = {"kind": "at", "at": "2999-01-01T00:00:00Z"}
"""A job that only runs when triggered."""


def started(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")


async def test_a_one_off_waits_for_the_latest_run_of_an_interval_upstream(
    services: Services, tmp_path: Path
) -> None:
    """B at T+1.5 s depends on A (every second from T, each run 1 s): the
    latest run of A at or before B's slot is A's run for T+1 s, so B starts
    once that run has succeeded, not when the earlier one did."""
    started(services)
    start = next_whole_second_ms(margin_ms=1500)
    up_ledger, down_ledger = tmp_path / "up.jsonl", tmp_path / "down.jsonl"
    trigger = every_second(start=iso(start), max_runs=2)
    await services.jobs.create(spec(trigger, job_argv(up_ledger, 1.0)), "up")
    at = {"kind": "at", "at": iso(start + 1500)}
    await services.jobs.create(spec(at, job_argv(down_ledger), depends_on=["up"]), "down")
    [down] = await wait_runs(services, "down", lambda rs: len(rs) == 1 and terminal(rs), 15)
    ups = await wait_runs(services, "up", lambda rs: len(rs) == 2 and terminal(rs))

    assert down.state is RunState.SUCCEEDED, down
    second = next(r for r in ups if r.slot_ms == start + 1000)
    assert second.current is not None and down.current is not None
    assert down.current.started_ms >= second.current.ended_ms  # type: ignore[operator]
    [(down_start, _)] = intervals(down_ledger).values()
    up_ends = sorted(end["mono"] for _, end in intervals(up_ledger).values() if end)
    assert down_start["mono"] >= up_ends[-1], "B started before A's run for T+1 s ended"


async def test_a_run_waiting_too_long_for_its_upstream_is_skipped_naming_it(
    services: Services,
) -> None:
    """A has no run at or before B's slot: ``run get`` says B waits for one,
    and after ``dependency_timeout`` B's run is skipped saying so."""
    started(services)
    await services.jobs.create(spec(HOUR_AHEAD, ["true"]), "never")
    await services.jobs.create(
        spec({"kind": "now"}, ["true"], depends_on=["never"], dependency_timeout="3s"), "waits"
    )

    async def says_what_it_waits_for() -> None:
        runs = await services.runs_of("waits")
        assert len(runs) == 1, runs
        assert runs[0].reason.startswith(f"waiting for a run of {full_id('never')}"), runs[0].reason

    await assert_eventually(says_what_it_waits_for, timeout=15)
    [run] = await wait_runs(services, "waits", terminal, timeout=10)
    assert run.state is RunState.SKIPPED and run.attempts == []
    assert run.reason.startswith("dependency timeout passed, still waiting for a run of")
    assert run.current is None


async def test_an_upstream_slot_that_was_skipped_skips_the_downstream_run(
    services: Services,
) -> None:
    """A's slot T passed while A was paused: until A resumes, B's run for T
    waits for A's run for T; on resume (catch-up skip) A's slot gets a skip
    record, and B's run is skipped naming it."""
    started(services)
    start = next_whole_second_ms(margin_ms=1500)
    trigger = {"kind": "at", "at": iso(start)}
    no_grace = {"grace": "0s"}  # resumed a moment after its slot, A must not run it
    upstream = await services.jobs.create(spec(trigger, ["true"], misfire=no_grace), "paused-up")
    await services.jobs.pause(upstream.id)
    await services.jobs.create(spec(trigger, ["true"], depends_on=["paused-up"]), "after-paused")

    async def waits_for_the_slot() -> None:
        runs = await services.runs_of("after-paused")
        assert len(runs) == 1, runs
        assert runs[0].reason.startswith(f"waiting for upstream {upstream.id}'s run for slot")

    await assert_eventually(waits_for_the_slot, timeout=10)
    await wait_until_ms(start + 100)
    await services.jobs.resume(upstream.id)
    [run] = await wait_runs(services, "after-paused", terminal, timeout=10)
    assert run.state is RunState.SKIPPED, run
    assert f"upstream {upstream.id}'s slot" in run.reason and "paused" in run.reason, run.reason


async def test_missing_upstreams_and_cycles_are_refused(services: Services) -> None:
    await services.jobs.create(spec(HOUR_AHEAD, ["true"]), "a")
    with pytest.raises(InvalidInput) as missing:
        await services.jobs.create(spec(HOUR_AHEAD, ["true"], depends_on=["nope"]), "b")
    assert missing.value.field == "spec.depends_on[0]"
    await services.jobs.create(spec(HOUR_AHEAD, ["true"], depends_on=["a"]), "b")
    with pytest.raises(InvalidInput) as cycle:
        await services.jobs.replace(full_id("a"), spec(HOUR_AHEAD, ["true"], depends_on=["b"]))
    assert "cycle" in str(cycle.value)
    after_b = {"kind": "after", "jobs": ["b"]}
    await services.jobs.create(spec(after_b, ["true"]), "c")
    with pytest.raises(InvalidInput) as after_cycle:
        await services.jobs.replace(full_id("a"), spec({"kind": "after", "jobs": ["c"]}, ["true"]))
    assert "cycle" in str(after_cycle.value)
    with pytest.raises(InvalidInput) as after_missing:
        await services.jobs.create(spec({"kind": "after", "jobs": ["a", "zz"]}, ["true"]), "d")
    assert after_missing.value.field == "spec.trigger.jobs[1]"


# -- the after trigger -----------------------------------------------------------------
async def test_an_after_job_runs_once_each_time_all_its_upstreams_have_succeeded(
    services: Services,
) -> None:
    started(services)
    for name in ("extract", "load"):
        await services.jobs.create(spec(HOUR_AHEAD, ["true"]), name)
    after = {"kind": "after", "jobs": ["extract", "load"], "on": "success"}
    await services.jobs.create(spec(after, ["true"]), "report")

    extract = await services.jobs.trigger(full_id("extract"))
    await wait_runs(services, "extract", lambda rs: rs[0].state is RunState.SUCCEEDED)
    load = await services.jobs.trigger(full_id("load"))
    [first] = await wait_runs(services, "report", lambda rs: len(rs) == 1 and terminal(rs), 10)
    assert first.state is RunState.SUCCEEDED
    assert extract.id in first.fired_note and load.id in first.fired_note, first.fired_note
    assert first.slot_ms >= now_ms() - 10_000

    await services.jobs.trigger(full_id("extract"))  # only one upstream ran again
    await wait_runs(services, "extract", lambda rs: len(rs) == 2 and terminal(rs))
    again = await services.jobs.trigger(full_id("load"))
    runs = await wait_runs(services, "report", lambda rs: len(rs) == 2 and terminal(rs), 10)
    assert again.id in runs[1].fired_note
    assert len(await services.runs_of("report")) == 2, "one run per round, no more"


async def test_on_success_ignores_a_failed_upstream_run_and_on_completion_does_not(
    services: Services,
) -> None:
    started(services)
    await services.jobs.create(spec(HOUR_AHEAD, ["false"]), "flaky")
    await services.jobs.create(spec({"kind": "after", "jobs": ["flaky"]}, ["true"]), "on-ok")
    on_end = {"kind": "after", "jobs": ["flaky"], "on": "completion"}
    await services.jobs.create(spec(on_end, ["true"]), "on-end")
    failed = await services.jobs.trigger(full_id("flaky"))

    [run] = await wait_runs(services, "on-end", lambda rs: len(rs) == 1 and terminal(rs), 10)
    assert f"{failed.id} (failed)" in run.fired_note
    assert await services.runs_of("on-ok") == [], "a failed upstream run triggers no on-success job"
    await ledger_ok(services, "on-end")
