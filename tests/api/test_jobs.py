"""Job routes against the real store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from etcdsched.model.errors import Conflict, InvalidInput, NotFound
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState
from tests.api.conftest import Api, spec


async def test_create_with_and_without_id(api: Api) -> None:
    status, body, headers = await api.call(
        "POST", "/v1/jobs", api.admin, json={"id": "nightly", "spec": spec()}
    )
    assert status == 201
    assert body["id"] == "default:nightly" and body["version"] == 1  # <tenant>:<name>
    assert headers["Location"] == "/v1/jobs/default:nightly"
    assert headers["ETag"] == '"1"'
    async with api.client(api.admin) as client:
        made = await client.create_job(spec())
        assert made.id.startswith("default:job-")
        view = await client.get_job("nightly")
        assert view.next_slot_ms is not None and view.spec.tenant == "default"


async def test_create_twice_with_same_id_is_409(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="dup")
        with pytest.raises(Conflict) as info:
            await client.create_job(spec(), job_id="dup")
        assert info.value.field == "id"


async def test_idempotent_create(api: Api) -> None:
    async with api.client(api.acme) as client:
        first = await client.create_job(spec(), idempotency_key="k-1")
        again = await client.create_job(spec(), idempotency_key="k-1")
        assert again.id == first.id and again.created_ms == first.created_ms
        page = await client.list_jobs()
        assert [job.id for job in page.items] == [first.id]
        with pytest.raises(Conflict) as info:
            await client.create_job(spec(description="other"), idempotency_key="k-1")
        assert info.value.field == "Idempotency-Key"


async def test_idempotent_create_of_a_named_job(api: Api) -> None:
    """The name asked for and the full id stored are the same job: a replay."""
    async with api.client(api.acme) as client:
        first = await client.create_job(spec(), job_id="named", idempotency_key="k-n")
        again = await client.create_job(spec(), job_id="named", idempotency_key="k-n")
        assert again.id == first.id == "acme:named" and again.created_ms == first.created_ms
        with pytest.raises(Conflict) as info:
            await client.create_job(spec(), job_id="renamed", idempotency_key="k-n")
        assert info.value.field == "Idempotency-Key"


async def test_list_filters_and_pagination(api: Api) -> None:
    async with api.client(api.admin) as client:
        for i in range(5):
            labels = {"team": "red" if i % 2 else "blue"}
            await client.create_job(spec(labels=labels, tenant="acme"), job_id=f"job-{i}")
        await client.create_job(spec(tenant="globex"), job_id="other")
        await client.pause_job("acme:job-0")
        seen, cursor = [], None
        while True:
            page = await client.list_jobs(tenant="acme", cursor=cursor, limit=2)
            assert len(page.items) <= 2
            seen += [job.id for job in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == [f"acme:job-{i}" for i in range(5)]
        red = await client.list_jobs(labels={"team": "red"})
        assert [job.id for job in red.items] == ["acme:job-1", "acme:job-3"]
        paused = await client.list_jobs(state="paused")
        assert [job.id for job in paused.items] == ["acme:job-0"]
        everything = await client.list_jobs(limit=1000)
        assert len(everything.items) == 6 and everything.next_cursor is None


NEW_SPEC = spec(trigger={"kind": "interval", "every": "5m"})


async def test_replace_spec(api: Api) -> None:
    async with api.client(api.acme) as client:
        job = await client.create_job(spec(), job_id="swap")
        replaced = await client.replace_job("swap", NEW_SPEC, if_version=job.version)
        assert replaced.version == 2 and replaced.spec.tenant == "acme"
        assert (await client.get_job("swap")).version == 2


async def test_replace_checks_version_and_input(api: Api) -> None:
    async with api.client(api.acme) as client:
        await client.create_job(spec(), job_id="swap")
        with pytest.raises(Conflict) as info:
            await client.replace_job("swap", NEW_SPEC, if_version=7)
        assert info.value.field == "version"
    status, body, _ = await api.call(
        "PUT", "/v1/jobs/swap?version=7", api.acme, json={"spec": NEW_SPEC}
    )
    assert status == 409
    status, body, _ = await api.call(
        "PUT", "/v1/jobs/swap", api.acme, json={"spec": NEW_SPEC}, headers={"If-Match": "nope"}
    )
    assert (status, body["error"]["field"]) == (422, "If-Match")
    status, body, _ = await api.call("PUT", "/v1/jobs/swap", api.acme, json={"spec": {"x": 1}})
    assert status == 422 and body["error"]["field"].startswith("spec.")
    async with api.client(api.acme) as client:
        assert (await client.get_job("swap")).version == 1


async def test_pause_resume(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="p")
        paused = await client.pause_job("p")
        assert paused.state == "paused"
        assert (await client.get_job("p")).next_slot_ms is None
        resumed = await client.resume_job("p", catch_up="run_once")
        assert resumed.state == "active"
    status, body, _ = await api.call(
        "POST", "/v1/jobs/p/resume", api.admin, json={"catch_up": "all"}
    )
    assert (status, body["error"]["field"]) == (422, "catch_up")


async def test_trigger_creates_a_pending_run(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(overlap="skip"), job_id="t")
        run = await client.trigger_job("t")
        assert run.state is RunState.PENDING and run.kind == "manual"
        with pytest.raises(Conflict) as info:
            await client.trigger_job("t")
        assert info.value.field == "force"
        forced = await client.trigger_job("t", force=True)
        assert forced.id != run.id


async def test_backfill(api: Api) -> None:
    async with api.client(api.admin) as client:
        every_minute = spec(trigger={"kind": "cron", "expr": "* * * * *"})
        await client.create_job(every_minute, job_id="bf")
        end = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
        result = await client.backfill_job("bf", end - timedelta(minutes=2), end)
        assert len(result.created) == 3
        again = await client.backfill_job("bf", end - timedelta(minutes=2), end)
        assert again.created == []
        with pytest.raises(InvalidInput) as info:
            await client.backfill_job("bf", end, end - timedelta(minutes=1))
        assert info.value.field == "end"
        with pytest.raises(InvalidInput) as info:
            await client.backfill_job("bf", end - timedelta(days=1), end, limit=10)
        assert info.value.field == "end"
    status, body, _ = await api.call(
        "POST", "/v1/jobs/bf/backfill", api.admin, json={"start": "2026-01-01T00:00:00", "end": "x"}
    )
    assert status == 422 and body["error"]["field"] in ("start", "end")


async def test_delete_cancels_active_runs_and_the_name_waits_for_them(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="keep-runs")
        kept = await client.trigger_job("keep-runs")
        result = await client.delete_job("keep-runs", cancel_active=False)
        assert result.active_runs == [kept.id] and result.cancelled == []
        assert (await client.get_run(kept.id)).state is RunState.PENDING
        with pytest.raises(NotFound):
            await client.get_job("keep-runs")
        with pytest.raises(Conflict):  # its runs would be the new job's
            await client.create_job(spec(), job_id="keep-runs")

        await client.create_job(spec(), job_id="drop-runs")
        dropped = await client.trigger_job("drop-runs")
        result = await client.delete_job("drop-runs")
        assert result.cancelled == [dropped.id]
        assert (await client.get_run(dropped.id)).state is RunState.CANCELLED
        assert (await client.create_job(spec(), job_id="drop-runs")).id == "default:drop-runs"


async def test_an_after_job_through_the_api(api: Api) -> None:
    """An ``after`` job names its upstreams bare and stores them in full; a
    replay with the same key is the same job; it has no next slot."""
    after = spec(trigger={"kind": "after", "jobs": ["extract"], "on": "completion"})
    async with api.client(api.acme) as client:
        await client.create_job(spec(), job_id="extract")
        first = await client.create_job(after, job_id="report", idempotency_key="k-a")
        again = await client.create_job(after, job_id="report", idempotency_key="k-a")
        assert again.created_ms == first.created_ms
        assert first.spec.trigger.jobs == ["acme:extract"]  # type: ignore[union-attr]
    status, body, _ = await api.call("GET", "/v1/jobs/report", api.acme)
    assert status == 200 and body["next_slot_ms"] is None, body


async def test_a_page_of_the_largest_specs_is_listed(api: Api) -> None:
    """Twelve specs near the size limit make a page over gRPC's default
    4 MiB answer (a 500 before the store raised its limit)."""
    big = JobSpec.model_validate(spec(execution={"argv": ["true", *(["x" * 120_000] * 3)]}))
    for index in range(12):
        await api.services.jobs.create(big, f"big{index}")
    status, body, _ = await api.call("GET", "/v1/jobs", api.admin)
    assert status == 200, str(body)[:300]
    assert len(body["items"]) == 12
