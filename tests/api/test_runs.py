"""Run routes: listing, explain, cancel, logs. Runs come from triggers and
stay pending (no scheduler here); executing states are written the way the
scheduler and worker write them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from etcdsched.model.errors import InvalidTransition
from etcdsched.model.records import Assignment, RunRecord, SkipRecord
from etcdsched.model.statemachine import assign_attempt, finish_attempt, start_attempt
from etcdsched.model.states import RunState
from etcdsched.store.kv import Cmp, Ops
from tests.api.conftest import Api, serve, spec
from tests.support.eventually import assert_eventually


async def _store_run(api: Api, run: RunRecord, *extra: Ops | object) -> RunRecord:
    """CAS-write ``run`` as scheduler or worker would (plus ``extra`` ops)."""
    services = api.services
    current = await services.jobs.runs.load(services.store, run.id)
    ops = [Ops.put(current.key, run), *extra]
    result = await services.store.txn([Cmp.mod(current.key, current.mod_revision)], ops)  # type: ignore[arg-type]
    assert result.succeeded
    return run


async def _assigned(api: Api, run: RunRecord, worker: str = "w1") -> RunRecord:
    services = api.services
    assigned = assign_attempt(run, worker, services.clock.now_ms())
    assignment = Assignment(
        run_id=run.id,
        attempt=assigned.attempt,
        not_before_ms=run.not_before_ms,
        resources=run.spec.resources,
    )
    return await _store_run(
        api, assigned, Ops.put(services.keys.assign(worker, run.id), assignment)
    )


async def test_list_runs_filters_and_pages(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(trigger={"kind": "cron", "expr": "* * * * *"}), job_id="r")
        end = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
        created = (await client.backfill_job("r", end - timedelta(minutes=4), end)).created
        await client.cancel_run(created[0])
        newest = await client.list_runs("r")
        assert [run.id for run in newest.items] == list(reversed(created))
        oldest = await client.list_runs("r", order="asc", limit=2)
        assert [run.id for run in oldest.items] == created[:2]
        rest = await client.list_runs("r", order="asc", limit=2, cursor=oldest.next_cursor)
        assert [run.id for run in rest.items] == created[2:4]
        window = await client.list_runs(
            "r", since=end - timedelta(minutes=3), until=end - timedelta(minutes=2)
        )
        assert [run.id for run in window.items] == [created[2], created[1]]
        cancelled = await client.list_runs("r", states=["cancelled"])
        assert [run.id for run in cancelled.items] == [created[0]]
    status, body, _ = await api.call("GET", "/v1/jobs/r/runs?state=bogus", api.admin)
    assert (status, body["error"]["field"]) == (422, "state")
    status, body, _ = await api.call("GET", "/v1/jobs/r/runs?cursor=xyz", api.admin)
    assert (status, body["error"]["field"]) == (422, "cursor")


async def test_runs_of_a_deleted_job_stay_readable(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="gone")
        run = await client.trigger_job("gone")
        await client.delete_job("gone")
        page = await client.list_runs("gone")
        assert [r.id for r in page.items] == [run.id]


async def test_skips_listing_and_explain(api: Api) -> None:
    services = api.services
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="sk")
        run = await client.trigger_job("sk")
        for first in (run.slot_ms - 50_000, run.slot_ms - 20_000, run.slot_ms + 10_000):
            record = SkipRecord(
                job_id="sk",
                first_slot_ms=first,
                last_slot_ms=first + 1000,
                count=2,
                reason="misfire",
                created_ms=first,
            )
            await services.store.txn([], [Ops.put(services.keys.skip("default:sk", first), record)])
        page = await client.list_skips("sk", limit=2)
        assert [s.first_slot_ms for s in page.items] == [run.slot_ms - 50_000, run.slot_ms - 20_000]
        rest = await client.list_skips("sk", cursor=page.next_cursor)
        assert [s.first_slot_ms for s in rest.items] == [run.slot_ms + 10_000]
        assert rest.next_cursor is None
        view = await client.get_run(run.id)
        assert view.explain is not None
        assert [s.first_slot_ms for s in view.explain.skips] == [
            run.slot_ms - 50_000,
            run.slot_ms - 20_000,
            run.slot_ms + 10_000,
        ]
        assert view.explain.pending_reason is not None
        assert "no live worker" in view.explain.pending_reason


async def test_cancel_pending_run(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="c")
        run = await client.trigger_job("c")
        cancelled = await client.cancel_run(run.id, reason="not today")
        assert cancelled.state is RunState.CANCELLED and cancelled.reason == "not today"
        again = await client.cancel_run(run.id)
        assert again.state is RunState.CANCELLED
        assert await api.services.jobs.active_run_ids("c") == []
        queue_key = (await client.get_run(run.id)).queue_key
        assert queue_key and await api.services.store.get(queue_key) is None


async def test_cancel_executing_run_asks_the_worker(api: Api) -> None:
    services = api.services
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="x")
        run = await _assigned(api, await client.trigger_job("x"))
        result = await client.cancel_run(run.id)
        assert result.state is RunState.ASSIGNED and result.cancel_requested
        kv = await services.store.get(services.keys.assign("w1", run.id))
        assert kv is not None and kv.decode(Assignment).value.cancel
        assert (await client.cancel_run(run.id)).cancel_requested  # idempotent
        ended = finish_attempt(result, "cancelled", services.clock.now_ms())
        await _store_run(api, ended)
        assert (await client.cancel_run(run.id)).state is RunState.CANCELLED


async def test_cancel_finished_run_is_409(api: Api) -> None:
    services = api.services
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="fin")
        run = await _assigned(api, await client.trigger_job("fin"))
        run = await _store_run(api, start_attempt(run, services.clock.now_ms(), pid=1))
        await _store_run(api, finish_attempt(run, "succeeded", services.clock.now_ms()))
        with pytest.raises(InvalidTransition):
            await client.cancel_run(run.id)


async def test_log_read_and_follow(api: Api) -> None:
    services = api.services
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="lg")
        pending = await client.trigger_job("lg")
        empty = await client.read_log(pending.id)
        assert (empty.data, empty.attempt, empty.complete) == (b"", 0, False)
        run = await _assigned(api, pending)
        run = await _store_run(api, start_attempt(run, services.clock.now_ms(), pid=1))
        writer = api.logs.open_writer(run.id, 1)
        writer.write(b"hello\n")
        chunk = await client.read_log(run.id)
        assert (chunk.data, chunk.next_offset, chunk.complete) == (b"hello\n", 6, False)
        tail = await client.read_log(run.id, offset=2)
        assert tail.data == b"llo\n"

        received: list[bytes] = []

        async def follow() -> None:
            async for data in client.follow_log(run.id):
                received.append(data)

        follower = asyncio.create_task(follow())
        await assert_eventually(lambda: b"".join(received) == b"hello\n")
        writer.write(b"world\n")
        await assert_eventually(lambda: b"".join(received) == b"hello\nworld\n")
        writer.write(b"bye\n")
        writer.close()
        await _store_run(
            api, finish_attempt(run, "succeeded", services.clock.now_ms(), exit_code=0)
        )
        await asyncio.wait_for(follower, 10)
        assert b"".join(received) == b"hello\nworld\nbye\n"
        done = await client.read_log(run.id, attempt=1)
        assert done.complete


async def test_log_follows_are_capped_per_tenant(api: Api) -> None:
    """Each follow holds a connection while its run goes on: one tenant can
    open only so many in one API process (then 429), others are not held up."""
    url, runner = await serve(api.services, max_follows_per_tenant=1)
    try:
        async with api.client(api.acme) as client:
            await client.create_job(spec(), job_id="followed")
            run = await client.trigger_job("followed")  # no worker: it stays pending
        path = f"/v1/runs/{run.id}/log?follow=true"
        headers = {"Authorization": f"Bearer {api.acme}"}
        async with api.http.get(url + path, headers=headers) as first:
            assert first.status == 200
            async with api.http.get(url + path, headers=headers) as second:
                assert second.status == 429 and "Retry-After" in second.headers

        async def freed() -> None:  # once the server saw the first one go
            async with api.http.get(url + path, headers=headers) as again:
                assert again.status == 200

        await assert_eventually(freed, timeout=5)
    finally:
        await runner.cleanup()
