"""Finished runs beyond keep_last leave etcd, are archived beside the logs,
and their logs are deleted (from a directory and from an object store)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable

from etcdsched.logs.s3 import S3LogStore
from etcdsched.model.spec import JobSpec
from tests.support.e2e_jobs import every_second, iso, now_ms, spec, start_worker
from tests.support.eventually import assert_eventually
from tests.support.services import Services


async def test_history_is_trimmed_and_archived(services: Services) -> None:
    services.start_scheduler("s1")
    services.start_worker("w1")
    spec = JobSpec.model_validate(
        {
            "trigger": {"kind": "interval", "every": "1s"},
            "execution": {"argv": ["true"]},
            "retention": {"keep_last": 3},
        }
    )
    job = await services.jobs.create(spec, "short-memory")
    archive = services.logs.root / job.id / "archive.jsonl"

    async def trimmed() -> None:
        assert archive.exists()
        archived = [json.loads(line)["id"] for line in archive.read_text().splitlines()]
        assert len(archived) >= 2
        runs = await services.runs_of(job.id)
        assert len(runs) <= 4, [r.id for r in runs]
        assert not {r.id for r in runs} & set(archived)

    await assert_eventually(trimmed, timeout=30)


# -- logs go with their runs -------------------------------------------------------
SECOND = 1000
KEEP = 3


async def _fifty_finished_runs(services: Services, name: str) -> str:
    """A paused job with 50 backfilled runs that print, all run to their end."""
    start = now_ms() // SECOND * SECOND - 60 * SECOND
    job = await services.jobs.create(
        spec(every_second(start=iso(start)), ["echo", "hello"], retention={"keep_last": KEEP}),
        name,
    )
    await services.jobs.pause(job.id)
    created = await services.jobs.backfill(job.id, start, start + 49 * SECOND)
    assert len(created) == 50
    scheduler = services.start_scheduler("s1")
    scheduler.retention.log_delete_grace_ms = 2000  # uploads here end in milliseconds
    start_worker(services, "w1")
    return job.id


async def _trimmed_to(
    services: Services, job_id: str, logged: Callable[[], Awaitable[set[str]]]
) -> None:
    async def trimmed() -> None:
        runs = await services.runs_of(job_id)
        assert len(runs) == KEEP and all(run.state.terminal for run in runs), len(runs)
        assert await logged() == {run.id.partition("@")[2] for run in runs}

    await assert_eventually(trimmed, timeout=60)


async def test_trimmed_runs_leave_no_logs_in_a_directory(services: Services) -> None:
    job_id = await _fifty_finished_runs(services, "dir-logs")
    job_dir = services.logs.root / job_id

    async def logged() -> set[str]:
        return {path.name for path in job_dir.iterdir() if path.is_dir()}

    await _trimmed_to(services, job_id, logged)
    archived = (job_dir / "archive.jsonl").read_text().splitlines()
    assert len({json.loads(line)["id"] for line in archived}) == 50 - KEEP


async def test_trimmed_runs_leave_no_logs_in_an_object_store(
    services: Services, s3_logs: S3LogStore
) -> None:
    services = dataclasses.replace(services, logs=s3_logs)  # type: ignore[arg-type]
    try:
        job_id = await _fifty_finished_runs(services, "s3-logs")
        job_prefix = f"{s3_logs.prefix}{job_id}/"

        async def logged() -> set[str]:
            keys = [obj.key[len(job_prefix) :] for obj in await s3_logs.bucket.list_all(job_prefix)]
            return {key.partition("/")[0] for key in keys if not key.startswith("archive/")}

        await _trimmed_to(services, job_id, logged)
        for run in await services.runs_of(job_id):
            assert (await s3_logs.read(run.id)).data == b"hello\n"
    finally:
        for name in list(services.tasks):  # before the store closes
            await services.stop(name)


async def test_a_deleted_jobs_runs_logs_and_archive_go(services: Services) -> None:
    """A delete marks the job gone (``gone/<pp>/<job>``); a grace later its
    partition's retention removes every run, its logs, its archive and the
    mark, with no run of it ending to prompt it."""
    job_id = await _fifty_finished_runs(services, "deleted")
    job_dir = services.logs.root / job_id

    async def logged() -> set[str]:
        return {path.name for path in job_dir.iterdir() if path.is_dir()}

    await _trimmed_to(services, job_id, logged)
    assert (job_dir / "archive.jsonl").exists()
    services.schedulers["s1"].retention.deleted_job_grace_ms = 0  # an hour by default
    await services.jobs.delete(job_id)
    marker = services.keys.gone(services.jobs.partition(job_id), job_id)
    assert await services.store.get(marker) is not None

    async def all_gone() -> None:
        assert await services.runs_of(job_id) == []
        assert not job_dir.exists(), list(job_dir.iterdir())
        assert await services.store.get(marker) is None

    await assert_eventually(all_gone, timeout=30)
