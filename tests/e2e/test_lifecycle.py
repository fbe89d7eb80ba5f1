"""Job lifecycle end to end, on a real etcd: pause/resume with catch-up,
replace, delete, trigger now, backfill (docs/design.md, "Firing")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from etcdsched.model.errors import Conflict
from etcdsched.model.records import RunRecord
from etcdsched.model.states import RunState
from etcdsched.store.runs import cancel_run
from tests.support.e2e_jobs import (
    every_second,
    intervals,
    iso,
    ledger_ok,
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


def done(count: int) -> Callable[[list[RunRecord]], bool]:
    return lambda runs: sum(r.state is RunState.SUCCEEDED for r in runs) >= count


# -- pause / resume --------------------------------------------------------------
async def paused_through_slots(services: Services, job_id: str) -> tuple[int, int]:
    """Pause after one run and let three slots come due; returns the paused
    slot and how many runs existed at the pause."""
    await wait_runs(services, job_id, done(1))
    await services.jobs.pause(full_id(job_id))
    paused_slot = await services.jobs.next_slot_of(full_id(job_id))
    assert paused_slot is not None, "the paused slot stays recorded"
    before = len(await services.runs_of(job_id))
    await wait_until_ms(paused_slot + 2 * SECOND + 300)
    assert len(await services.runs_of(job_id)) == before, "no new runs while paused"
    return paused_slot, before


async def test_pause_then_resume_with_skip_records_the_paused_slots(
    services: Services,
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    job = await services.jobs.create(spec(every_second(), ["true"]), "pausing")
    paused_slot, before = await paused_through_slots(services, job.id)

    resumed = await services.jobs.resume(job.id, catch_up="skip")
    [skip] = await skips_of(services, job.id)
    assert skip.reason == "paused" and skip.first_slot_ms == paused_slot
    assert skip.last_slot_ms <= resumed.updated_ms < skip.last_slot_ms + SECOND
    assert skip.count == (skip.last_slot_ms - paused_slot) // SECOND + 1 >= 3
    runs = await services.runs_of(job.id)
    assert not [r for r in runs if paused_slot <= r.slot_ms <= skip.last_slot_ms]
    await wait_runs(services, job.id, done(before + 1))  # and the schedule goes on
    await ledger_ok(services, job.id)


async def test_resume_with_run_once_runs_the_latest_paused_slot(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    job = await services.jobs.create(spec(every_second(), ["true"]), "catchup")
    paused_slot, before = await paused_through_slots(services, job.id)

    resumed = await services.jobs.resume(job.id, catch_up="run_once")
    runs = await services.runs_of(job.id)
    [caught_up] = [r for r in runs if paused_slot <= r.slot_ms <= resumed.updated_ms]
    assert resumed.updated_ms - SECOND < caught_up.slot_ms, "the latest missed slot runs"
    missed = (caught_up.slot_ms - paused_slot) // SECOND + 1
    assert missed >= 3 and caught_up.coalesced == missed - 1
    [skip] = await skips_of(services, job.id)
    assert (skip.reason, skip.count, skip.first_slot_ms) == ("paused", missed - 1, paused_slot)
    assert len(runs) >= before + 1
    await wait_state(services, caught_up.id, RunState.SUCCEEDED)
    await ledger_ok(services, job.id)


# -- replace ---------------------------------------------------------------------
async def test_replace_changes_future_slots_and_active_runs_keep_their_snapshot(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    old_ledger, new_ledger = tmp_path / "v1.jsonl", tmp_path / "v2.jsonl"
    old_spec = spec(every_second(), job_argv(old_ledger, 1.5))
    job = await services.jobs.create(old_spec, "updated")

    async def running_v1() -> str:
        starts = [s for s, e in intervals(old_ledger).values() if e is None]
        assert starts
        return str(starts[0]["run"])

    active_id = await assert_eventually(running_v1, timeout=10)
    new_spec = spec(every_second(), job_argv(new_ledger, 0))
    replaced = await services.jobs.replace(job.id, new_spec)
    assert replaced.version == 2

    active = await wait_state(services, active_id, RunState.SUCCEEDED, timeout=5)
    assert active.job_version == 1 and active.spec == old_spec
    assert intervals(old_ledger)[f"{active_id}#1"][1] is not None, "it ran to its end"
    runs = await wait_runs(services, job.id, lambda rs: any(r.job_version == 2 for r in rs))
    for run in runs:
        assert run.spec == (old_spec if run.job_version == 1 else new_spec)
        if run.created_ms >= replaced.updated_ms:
            assert run.job_version == 2, "a slot fired after the update uses the new spec"
    await assert_eventually(lambda: len(intervals(new_ledger)) >= 1, timeout=5)
    await services.jobs.pause(job.id)
    await ledger_ok(services, job.id)


async def test_replace_while_paused_keeps_the_paused_slots_accounted(
    services: Services,
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    job = await services.jobs.create(spec(every_second(), ["true"]), "paused-update")
    paused_slot, _ = await paused_through_slots(services, job.id)

    await services.jobs.replace(job.id, spec(every_second(), ["true"], description="v2"))
    assert await services.jobs.next_slot_of(job.id) == paused_slot, "still marks the pause"
    await services.jobs.resume(job.id, catch_up="skip")
    [skip] = await skips_of(services, job.id)
    assert skip.reason == "paused" and skip.first_slot_ms == paused_slot
    await ledger_ok(services, job.id)


async def test_replace_during_downtime_leaves_overdue_slots_to_the_misfire_policy(
    services: Services,
) -> None:
    start = next_whole_second_ms(margin_ms=300)
    trigger = every_second(start=iso(start), end_at=iso(start + 2500))  # three slots
    job = await services.jobs.create(spec(trigger, ["true"]), "down-update")
    await wait_until_ms(start + 2 * SECOND + 300)  # all three due, none fired
    new_spec = spec(trigger, ["true"], misfire={"policy": "skip", "grace": "200ms"})
    await services.jobs.replace(job.id, new_spec)
    assert await services.jobs.next_slot_of(job.id) == start, "the overdue slot is kept"
    services.start_scheduler("s1")

    async def handled() -> None:
        assert await services.jobs.next_slot_of(job.id) is None

    await assert_eventually(handled, timeout=10)
    [skip] = await skips_of(services, job.id)
    assert (skip.reason, skip.first_slot_ms, skip.count) == ("misfire", start, 3)
    assert await services.runs_of(job.id) == []
    await ledger_ok(services, job.id, until_ms=now_ms())


# -- delete ----------------------------------------------------------------------
async def test_delete_stops_new_runs_keeps_history_and_active_runs_can_be_cancelled(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    ledger = tmp_path / "ledger.jsonl"
    job = await services.jobs.create(
        spec(every_second(), job_argv(ledger, 10), kill_grace="300ms"), "doomed"
    )
    await assert_eventually(lambda: len(intervals(ledger)) >= 1, timeout=10)
    active = await services.jobs.delete(job.id)
    deleted_at = now_ms()
    assert active, "the running run is reported as active"
    assert await services.store.get(services.keys.due_pointer(job.id)) is None

    for rid in active:
        await cancel_run(services.store, services.keys, rid, now_ms(), "job deleted")
    for rid in active:
        run = await wait_state(services, rid, RunState.CANCELLED, timeout=5)
        assert run.attempt <= 1
    await wait_until_ms(deleted_at + 1500)  # a slot would have come due by now
    runs = await services.runs_of(job.id)
    assert {r.id for r in runs} == set(active), "history stays, nothing new"
    for start, end in intervals(ledger).values():
        assert end is None and not pid_alive(int(start["pid"]))


def tolerate_lost() -> dict[str, object]:
    """On a heavily loaded host a worker's 2 s lease can lapse; allow a rerun."""
    return {"max_attempts": 3, "initial_delay": "0s", "retry_on": ["lost"]}


# -- trigger now -----------------------------------------------------------------
def far_future() -> dict[str, object]:
    return {"kind": "at", "at": iso(now_ms() + 3_600_000)}


async def test_trigger_now_runs_while_paused(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    job = await services.jobs.create(spec(far_future(), ["true"]), "manual")
    await services.jobs.pause(job.id)
    run = await services.jobs.trigger(job.id)
    assert run.kind == "manual"
    await wait_state(services, run.id, RunState.SUCCEEDED)
    assert (await services.jobs.get(job.id)).state == "paused"


async def test_trigger_with_overlap_skip_refuses_while_active_unless_forced(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    ledger = tmp_path / "ledger.jsonl"
    job = await services.jobs.create(
        spec(far_future(), job_argv(ledger, 1.0), overlap="skip", retry=tolerate_lost()),
        "single",
    )
    first = await services.jobs.trigger(job.id)
    with pytest.raises(Conflict) as refused:
        await services.jobs.trigger(job.id)
    assert refused.value.field == "force"
    forced = await services.jobs.trigger(job.id, force=True)
    assert forced.id != first.id
    runs = await wait_runs(services, job.id, lambda rs: len(rs) == 2 and terminal(rs))
    assert [r.state for r in runs] == [RunState.SUCCEEDED] * 2
    second = await services.jobs.trigger(job.id)  # nothing active any more
    await wait_state(services, second.id, RunState.SUCCEEDED)


# -- backfill --------------------------------------------------------------------
async def test_backfill_runs_past_slots_once(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    start = now_ms() // SECOND * SECOND - 5 * SECOND
    job = await services.jobs.create(
        spec(every_second(start=iso(start)), ["true"], misfire={"grace": "200ms"}), "bf"
    )
    created = await services.jobs.backfill(job.id, start, job.anchor_ms - 1)
    assert len(created) == (job.anchor_ms - 1 - start) // SECOND + 1 >= 5
    assert await services.jobs.backfill(job.id, start, job.anchor_ms - 1) == [], "idempotent"
    for rid in created:
        run = await wait_state(services, rid, RunState.SUCCEEDED)
        assert run.kind == "backfill" and run.slot_ms < job.anchor_ms
    await services.jobs.pause(job.id)
    await ledger_ok(services, job.id)


async def test_backfill_racing_the_scheduler_leaves_every_slot_explained(
    services: Services,
) -> None:
    """Backfilled runs take slots the scheduler has not fired yet (one overdue
    during a downtime, some still ahead): each slot still becomes one run,
    and none is lost."""
    job = await services.jobs.create(
        spec(every_second(), ["true"], misfire={"grace": "200ms", "policy": "run_all"}),
        "bf-race",
    )
    await wait_until_ms(job.anchor_ms + 2 * SECOND + 300)  # three slots due, none fired
    overdue = await services.jobs.backfill(job.id, job.anchor_ms, job.anchor_ms)
    ahead = await services.jobs.backfill(job.id, now_ms() + SECOND, now_ms() + 2 * SECOND)
    assert len(overdue) == 1 and len(ahead) >= 1
    services.start_scheduler("s1")
    start_worker(services, "w1")
    last_ahead = (await services.run_of(ahead[-1])).slot_ms

    async def fired_past_backfill() -> int:
        nxt = await services.jobs.next_slot_of(job.id)
        assert nxt is not None and nxt > last_ahead
        return nxt

    await assert_eventually(fired_past_backfill, timeout=10)
    await services.jobs.pause(job.id)
    nxt = await services.jobs.next_slot_of(job.id)  # the paused slot
    assert nxt is not None
    runs = await services.runs_of(job.id)
    by_slot = {r.slot_ms: r for r in runs}
    assert sorted(by_slot) == list(range(job.anchor_ms, nxt, SECOND)), "one run per slot"
    assert {r.id for r in runs if r.kind == "backfill"} == set(overdue + ahead)
    await ledger_ok(services, job.id)
