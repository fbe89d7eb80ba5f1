"""Scheduling policies end to end, on a real etcd: misfire, starting
deadline, overlap and depends_on (docs/design.md, "Firing", "Placement")."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from etcdsched.model.records import RunRecord
from etcdsched.model.states import RunState
from etcdsched.runtime.metrics import SKIPPED_SLOTS
from tests.support.e2e_jobs import (
    every_second,
    intervals,
    iso,
    ledger_ok,
    max_concurrency,
    next_whole_second_ms,
    now_ms,
    skips_of,
    spec,
    start_worker,
    terminal,
    wait_runs,
    wait_state,
    wait_until_ms,
)
from tests.support.eventually import assert_eventually
from tests.support.ledgerfile import job_argv, pid_alive
from tests.support.services import Services, full_id

SECOND = 1000


# -- misfire ---------------------------------------------------------------------
MISSED = 4  # slots start .. start+3s; ``end_at`` bounds the trigger so nothing fires after


async def downtime_jobs(services: Services, policies: dict[str, dict[str, object]]) -> list[int]:
    """Create every-second jobs while no scheduler runs, let their four slots
    come due unfired, then start a scheduler; returns the missed slots."""
    start = next_whole_second_ms(margin_ms=300)
    trigger = every_second(start=iso(start), end_at=iso(start + 3500))
    for job_id, misfire in policies.items():
        await services.jobs.create(
            spec(trigger, ["true"], misfire={"grace": "200ms", **misfire}), job_id
        )
    slots = [start + k * SECOND for k in range(MISSED)]
    await wait_until_ms(slots[-1] + 300)  # the last one is past its grace too
    services.start_scheduler("s1")
    for job_id in policies:

        async def handled(job_id: str = job_id) -> None:
            assert await services.jobs.next_slot_of(full_id(job_id)) is None, "not fired yet"

        await assert_eventually(handled, timeout=10)
    return slots


async def test_misfire_skip_records_one_skip_for_every_missed_slot(services: Services) -> None:
    slots = await downtime_jobs(services, {"mf-skip": {"policy": "skip"}})

    assert await services.runs_of("mf-skip") == []
    [skip] = await skips_of(services, "mf-skip")
    assert (skip.reason, skip.count) == ("misfire", MISSED)
    assert (skip.first_slot_ms, skip.last_slot_ms) == (slots[0], slots[-1])
    await ledger_ok(services, "mf-skip", until_ms=now_ms())


async def test_misfire_run_once_coalesces_missed_slots_into_one_run(services: Services) -> None:
    slots = await downtime_jobs(services, {"mf-once": {"policy": "run_once"}})

    [run] = await services.runs_of("mf-once")
    assert run.slot_ms == slots[-1], "the latest missed slot runs"
    assert run.coalesced == MISSED - 1
    assert run.fired_note.startswith("misfire:"), "the run record says why it ran"
    [skip] = await skips_of(services, "mf-once")
    assert (skip.reason, skip.count) == ("misfire", MISSED - 1)
    assert (skip.first_slot_ms, skip.last_slot_ms) == (slots[0], slots[-1] - 1)
    await ledger_ok(services, "mf-once", until_ms=now_ms())


async def test_misfire_run_all_is_bounded_by_max_catch_up_and_window(services: Services) -> None:
    window = 2500
    slots = await downtime_jobs(
        services,
        {
            "mf-max": {"policy": "run_all", "max_catch_up": 2},
            "mf-window": {"policy": "run_all", "catch_up_window": f"{window}ms"},
        },
    )

    capped = await services.runs_of("mf-max")
    assert [r.slot_ms for r in capped] == slots[-2:], "the latest max_catch_up slots run"
    windowed = await services.runs_of("mf-window")
    fired_at = windowed[0].created_ms
    recent = [s for s in slots if s > fired_at - window]
    assert [r.slot_ms for r in windowed] == recent, "every slot inside the window runs"
    assert len(recent) < MISSED, "and older slots do not"
    for job_id, runs in (("mf-max", capped), ("mf-window", windowed)):
        [skip] = await skips_of(services, job_id)
        assert (skip.reason, skip.count) == ("misfire", MISSED - len(runs))
        assert (skip.first_slot_ms, skip.last_slot_ms) == (slots[0], runs[0].slot_ms - 1)
        await ledger_ok(services, job_id, until_ms=now_ms())


# -- starting deadline -----------------------------------------------------------
async def test_run_not_placed_before_its_starting_deadline_is_skipped(
    services: Services,
) -> None:
    services.start_scheduler("s1")
    job = await services.jobs.create(
        spec({"kind": "now"}, ["true"], starting_deadline="500ms"), "late"
    )
    [run] = await wait_runs(services, job.id, lambda rs: len(rs) == 1)
    ended = await wait_state(services, run.id, RunState.SKIPPED, timeout=5)
    assert ended.reason == "starting deadline passed"
    assert ended.attempts == [] and ended.updated_ms >= ended.not_before_ms + 500
    await ledger_ok(services, job.id)


# -- overlap ---------------------------------------------------------------------
async def overlapping_job(
    services: Services, tmp_path: Path, name: str, overlap: str, sleep: float, **extra: object
) -> tuple[str, Path]:
    ledger = tmp_path / f"{name}.jsonl"
    job = await services.jobs.create(
        spec(every_second(), job_argv(ledger, sleep), overlap=overlap, **extra), name
    )
    return job.id, ledger


def spans_of(ledger: Path) -> list[tuple[float, float]]:
    return [(s["mono"], e["mono"]) for s, e in intervals(ledger).values() if e is not None]


async def test_overlap_allow_runs_two_runs_of_one_job_at_once(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    job_id, ledger = await overlapping_job(services, tmp_path, "allow", "allow", 2.0)
    await wait_runs(services, job_id, lambda rs: len(succeeded(rs)) >= 2, timeout=10)
    await services.jobs.pause(full_id(job_id))

    assert max_concurrency(spans_of(ledger)) >= 2
    assert await skips_of(services, job_id) == []
    await ledger_ok(services, job_id)


def succeeded(runs: list[RunRecord]) -> list[RunRecord]:
    return [r for r in runs if r.state is RunState.SUCCEEDED]


async def test_overlap_skip_records_slots_that_come_due_while_a_run_is_active(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    counted_before = SKIPPED_SLOTS.labels(reason="overlap")._value.get()
    job_id, ledger = await overlapping_job(services, tmp_path, "skip", "skip", 1.6)

    async def skipped_then_ran_again() -> None:
        skips = await skips_of(services, job_id)
        assert skips and {s.reason for s in skips} == {"overlap"}, skips
        assert len(succeeded(await services.runs_of(job_id))) >= 2

    await assert_eventually(skipped_then_ran_again, timeout=10)
    await services.jobs.pause(full_id(job_id))
    assert max_concurrency(spans_of(ledger)) == 1
    assert all(s.count == 1 for s in await skips_of(services, job_id))

    async def counted_once_committed() -> None:
        """etcdsched_skipped_slots_total counts the committed records' slots."""
        counted = SKIPPED_SLOTS.labels(reason="overlap")._value.get() - counted_before
        assert counted == sum(s.count for s in await skips_of(services, job_id))

    await assert_eventually(counted_once_committed, timeout=5)
    await ledger_ok(services, job_id)


async def test_overlap_queue_one_keeps_one_waiting_run_and_skips_the_rest(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    job_id, ledger = await overlapping_job(services, tmp_path, "queue1", "queue_one", 1.3)

    async def queued_ran_and_overflow_skipped() -> None:
        runs = await services.runs_of(job_id)
        waiting = [r for r in runs if r.state is RunState.PENDING]
        assert len(waiting) <= 1, f"more than one run waits: {waiting}"  # checked every poll
        assert any(s.reason == "overlap" for s in await skips_of(services, job_id))
        assert len(succeeded(runs)) >= 3

    await assert_eventually(queued_ran_and_overflow_skipped, timeout=12, interval=0.02)
    await services.jobs.pause(full_id(job_id))
    runs = succeeded(await services.runs_of(job_id))
    assert max_concurrency(spans_of(ledger)) == 1
    waited = 0
    for prev, nxt in pairwise(runs):
        prev_end, next_start = prev.attempts[-1].ended_ms, nxt.attempts[-1].started_ms
        assert prev_end is not None and next_start is not None
        assert next_start >= prev_end, "a queued run starts only after the previous one ended"
        if nxt.not_before_ms < prev_end:  # it was due while the previous ran: it waited
            waited += 1
            assert next_start - prev_end < 2000, "and starts promptly once it ended"
    assert waited >= 1
    assert all(s.reason == "overlap" for s in await skips_of(services, job_id))
    await ledger_ok(services, job_id)


async def test_overlap_cancel_previous_cancels_the_running_run_for_the_new_one(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    ledger = tmp_path / "ledger.jsonl"
    trigger = {"kind": "interval", "every": "2s", "max_runs": 2}
    job = await services.jobs.create(
        spec(trigger, job_argv(ledger, 3.0), overlap="cancel_previous", kill_grace="300ms"),
        "cancelprev",
    )

    async def previous_cancelled_newer_started() -> list[RunRecord]:
        runs = await services.runs_of(job.id)
        assert len(runs) == 2 and runs[0].state is RunState.CANCELLED, runs
        assert f"{runs[1].id}#1" in intervals(ledger), "the newer run has not started"
        return runs

    previous, newer = await assert_eventually(previous_cancelled_newer_started, timeout=10)
    assert [a.state for a in previous.attempts] == [RunState.CANCELLED]
    assert previous.cancel_requested
    spans = intervals(ledger)
    start, end = spans[f"{previous.id}#1"]  # it was running when the newer slot came
    assert end is None, "the cancelled run was stopped before it finished"
    assert start["mono"] < spans[f"{newer.id}#1"][0]["mono"]
    assert not pid_alive(int(start["pid"]))
    await ledger_ok(services, job.id)


async def test_cancel_previous_cancels_each_run_at_the_next_slot_not_a_lead_earlier(
    services: Services,
) -> None:
    """Issue 29: at a 2 s interval, each run of a job that outlives its
    interval is cancelled when the next slot starts (it got ~8.5 s of a
    10 s interval when the cancel went out at firing, a lookahead early),
    and the record says it was superseded, not cancelled by a person."""
    services.start_scheduler("s1")
    start_worker(services, "w1")
    trigger = {"kind": "interval", "every": "2s", "max_runs": 4}
    job = await services.jobs.create(
        spec(trigger, ["sleep", "30"], overlap="cancel_previous", kill_grace="0s"), "supersede"
    )

    async def three_superseded() -> list[RunRecord]:
        runs = sorted(await services.runs_of(job.id), key=lambda r: r.slot_ms)
        assert len(runs) == 4 and all(r.state is RunState.CANCELLED for r in runs[:3]), runs
        return runs

    runs = await assert_eventually(three_superseded, timeout=20)
    for previous, newer in pairwise(runs):
        attempt = previous.attempts[-1]
        assert attempt.ended_ms is not None and "superseded by slot" in attempt.reason, attempt
        print(f"cancelled {attempt.ended_ms - newer.not_before_ms:+d} ms from the next slot")
        assert abs(attempt.ended_ms - newer.not_before_ms) <= 100, (attempt, newer.not_before_ms)
    await services.jobs.delete(job.id)


# -- depends_on ------------------------------------------------------------------
def shared_trigger(start_ms: int, runs: int) -> dict[str, object]:
    return every_second(start=iso(start_ms), max_runs=runs)


async def test_downstream_run_starts_after_the_upstream_run_of_its_slot_succeeded(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    trigger = shared_trigger(next_whole_second_ms(margin_ms=1500), 2)
    up_ledger, down_ledger = tmp_path / "up.jsonl", tmp_path / "down.jsonl"
    await services.jobs.create(spec(trigger, job_argv(up_ledger, 0.6)), "up")
    await services.jobs.create(spec(trigger, job_argv(down_ledger), depends_on=["up"]), "down")
    ups = await wait_runs(services, "up", lambda rs: len(rs) == 2 and terminal(rs), timeout=10)
    downs = await wait_runs(services, "down", lambda rs: len(rs) == 2 and terminal(rs), timeout=10)

    assert [r.state for r in ups + downs] == [RunState.SUCCEEDED] * 4
    ends = {e["slot_ms"]: e["mono"] for _, e in intervals(up_ledger).values() if e}
    starts = {s["slot_ms"]: s["mono"] for s, _ in intervals(down_ledger).values()}
    assert sorted(starts) == sorted(ends) == [r.slot_ms for r in downs]
    for slot, start in starts.items():
        assert start >= ends[slot], "downstream started before its upstream ended"
    for up, down in zip(ups, downs, strict=True):
        assert down.attempts[0].started_ms >= up.attempts[0].ended_ms  # type: ignore[operator]
    await ledger_ok(services, "up")
    await ledger_ok(services, "down")


async def test_downstream_run_is_skipped_when_the_upstream_run_failed(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    trigger = shared_trigger(next_whole_second_ms(margin_ms=1500), 1)
    down_ledger = tmp_path / "down.jsonl"
    await services.jobs.create(spec(trigger, ["false"]), "up")
    await services.jobs.create(spec(trigger, job_argv(down_ledger), depends_on=["up"]), "down")
    [up] = await wait_runs(services, "up", lambda rs: len(rs) == 1 and terminal(rs), timeout=10)
    [down] = await wait_runs(services, "down", lambda rs: len(rs) == 1 and terminal(rs))

    assert up.state is RunState.FAILED
    assert down.state is RunState.SKIPPED and down.slot_ms == up.slot_ms
    assert "upstream" in down.reason and down.attempts == []
    assert not down_ledger.exists(), "the downstream job never ran"
    await ledger_ok(services, "down")


async def test_pause_withdraws_runs_already_fired_for_later_slots(
    services: Services, tmp_path: Path
) -> None:
    """Issue 29: with a 3 s lookahead, runs for the next slots exist when the
    job is paused; none of them may start (34 did in the issue's test)."""
    services.config = services.config.model_copy(update={"lookahead_ms": 3000})
    services.start_scheduler("s1")
    start_worker(services, "w1")
    ledger = tmp_path / "ledger.jsonl"
    job = await services.jobs.create(spec(every_second(), job_argv(ledger, 0.0)), "pausing")

    async def fired_ahead() -> None:
        runs = await services.runs_of(job.id)
        assert any(r.state is RunState.SUCCEEDED for r in runs), runs
        assert sum(not r.state.terminal for r in runs) >= 2, runs  # later slots fired ahead

    await assert_eventually(fired_ahead, timeout=15)
    paused = await services.jobs.pause(job.id)
    assert paused.paused_ms is not None
    await wait_until_ms(paused.paused_ms + 3000 + 1000)  # past every slot fired ahead
    later = [r for r in await services.runs_of(job.id) if r.slot_ms > paused.paused_ms]
    assert later, "no run had been fired ahead of the pause"
    started = {key.split("#")[0] for key in intervals(ledger)}
    for run in later:
        assert run.state is RunState.CANCELLED and run.id not in started, run
        assert "job paused" in run.reason, run
