"""Execution end to end, on a real etcd: retries with backoff, timeout,
cancel, placement limits, and logs (docs/design.md, "Run states", "Placement",
"Claims and fencing", "Recovery", "Logs")."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from etcdsched.model.records import ActivePointer
from etcdsched.model.states import RunState
from etcdsched.store.runs import cancel_run
from etcdsched.worker.executor import NoopExecutor
from tests.support.e2e_jobs import (
    intervals,
    ledger_ok,
    max_concurrency,
    now_ms,
    only_run,
    spec,
    start_worker,
    terminal,
    wait_runs,
    wait_state,
    workers_registered,
)
from tests.support.eventually import assert_eventually
from tests.support.ledgerfile import job_argv, pid_alive
from tests.support.services import Services

NOW = {"kind": "now"}
LOOKAHEAD_MS = 300  # the services fixture's: a retry may be placed this early
SLACK_MS = 1000  # scheduling slack on a loaded host


# -- retries ---------------------------------------------------------------------
async def test_retry_backoff_grows_by_the_multiplier(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    retry = {"max_attempts": 4, "initial_delay": "300ms", "multiplier": 2, "jitter": 0}
    job = await services.jobs.create(spec(NOW, ["false"], retry=retry), "backoff")
    run = await wait_state(services, await only_run(services, job.id), RunState.FAILED, timeout=15)

    assert [a.state for a in run.attempts] == [RunState.FAILED] * 4
    for n, (prev, nxt) in enumerate(zip(run.attempts, run.attempts[1:], strict=False)):
        delay = 300 * 2**n
        assert prev.ended_ms is not None and nxt.started_ms is not None
        waited = nxt.started_ms - prev.ended_ms
        assert delay <= waited <= delay + SLACK_MS, (n, delay, waited)
        assert nxt.assigned_ms >= prev.ended_ms + delay - LOOKAHEAD_MS, "placed ahead at most"


async def test_retry_on_decides_which_outcomes_are_retried(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    only_timeouts = {"max_attempts": 2, "initial_delay": "0s", "retry_on": ["timed_out"]}
    failing = await services.jobs.create(spec(NOW, ["false"], retry=only_timeouts), "no-retry")
    hanging = await services.jobs.create(
        spec(NOW, ["sleep", "10"], retry=only_timeouts, timeout="500ms", kill_grace="100ms"),
        "retry-timeout",
    )
    failed = await wait_state(services, await only_run(services, failing.id), RunState.FAILED)
    assert [a.state for a in failed.attempts] == [RunState.FAILED], "failed is not retried"
    timed_out = await wait_state(
        services, await only_run(services, hanging.id), RunState.TIMED_OUT, timeout=10
    )
    assert [a.state for a in timed_out.attempts] == [RunState.TIMED_OUT] * 2


async def test_a_retry_prefers_another_worker(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    start_worker(services, "w2")
    await workers_registered(services, 2)
    retry = {"max_attempts": 2, "initial_delay": "0s", "jitter": 0}
    job = await services.jobs.create(spec(NOW, ["false"], retry=retry), "move")
    run = await wait_state(services, await only_run(services, job.id), RunState.FAILED)
    first, second = run.attempts
    assert {first.worker, second.worker} == {"w1", "w2"}


# -- timeout ---------------------------------------------------------------------
async def test_timeout_kills_the_whole_process_group(services: Services, tmp_path: Path) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    pids = tmp_path / "pids"
    # The grandchild ignores SIGTERM (SIG_IGN survives exec): only SIGKILL after grace stops it.
    script = f'(trap "" TERM; sleep 30 & echo $! >> {pids}; wait) & echo $$ >> {pids}; wait'
    job = await services.jobs.create(
        spec(NOW, ["sh", "-c", script], timeout="1s", kill_grace="300ms"), "slow"
    )

    def both_pids() -> list[int]:
        found = pids.read_text().split() if pids.exists() else []
        assert len(found) == 2, found
        return [int(p) for p in found]

    recorded = await assert_eventually(both_pids, timeout=10)
    run = await wait_state(services, await only_run(services, job.id), RunState.TIMED_OUT)
    attempt = run.attempts[0]
    assert attempt.state is RunState.TIMED_OUT and "timeout" in attempt.reason
    assert attempt.ended_ms is not None and attempt.started_ms is not None
    assert 1000 <= attempt.ended_ms - attempt.started_ms <= 1000 + 300 + 2 * SLACK_MS

    def all_dead() -> None:
        assert not [p for p in recorded if pid_alive(p)], "a process of the job survived"

    await assert_eventually(all_dead, timeout=2)


# -- cancel ----------------------------------------------------------------------
async def test_cancelling_a_pending_run_cancels_it_directly(services: Services) -> None:
    services.start_scheduler("s1")  # no worker: the run stays pending
    job = await services.jobs.create(spec(NOW, ["true"]), "pending")
    rid = await only_run(services, job.id)
    cancelled = await cancel_run(services.store, services.keys, rid, now_ms(), "not needed")
    assert cancelled.state is RunState.CANCELLED and cancelled.reason == "not needed"
    run = await services.run_of(rid)
    assert run.state is RunState.CANCELLED and run.attempts == []
    assert await services.jobs.active_run_ids(job.id) == []
    page = await services.store.range(services.keys.queue_prefix(run.partition))
    assert page.kvs == [], "it left the placement queue"


async def test_cancelling_a_running_run_stops_it_without_retry(
    services: Services, tmp_path: Path
) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    ledger = tmp_path / "ledger.jsonl"
    retry = {"max_attempts": 3, "initial_delay": "0s"}
    job = await services.jobs.create(
        spec(NOW, job_argv(ledger, 10), retry=retry, kill_grace="300ms"), "stop-me"
    )
    await assert_eventually(lambda: len(intervals(ledger)) == 1, timeout=10)
    rid = await only_run(services, job.id)
    await cancel_run(services.store, services.keys, rid, now_ms(), "by test")
    run = await wait_state(services, rid, RunState.CANCELLED, timeout=5)

    assert [a.state for a in run.attempts] == [RunState.CANCELLED], ("no retry", run)
    [(start, end)] = intervals(ledger).values()
    assert end is None, "the process was stopped before it finished"
    await assert_eventually(lambda: not pid_alive(int(start["pid"])), timeout=2)
    await ledger_ok(services, job.id)


# -- placement -------------------------------------------------------------------
async def test_two_schedulers_never_overfill_a_worker(services: Services, tmp_path: Path) -> None:
    services.start_scheduler("s1")
    services.start_scheduler("s2")
    # Eight job processes start at once: let a run whose worker lapsed anyway be rerun.
    start_worker(services, "w1", worker_slots=2)
    start_worker(services, "w2", worker_slots=2)
    await workers_registered(services, 2)
    ledger = tmp_path / "ledger.jsonl"
    retry = {"max_attempts": 3, "initial_delay": "0s", "retry_on": ["lost"]}
    ids = [
        (await services.jobs.create(spec(NOW, job_argv(ledger, 1.5), retry=retry), f"b-{i}")).id
        for i in range(8)
    ]

    async def all_succeeded() -> None:
        for job_id in ids:
            runs = await services.runs_of(job_id)
            assert len(runs) == 1 and runs[0].state is RunState.SUCCEEDED, runs

    await assert_eventually(all_succeeded, timeout=20)
    spans_by_worker: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for start, end in intervals(ledger).values():
        if end is None:
            continue  # an attempt fenced when its worker's lease lapsed
        spans_by_worker[str(start["worker"])].append((start["mono"], end["mono"]))
    peaks = {w: max_concurrency(spans) for w, spans in spans_by_worker.items()}
    assert max(peaks.values()) == 2 and len(peaks) >= 2, peaks


async def test_a_run_no_worker_can_take_waits_with_a_reason(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    await workers_registered(services, 1)
    labelled = await services.jobs.create(spec(NOW, ["true"], selector={"pool": "gpu"}), "sel")
    needy = await services.jobs.create(spec(NOW, ["true"], resources={"gpu": 1}), "gpu")

    async def waiting(job_id: str) -> str:
        runs = await services.runs_of(job_id)
        assert len(runs) == 1, runs
        run = runs[0]
        assert run.state is RunState.PENDING and run.reason.startswith("waiting: no worker")
        return run.reason

    assert "pool" in await assert_eventually(lambda: waiting(labelled.id), timeout=5)
    assert "gpu" in await assert_eventually(lambda: waiting(needy.id), timeout=5)
    start_worker(services, "w2", worker_labels={"pool": "gpu"}, worker_gpu=1)
    for job_id in (labelled.id, needy.id):
        [run] = await wait_runs(services, job_id, lambda rs: len(rs) == 1 and terminal(rs))
        assert run.state is RunState.SUCCEEDED and run.attempts[0].worker == "w2"


# -- logs ------------------------------------------------------------------------
async def test_logs_of_a_finished_run_outlive_its_worker(services: Services) -> None:
    services.start_scheduler("s1")
    start_worker(services, "w1")
    job = await services.jobs.create(
        spec(NOW, ["sh", "-c", "echo to-stdout; echo to-stderr >&2"]), "chatty"
    )
    run = await wait_state(services, await only_run(services, job.id), RunState.SUCCEEDED)
    await services.stop("w1")

    chunk = await services.logs.read(run.id)
    assert sorted(chunk.data.decode().splitlines()) == ["to-stderr", "to-stdout"]
    assert chunk.complete and chunk.attempt == 1


# -- writes per run --------------------------------------------------------------
async def test_a_job_that_ended_before_its_start_was_written_is_reported_in_one_write(
    services: Services,
) -> None:
    """Created already assigned (fired onto a worker with room, ADR 0016),
    then ended: the run key is written twice, and the attempt still has its
    start (the ``running`` write is folded into the report when the job has
    already ended, as a no-op always has)."""
    services.start_scheduler("s1")
    services.start_worker("w1", NoopExecutor())
    await workers_registered(services, 1)
    job = await services.jobs.create(spec(NOW, ["true"]), "instant")
    run = await wait_state(services, await only_run(services, job.id), RunState.SUCCEEDED)
    attempt = run.attempts[0]
    assert attempt.started_ms is not None and attempt.ended_ms is not None
    assert attempt.started_ms <= attempt.ended_ms and attempt.exit_code == 0
    stored = await services.store.get(services.keys.run(run.id))
    assert stored is not None and stored.version == 2


async def test_a_claim_rewrites_the_active_pointer_only_to_add_a_hang_deadline(
    services: Services,
) -> None:
    """Fired onto the worker, with its attempt (version 1); the claim adds
    nothing to that unless the job has a timeout, whose deadline the pointer
    then carries (2)."""
    services.start_scheduler("s1")
    services.start_worker("w1")
    await workers_registered(services, 1)
    await services.jobs.create(spec(NOW, ["sleep", "3"]), "plain")
    await services.jobs.create(spec(NOW, ["sleep", "3"], timeout="1m"), "timed")
    for job_id, version, has_deadline in (("plain", 1, False), ("timed", 2, True)):
        run = await wait_state(services, await only_run(services, job_id), RunState.RUNNING)
        stored = await services.store.get(services.keys.active(run.partition, run.id))
        assert stored is not None and stored.version == version, (job_id, stored)
        pointer = stored.decode(ActivePointer).value
        assert (pointer.worker, pointer.attempt) == ("w1", 1)
        assert (pointer.deadline_ms is not None) is has_deadline
