"""``POST /v1/jobs:batch`` against the real store: one result per item, each
item all or nothing, the same rules as ``POST /v1/jobs`` item by item."""

from __future__ import annotations

from typing import Any

from etcdsched.model.errors import Conflict, OutcomeUnknown
from etcdsched.model.records import DueEntry, JobRecord
from etcdsched.model.spec import JobSpec
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.job_batch import CreateRequest, create_many
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import prefix_end
from tests.api.conftest import PARTITIONS, Api, serve, spec

BATCH = "/v1/jobs:batch"
FAR_FUTURE = "2100-01-01T00:00:00Z"


async def batch(api: Api, token: str, items: list[Any]) -> list[dict[str, Any]]:
    status, body, _ = await api.call("POST", BATCH, token, json={"items": items})
    assert status == 200, body
    results: list[dict[str, Any]] = body["results"]
    assert [r["index"] for r in results] == list(range(len(items)))
    return results


def outcome(result: dict[str, Any]) -> tuple[int, str | None]:
    """(status, the error's field) of one item's result."""
    error = result["error"]
    return result["status"], error["field"] if error else None


async def stored_keys(api: Api, area: str) -> list[str]:
    return await stored_keys_of(api.services.store, api.services.keys, area)


async def stored_keys_of(store: EtcdStore, keys: Keys, area: str) -> list[str]:
    start = f"{keys.prefix}{area}/"
    return [kv.key for kv in (await store.range(start, prefix_end(start), keys_only=True)).kvs]


async def assert_every_job_whole(api: Api) -> set[str]:
    """Every job has its due pointer and due entry, and nothing else of a job
    is stored without it: no item was half written. Returns the job ids."""
    keys, store = api.services.keys, api.services.store
    jobs = {keys.parse_job(key) for key in await stored_keys(api, "jobs")}
    pointers = {key.rsplit("/", 1)[1] for key in await stored_keys(api, "nextdue")}
    due = {keys.parse_due(key).job_id for key in await stored_keys(api, "due")}
    assert pointers == jobs and due == jobs
    for key in await stored_keys(api, "idem"):
        kv = await store.get(key)
        assert kv is not None and kv.value.decode() in jobs
    for job_id in jobs:
        pointer = await store.get(keys.due_pointer(job_id))
        assert pointer is not None
        entry = pointer.decode(DueEntry).value
        partition = api.services.jobs.partition(job_id)
        assert await store.get(keys.due(partition, entry.slot_ms, job_id)) is not None
    return jobs


async def test_mixed_batch_gives_each_item_its_own_result(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="existing")
        first = await client.create_job(spec(), job_id="replayed", idempotency_key="k-old")
    items = [
        {"id": "good", "spec": spec()},
        {"id": "bad", "spec": spec(trigger={"kind": "interval", "every": "0s"})},
        {"id": "good", "spec": spec()},
        {"id": "existing", "spec": spec()},
        {"id": "replayed", "spec": spec(), "idempotency_key": "k-old"},
        {"spec": spec(description="other"), "idempotency_key": "k-old"},
        {"spec": spec(), "idempotency_key": "k-new"},
        {"id": "nope", "spec": spec(), "extra": 1},
        "not an object",
    ]
    results = await batch(api, api.admin, items)
    assert [outcome(r) for r in results] == [
        (201, None),
        (422, "items[1].spec.trigger.interval.every"),
        (409, "items[2].id"),
        (409, "items[3].id"),
        (200, None),
        (409, "items[5].idempotency_key"),
        (201, None),
        (422, "items[7].extra"),
        (422, "items[8]"),
    ]
    assert results[0]["job"]["id"] == "default:good" and results[1]["job"] is None
    assert results[4]["job"]["id"] == first.id == "default:replayed"
    assert results[4]["job"]["created_ms"] == first.created_ms
    assert results[1]["error"]["code"] == "invalid_input"
    assert results[3]["error"]["code"] == "conflict"
    made = results[6]["job"]["id"]
    assert await assert_every_job_whole(api) == {
        "default:existing",
        "default:replayed",
        "default:good",
        made,
    }

    again = await batch(api, api.admin, items[:7])
    assert [r["status"] for r in again] == [409, 422, 409, 409, 200, 409, 200]
    assert again[6]["job"]["id"] == made  # the same job: replayed, not made twice
    assert len(await assert_every_job_whole(api)) == 4


async def test_a_conflict_in_a_pack_costs_only_its_own_item(api: Api) -> None:
    """A combined transaction fails as a whole when one compare does not hold;
    its items are then sent alone, so only the existing id is refused."""
    async with api.client(api.admin) as client:
        await client.create_job(spec(), job_id="fb-17")
    store = api.services.store
    before = store.stats.txns
    results = await batch(api, api.admin, [{"id": f"fb-{i}", "spec": spec()} for i in range(50)])
    statuses = [r["status"] for r in results]
    assert statuses == [409 if i == 17 else 201 for i in range(50)]
    assert results[17]["error"]["field"] == "items[17].id"
    assert store.stats.txns - before >= 40  # the failed pack's items went alone
    assert len(await assert_every_job_whole(api)) == 50

    before = store.stats.txns
    fresh = await batch(api, api.admin, [{"id": f"ok-{i}", "spec": spec()} for i in range(50)])
    assert {r["status"] for r in fresh} == {201}
    assert store.stats.txns - before <= 3  # packed: 50 creates in 2 transactions (+ auth)


async def test_items_with_depends_on_go_after_the_others(api: Api) -> None:
    """Their upstream jobs are read from etcd: they may name jobs of the
    same batch, and a replay compares the full ids the create stored."""
    items = [
        {"id": "down", "spec": spec(depends_on=["up", "mid"]), "idempotency_key": "k-down"},
        {"id": "mid", "spec": spec(depends_on=["up"])},
        {"id": "up", "spec": spec()},
        {"id": "loop", "spec": spec(depends_on=["loop"])},
    ]
    results = await batch(api, api.acme, items)
    assert [outcome(r) for r in results] == [
        (422, "items[0].spec.depends_on[1]"),  # mid comes later in the batch
        (201, None),
        (201, None),
        (422, "items[3].spec.depends_on"),
    ]
    assert results[1]["job"]["spec"]["depends_on"] == ["acme:up"]
    first = await batch(api, api.acme, items[:1])
    again = await batch(api, api.acme, items[:1])
    assert [r["status"] for r in first + again] == [201, 200]
    assert again[0]["job"]["spec"]["depends_on"] == ["acme:up", "acme:mid"]
    assert len(await assert_every_job_whole(api)) == 3


async def test_a_tenant_token_creates_only_in_its_tenant(api: Api) -> None:
    items = [
        {"id": "mine", "spec": spec()},
        {"id": "theirs", "spec": spec(tenant="globex")},
        {"id": "named", "spec": spec(tenant="acme")},
        {"id": "globex:sneaky", "spec": spec()},
    ]
    results = await batch(api, api.acme, items)
    assert [outcome(r) for r in results] == [
        (201, None),
        (403, "items[1].spec.tenant"),
        (201, None),
        (422, "items[3].id"),
    ]
    assert results[0]["job"]["spec"]["tenant"] == "acme"
    assert await assert_every_job_whole(api) == {"acme:mine", "acme:named"}


async def test_max_jobs_holds_for_the_batch_as_a_whole(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.set_tenant("acme", {"max_jobs": 3})
    async with api.client(api.acme) as client:
        await client.create_job(spec(), job_id="one", idempotency_key="k-1")
    too_many = [{"spec": spec()} for _ in range(3)]
    replay = {"id": "one", "spec": spec(), "idempotency_key": "k-1"}
    refused = await batch(api, api.acme, [*too_many, replay])
    assert [r["status"] for r in refused] == [429, 429, 429, 200]  # a replay is no new job
    assert refused[0]["error"]["code"] == "quota_exceeded"
    acme, globex = spec(tenant="acme"), spec(tenant="globex")
    mixed = [{"spec": acme}, {"spec": acme}, {"id": "g", "spec": globex}]
    results = await batch(api, api.admin, mixed)
    assert [r["status"] for r in results] == [201, 201, 201]
    full = await batch(api, api.admin, [{"spec": acme}, {"id": "h", "spec": globex}])
    assert [r["status"] for r in full] == [429, 201]
    jobs = await assert_every_job_whole(api)
    assert len([j for j in jobs if j.startswith("acme:")]) == 3


async def test_a_batch_takes_one_submission_per_new_job(api: Api) -> None:
    """Larger than the tenant's bucket, it is admitted from a full one and
    leaves it in debt, so the rate holds over time."""
    async with api.client(api.admin) as client:
        await client.set_tenant("acme", {"submissions_per_second": 5})
    results = await batch(api, api.acme, [{"spec": spec()} for _ in range(10)])
    assert {r["status"] for r in results} == {201}
    refused = await batch(api, api.acme, [{"spec": spec()}])
    assert outcome(refused[0]) == (429, None)
    assert refused[0]["error"]["code"] == "quota_exceeded"


async def test_a_request_that_is_no_batch_is_refused_whole(api: Api) -> None:
    for body, field in (
        ({"items": [{}] * 1001}, "items"),
        ({"items": []}, "items"),
        ({}, "items"),
        ({"items": {"spec": spec()}}, "items"),
    ):
        status, answer, _ = await api.call("POST", BATCH, api.admin, json=body)
        assert (status, answer["error"]["field"]) == (422, field), answer
    json_type = {"Content-Type": "application/json"}
    status, answer, _ = await api.call("POST", BATCH, api.admin, data=b"{items", headers=json_type)
    assert (status, answer["error"]["code"]) == (400, "malformed_request")
    status, _, _ = await api.call("POST", BATCH, None, json={"items": [{"spec": spec()}]})
    assert status == 401
    assert await stored_keys(api, "jobs") == []


async def test_a_thousand_jobs_in_one_batch(api: Api) -> None:
    url, runner = await serve(api.services, max_body_bytes=1 << 20)
    try:
        once = spec(trigger={"kind": "at", "at": FAR_FUTURE})
        items = [{"id": f"many-{i:04d}", "spec": once} for i in range(1000)]
        async with api.client(api.admin) as client:
            client.url = url
            results = await client.create_jobs(items)
    finally:
        await runner.cleanup()
    assert [r.status for r in results] == [201] * 1000
    assert all(isinstance(r.job, JobRecord) and r.job.id == r.id for r in results)
    jobs = await assert_every_job_whole(api)
    assert jobs == {f"default:many-{i:04d}" for i in range(1000)}


async def test_return_minimal_answers_ids_without_records(api: Api) -> None:
    items = [{"id": "slim", "spec": spec()}, {"id": "slim", "spec": spec()}]
    headers = {"Prefer": "respond-async, return=minimal"}
    status, body, answer_headers = await api.call(
        "POST", BATCH, api.admin, json={"items": items}, headers=headers
    )
    assert status == 200 and answer_headers["Preference-Applied"] == "return=minimal"
    assert [(r["status"], r["id"], r["job"]) for r in body["results"]] == [
        (201, "default:slim", None),
        (409, None, None),
    ]
    async with api.client(api.admin) as client:
        again = await client.create_jobs(items[:1], with_jobs=False)
    assert (again[0].status, again[0].job) == (409, None)


class LostAnswers:
    """The real store, but the answer to a transaction creating more than
    one job is lost: after etcd applied it, or before it was sent."""

    def __init__(self, inner: EtcdStore, applied: bool) -> None:
        self.inner = inner
        self.applied = applied

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def txn(self, compares: Any, success: Any, failure: Any = ()) -> Any:
        if len(success) > 3:  # a pack: one create alone writes 3 keys (4 with a key)
            if self.applied:
                await self.inner.txn(compares, success, failure)
            raise OutcomeUnknown("the answer was lost (injected)")
        return await self.inner.txn(compares, success, failure)


async def test_an_unknown_outcome_is_resolved_item_by_item(store: EtcdStore, keys: Keys) -> None:
    """Never reported as made or refused before a re-read says so."""
    clock = SystemClock()
    alone = JobService(store, keys, clock, PARTITIONS)
    await alone.create(JobSpec.model_validate(spec()), "taken")
    requests = [CreateRequest(JobSpec.model_validate(spec()), f"u-{i}") for i in range(5)]
    lost_before = JobService(LostAnswers(store, applied=False), keys, clock, PARTITIONS)
    outcomes = await create_many(lost_before, requests)
    assert [type(o.error) for o in outcomes] == [OutcomeUnknown] * 5  # nothing stored: unknown
    assert await stored_keys_of(store, keys, "jobs") == [keys.job("default:taken")]

    lost_after = JobService(LostAnswers(store, applied=True), keys, clock, PARTITIONS)
    outcomes = await create_many(lost_after, requests)
    assert [(o.created, o.job.id if o.job else None) for o in outcomes] == [
        (True, f"default:u-{i}") for i in range(5)
    ]
    taken = [CreateRequest(JobSpec.model_validate(spec()), name) for name in ("taken", "v")]
    outcomes = await create_many(lost_after, taken)  # etcd refused the pack: "taken" exists
    assert [type(o.error) for o in outcomes] == [Conflict, OutcomeUnknown]
