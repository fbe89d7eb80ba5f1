"""Idempotency keys expire and go with their job (issue 29), on a real etcd.

A key's record lives under a lease shared by the creates of an hour (TTL
25 h, reused for 1 h: every record lives 24-25 h); deleting the job deletes
its record in the delete's transaction, so a replay then makes a new job
instead of answering 404 for ever."""

from __future__ import annotations

from etcdsched.api.routing import json_model
from etcdsched.api.schemas import JobPage
from etcdsched.model.errors import Conflict
from etcdsched.model.records import JobRecord
from etcdsched.model.spec import JobSpec
from etcdsched.runtime.clock import FakeClock
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.job_batch import CreateRequest, create_many
from etcdsched.store.job_create import IDEMPOTENCY_KEEP_S, IDEMPOTENCY_LEASE_REUSE_S
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys

SPEC = JobSpec.model_validate(
    {"trigger": {"kind": "interval", "every": "1h"}, "execution": {"argv": ["true"]}}
)


def record_of(jobs: JobService, key: str) -> str:
    record = jobs.idempotency_key("default", key)
    assert record is not None
    return record


async def test_a_record_lives_under_a_lease_shared_for_an_hour(
    store: EtcdStore, keys: Keys
) -> None:
    clock = FakeClock()
    jobs = JobService(store, keys, clock, 4)
    await jobs.create(SPEC, idempotency_key="a")
    await jobs.create(SPEC, idempotency_key="b")
    a, b = await store.get(record_of(jobs, "a")), await store.get(record_of(jobs, "b"))
    assert a is not None and b is not None
    assert a.lease != 0 and a.lease == b.lease, "one lease for the hour, not one per create"
    remaining = await store.keepalive_once(a.lease, 5)  # (renewing restarts its full TTL)
    assert remaining == IDEMPOTENCY_KEEP_S + IDEMPOTENCY_LEASE_REUSE_S

    await clock.advance(IDEMPOTENCY_LEASE_REUSE_S)
    await jobs.create(SPEC, idempotency_key="c")
    c = await store.get(record_of(jobs, "c"))
    assert c is not None and c.lease not in (0, a.lease), "an hour later, a new lease"


async def test_a_lease_gone_before_its_time_is_granted_again(store: EtcdStore, keys: Keys) -> None:
    jobs = JobService(store, keys, FakeClock(), 4)
    await jobs.create(SPEC, idempotency_key="first")
    first = await store.get(record_of(jobs, "first"))
    assert first is not None
    await store.revoke(first.lease)  # (what its expiry does too)
    assert await store.get(record_of(jobs, "first")) is None

    job = await jobs.create(SPEC, idempotency_key="second")
    second = await store.get(record_of(jobs, "second"))
    assert second is not None and second.lease not in (0, first.lease)
    assert second.value.decode() == job.id
    again = await jobs.create(SPEC, idempotency_key="second")
    assert again.id == job.id, "the replay finds the job"


async def test_deleting_the_job_drops_its_key_and_a_replay_makes_a_new_job(
    store: EtcdStore, keys: Keys
) -> None:
    jobs = JobService(store, keys, FakeClock(), 4)
    first = await jobs.create(SPEC, idempotency_key="k")
    stored = await store.get(keys.job(first.id))
    assert stored is not None
    assert stored.decode(JobRecord).value.idempotency_record == record_of(jobs, "k")
    assert "idempotency_record" not in json_model(first).text, "storage only, not API"
    page = json_model(JobPage(items=[stored.decode(JobRecord).value]))
    assert "idempotency_record" not in page.text

    await jobs.delete(first.id)
    assert await store.get(record_of(jobs, "k")) is None, "gone in the delete's transaction"
    second = await jobs.create(SPEC, idempotency_key="k")
    assert second.id != first.id and second.created_ms >= first.created_ms
    assert (await jobs.get(second.id)).id == second.id


async def test_deleting_a_job_leaves_a_reused_record_of_another_job_alone(
    store: EtcdStore, keys: Keys
) -> None:
    """Once a key expired, a new create may reuse it for another job: the old
    job's delete must not drop the new job's record."""
    jobs = JobService(store, keys, FakeClock(), 4)
    old = await jobs.create(SPEC, "old", idempotency_key="k")
    record = record_of(jobs, "k")
    kv = await store.get(record)
    assert kv is not None
    await store.revoke(kv.lease)  # the key expired
    new = await jobs.create(SPEC, "new", idempotency_key="k")
    await jobs.delete(old.id)
    kv = await store.get(record)
    assert kv is not None and kv.value.decode() == new.id


async def test_a_batch_shares_the_lease_and_replays_after_a_delete_make_new_jobs(
    store: EtcdStore, keys: Keys
) -> None:
    jobs = JobService(store, keys, FakeClock(), 4)
    requests = [CreateRequest(SPEC, idempotency_key=f"batch-{i}") for i in range(3)]
    made = await create_many(jobs, requests)
    assert all(o.created and o.job is not None for o in made), made
    leases = set()
    for i in range(3):
        kv = await store.get(record_of(jobs, f"batch-{i}"))
        assert kv is not None
        leases.add(kv.lease)
    assert len(leases) == 1 and 0 not in leases

    assert made[0].job is not None
    await jobs.delete(made[0].job.id)
    await store.revoke(leases.pop())  # and the lease the batch used is gone
    again = await create_many(jobs, requests)
    assert again[0].created and again[0].job is not None
    assert again[0].job.id != made[0].job.id, "a new job for the dropped key"
    for i in (1, 2):  # their records expired with the lease: new jobs too
        assert again[i].created, again[i]


async def test_a_named_job_replayed_after_its_key_expired_is_a_conflict(
    store: EtcdStore, keys: Keys
) -> None:
    jobs = JobService(store, keys, FakeClock(), 4)
    await jobs.create(SPEC, "named", idempotency_key="n")
    kv = await store.get(record_of(jobs, "n"))
    assert kv is not None
    await store.revoke(kv.lease)
    try:
        await jobs.create(SPEC, "named", idempotency_key="n")
    except Conflict as exc:
        assert exc.field == "id"
    else:
        raise AssertionError("a replay after expiry must not pass for the first create")
