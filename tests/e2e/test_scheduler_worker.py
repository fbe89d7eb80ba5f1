"""Schedulers and workers together, in-process, on a real etcd."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pytest

from etcdsched.logs.store import DirLogWriter
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState
from etcdsched.store.runs import cancel_run
from etcdsched.worker.service import WorkerService
from tests.support.eventually import assert_eventually
from tests.support.services import Services


def spec(trigger: dict[str, object], argv: list[str], **extra: object) -> JobSpec:
    return JobSpec.model_validate({"trigger": trigger, "execution": {"argv": argv}, **extra})


async def run_once(services: Services, job_spec: JobSpec, name: str, ends: RunState) -> RunRecord:
    """Start a scheduler and a worker, submit ``job_spec`` as ``name``, and
    return its first run once that is in state ``ends``."""
    services.start_scheduler("s1")
    services.start_worker("w1")
    job = await services.jobs.create(job_spec, name)

    async def ended() -> RunRecord:
        runs = await services.runs_of(job.id)
        assert runs and runs[0].state is ends, runs
        return runs[0]

    return await assert_eventually(ended, timeout=15)


async def test_a_now_job_runs_once_and_succeeds(services: Services) -> None:
    hello = spec({"kind": "now"}, ["sh", "-c", "echo hello"])
    run = await run_once(services, hello, "hello", RunState.SUCCEEDED)
    assert len(await services.runs_of(run.job_id)) == 1
    chunk = await services.logs.read(run.id)
    assert chunk.data == b"hello\n"
    assert run.attempts[0].worker == "w1" and run.attempts[0].exit_code == 0


async def test_interval_job_gets_one_run_per_slot(services: Services) -> None:
    services.start_scheduler("s1")
    services.start_scheduler("s2")
    services.start_worker("w1")
    job = await services.jobs.create(spec({"kind": "interval", "every": "1s"}, ["true"]), "tick")

    async def several() -> None:
        runs = await services.runs_of(job.id)
        done = [r for r in runs if r.state is RunState.SUCCEEDED]
        assert len(done) >= 3

    await assert_eventually(several, timeout=20)
    runs = await services.runs_of(job.id)
    slots = [r.slot_ms for r in runs]
    assert len(slots) == len(set(slots))
    assert all(b - a == 1000 for a, b in pairwise(slots))


async def test_failed_run_is_retried_then_fails(services: Services) -> None:
    services.start_scheduler("s1")
    services.start_worker("w1")
    retry = {"max_attempts": 2, "initial_delay": "100ms", "jitter": 0}
    job = await services.jobs.create(spec({"kind": "now"}, ["false"], retry=retry), "flaky")

    async def failed() -> None:
        runs = await services.runs_of(job.id)
        assert runs and runs[0].state is RunState.FAILED, runs

    await assert_eventually(failed, timeout=15)
    run = (await services.runs_of(job.id))[0]
    assert [a.state for a in run.attempts] == [RunState.FAILED, RunState.FAILED]
    # A retry may be *placed* up to the lookahead early, with a not-before
    # instant; it must not *start* before its backoff has passed.
    assert run.attempts[1].started_ms - run.attempts[0].ended_ms >= 100  # type: ignore[operator]


async def test_a_run_placed_ahead_is_claimed_and_marked_before_its_instant_and_started_at_it(
    services: Services,
) -> None:
    """Placed within the lookahead, the run waits on its worker unclaimed
    until shortly before its instant (``etcdsched.worker.admission``); then
    it is claimed, prepared and marked ``running`` before its gate may open
    (so ``assigned`` proves it never ran), and at its not-before the worker
    starts it from its own timer; the run then says when it started and
    under which pid."""
    services.config = services.config.model_copy(update={"lookahead_ms": 3000})
    services.start_scheduler("s1")
    services.start_worker("w1")
    at_ms = int((time.time() + 2.5) * 1000)
    at = datetime.fromtimestamp(at_ms / 1000, tz=UTC).isoformat()
    job = await services.jobs.create(spec({"kind": "at", "at": at}, ["true"]), "ahead")

    async def placed_unclaimed() -> None:
        runs = await services.runs_of(job.id)
        assert runs and runs[0].state is RunState.ASSIGNED, runs
        claims = await services.store.range(services.keys.claims_prefix())
        assert claims.kvs == [] and time.time() * 1000 < at_ms - 600

    await assert_eventually(placed_unclaimed, timeout=1.5)

    async def marked_before_start() -> None:
        runs = await services.runs_of(job.id)
        assert runs and runs[0].state is RunState.RUNNING, runs
        assert time.time() * 1000 < at_ms
        claims = await services.store.range(services.keys.claims_prefix())
        assert len(claims.kvs) == 1

    await assert_eventually(marked_before_start, timeout=2.5)

    async def succeeded() -> None:
        runs = await services.runs_of(job.id)
        assert runs and runs[0].state is RunState.SUCCEEDED, runs

    await assert_eventually(succeeded, timeout=15)
    run = (await services.runs_of(job.id))[0]
    attempt = run.attempts[0]
    assert attempt.started_ms is not None and attempt.started_ms >= run.not_before_ms
    assert attempt.pid is not None
    assert (await services.store.range(services.keys.claims_prefix())).kvs == []


@dataclass
class GatedJob:
    """A one-off job whose process waits at its gate, its instant still ahead."""

    worker: WorkerService
    job_id: str
    marker: Path
    at_ms: int

    async def assert_never_ran(self) -> None:
        await asyncio.sleep(max(0.0, self.at_ms / 1000 - time.time()) + 0.5)  # past the instant
        assert not self.marker.exists()


async def job_at_its_gate(services: Services, tmp_path: Path) -> GatedJob:
    """Half a second before its instant a job is forked behind its gate
    (ADR 0008): wait for that, with the instant still ahead."""
    services.config = services.config.model_copy(update={"lookahead_ms": 3000})
    services.start_scheduler("s1")
    worker = services.start_worker("w1")
    marker = tmp_path / "ran"
    at_ms = int(time.time() * 1000) + 2500
    at = datetime.fromtimestamp(at_ms / 1000, tz=UTC).isoformat()
    job = await services.jobs.create(spec({"kind": "at", "at": at}, ["touch", str(marker)]), "g")

    def waiting_at_its_gate() -> None:
        assert worker.gated == 1

    await assert_eventually(waiting_at_its_gate, timeout=5, interval=0.01)
    assert int(time.time() * 1000) < at_ms, "too slow: the instant passed already"
    return GatedJob(worker, job.id, marker, at_ms)


async def test_a_job_cancelled_while_it_waits_at_its_gate_never_runs(
    services: Services, tmp_path: Path
) -> None:
    """Cancelled at its gate, the job is aborted: the command never runs,
    the run ends ``cancelled`` before it started, nothing is left guarded
    or claimed."""
    gated = await job_at_its_gate(services, tmp_path)
    rid = (await services.runs_of(gated.job_id))[0].id
    await cancel_run(services.store, services.keys, rid, int(time.time() * 1000), "test")

    async def cancelled() -> None:
        runs = await services.runs_of(gated.job_id)
        assert runs and runs[0].state is RunState.CANCELLED, runs

    await assert_eventually(cancelled, timeout=10)
    run = (await services.runs_of(gated.job_id))[0]
    assert run.attempts[-1].started_ms is None
    assert gated.worker.gated == 0
    assert (await services.store.range(services.keys.claims_prefix())).kvs == []
    await gated.assert_never_ran()


async def test_a_draining_worker_hands_back_a_job_waiting_at_its_gate(
    services: Services, tmp_path: Path
) -> None:
    """SIGTERM drain hands back what has not started; a job forked behind
    its gate has not: it goes back to the queue without using an attempt."""
    gated = await job_at_its_gate(services, tmp_path)
    await gated.worker.drain()

    run = (await services.runs_of(gated.job_id))[0]
    assert run.state is RunState.PENDING, run
    assert run.attempts == [] and run.worker is None
    assert gated.worker.gated == 0
    await gated.assert_never_ran()


async def test_an_attempt_whose_log_cannot_be_opened_fails_and_says_why(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(run_id: str, attempt: int, lazy: bool = False) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(services.logs, "open_writer", disk_full)
    run = await run_once(services, spec({"kind": "now"}, ["true"]), "nolog", RunState.FAILED)
    assert run.attempts[0].reason.startswith("could not open its log")


async def test_a_silent_job_leaves_no_log_file_and_reads_as_an_empty_complete_log(
    services: Services,
) -> None:
    """ADR 0019: a log is made at the job's first output."""
    run = await run_once(services, spec({"kind": "now"}, ["true"]), "silent", RunState.SUCCEEDED)
    assert await services.logs.attempts(run.id) == []
    assert not list(services.logs.root.rglob("*")), "no directory, no file"


async def test_a_job_whose_log_cannot_be_written_still_runs_to_its_end(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log is made at the first output; a disk that is full then costs
    the job its output (discarded, with a warning), not its run."""

    def disk_full(self: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(DirLogWriter, "_open", disk_full)
    chatty = spec({"kind": "now"}, ["sh", "-c", "echo one; echo two >&2; exit 3"])
    run = await run_once(services, chatty, "chatty", RunState.FAILED)
    assert run.attempts[0].exit_code == 3
    assert await services.logs.attempts(run.id) == []
