"""Delete and replace withdraw runs already fired for later slots, as pause
does (issue 29; docs/design.md, "Jobs change between slots"). With a 3 s
lookahead the next slots' runs exist before their instant; none of them may
start under the old spec once the job is deleted or changed, while a run
already going ends normally."""

from __future__ import annotations

from pathlib import Path

from etcdsched.model.records import RunRecord
from etcdsched.model.states import RunState
from tests.support.e2e_jobs import every_second, intervals, now_ms, spec, start_worker
from tests.support.eventually import assert_eventually
from tests.support.ledgerfile import job_argv, read_ledger
from tests.support.services import Services


def started_runs(ledger: Path) -> set[str]:
    return {key.split("#")[0] for key in intervals(ledger)} if ledger.exists() else set()


def not_started(run: RunRecord) -> bool:
    return run.state in (RunState.PENDING, RunState.ASSIGNED)


async def fired_ahead(services: Services, job_id: str, running: bool) -> None:
    runs = await services.runs_of(job_id)
    assert sum(not_started(r) and r.slot_ms > now_ms() for r in runs) >= 2, runs
    if running:
        assert any(r.state is RunState.RUNNING for r in runs), runs
    else:
        assert any(r.state is RunState.SUCCEEDED for r in runs), runs


async def all_ended(services: Services, job_id: str) -> list[RunRecord]:
    runs = await services.runs_of(job_id)
    assert runs and all(r.state.terminal for r in runs), runs
    return runs


async def test_delete_withdraws_every_run_not_started_and_lets_a_running_one_end(
    services: Services, tmp_path: Path
) -> None:
    services.config = services.config.model_copy(update={"lookahead_ms": 3000})
    services.start_scheduler("s1")
    start_worker(services, "w1", worker_slots=8)
    ledger = tmp_path / "ledger.jsonl"
    job = await services.jobs.create(spec(every_second(), job_argv(ledger, 1.5)), "deleting")

    await assert_eventually(lambda: fired_ahead(services, job.id, running=True), timeout=15)
    before = {r.id: r.state for r in await services.runs_of(job.id)}
    deleted_at = now_ms()
    await services.jobs.delete(job.id)

    runs = await assert_eventually(lambda: all_ended(services, job.id), timeout=15)
    started = started_runs(ledger)
    withdrawn = [r for r in runs if r.id not in started]
    assert any(r.slot_ms > deleted_at for r in withdrawn), "no run had been fired ahead"
    for run in withdrawn:
        assert run.state is RunState.CANCELLED, run
        assert "withdrawn: job deleted" in run.reason, run
    going = [r for r in runs if before.get(r.id) is RunState.RUNNING]
    assert going and all(r.state is RunState.SUCCEEDED for r in going), going
    ends = {line["run"] for line in read_ledger(ledger) if line["event"] == "end"}
    assert started == ends, "every run that started ran to its end"


async def test_replace_withdraws_old_runs_of_later_slots_and_the_new_spec_fires(
    services: Services, tmp_path: Path
) -> None:
    services.config = services.config.model_copy(update={"lookahead_ms": 3000})
    services.start_scheduler("s1")
    start_worker(services, "w1", worker_slots=8)
    old_ledger, new_ledger = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    job = await services.jobs.create(spec(every_second(), job_argv(old_ledger)), "changing")

    await assert_eventually(lambda: fired_ahead(services, job.id, running=False), timeout=15)
    changed = await services.jobs.replace(job.id, spec(every_second(), job_argv(new_ledger)))
    assert changed.version == 2

    async def new_spec_runs() -> None:
        assert len(started_runs(new_ledger)) >= 2

    await assert_eventually(new_spec_runs, timeout=15)
    runs = {r.id: r for r in await services.runs_of(job.id)}
    old_later = [r for r in runs.values() if r.job_version == 1 and r.slot_ms > changed.updated_ms]
    assert old_later, "no run had been fired ahead of the change"

    async def withdrawn() -> None:
        for run in await services.runs_of(job.id):
            if run.job_version == 1 and run.slot_ms > changed.updated_ms:
                assert run.state is RunState.CANCELLED, run
                assert "withdrawn: job changed before its slot" in run.reason, run

    await assert_eventually(withdrawn, timeout=10)
    late_old = [rid for rid in started_runs(old_ledger) if runs[rid].slot_ms > changed.updated_ms]
    assert late_old == [], "a run of the old spec started for a slot after the change"
    for rid in started_runs(new_ledger):
        assert runs[rid].job_version == 2 and runs[rid].slot_ms > changed.updated_ms


async def test_replace_that_changes_neither_trigger_nor_execution_withdraws_nothing(
    services: Services, tmp_path: Path
) -> None:
    services.config = services.config.model_copy(update={"lookahead_ms": 3000})
    services.start_scheduler("s1")
    start_worker(services, "w1", worker_slots=8)
    ledger = tmp_path / "ledger.jsonl"
    job = await services.jobs.create(spec(every_second(), job_argv(ledger)), "retitled")

    await assert_eventually(lambda: fired_ahead(services, job.id, running=False), timeout=15)
    await services.jobs.replace(
        job.id, spec(every_second(), job_argv(ledger), description="only the text")
    )
    ahead = [r for r in await services.runs_of(job.id) if r.job_version == 1 and not_started(r)]
    assert ahead

    async def ran() -> None:
        for run in ahead:
            assert (await services.run_of(run.id)).state is RunState.SUCCEEDED

    await assert_eventually(ran, timeout=15)
