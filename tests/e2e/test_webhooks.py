"""Outcome webhooks end to end (docs/webhooks.md): a real receiver on
127.0.0.1, real schedulers and workers on a real etcd, and, for the crash
case, scheduler processes killed with SIGKILL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from etcdsched.model.notify_events import PAUSE_CHECK, verify_signature
from etcdsched.model.notify_records import Delivery, Webhook
from etcdsched.model.records import JobRecord, OwnerRecord, RunRecord
from etcdsched.model.statemachine import assign_attempt, finish_attempt, start_attempt
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.delivery_pause import FailurePause
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys, partition_of
from etcdsched.store.kv import Cmp, Ops, Store, prefix_end
from etcdsched.store.outbox import Outbox, run_deliveries_stored
from etcdsched.store.runs import RunOrigin, new_run
from etcdsched.store.webhooks import WebhookStore
from tests.support.e2e_jobs import (
    every_second,
    spec,
    start_worker,
    terminal,
    wait_runs,
    wait_until_ms,
)
from tests.support.eventually import assert_eventually
from tests.support.procs import AgentProcess, agent_env
from tests.support.services import Services, full_id
from tests.support.webhook_receiver import WebhookReceiver

SECRET = "s3cret-for-tests"
NOW = {"kind": "now"}


async def make_hook(store: Store, keys: Keys, url: str, name: str = "ops") -> Webhook:
    """A webhook that may reach the receiver: plain HTTP on loopback, which
    only an admin may allow (tests/security/test_webhook_ssrf.py)."""
    now = int(time.time() * 1000)
    hook = Webhook(
        tenant="default",
        name=name,
        url=url,
        secret=SECRET,
        allow_http=True,
        allow_private=True,
        created_ms=now,
        updated_ms=now,
    )
    return await WebhookStore(store, keys).put(hook)


async def deliveries_of(store: Store, keys: Keys, run: RunRecord) -> list[Delivery]:
    return await run_deliveries_stored(store, keys, run.partition, run.id)


async def ended_delivery(store: Store, keys: Keys, run: RunRecord) -> Delivery:
    async def ended() -> Delivery:
        found = await deliveries_of(store, keys, run)
        assert len(found) == 1 and found[0].state != "pending", found
        return found[0]

    result: Delivery = await assert_eventually(ended, timeout=15)
    return result


def notify(*events: str) -> list[dict[str, object]]:
    return [{"webhook": "ops", "events": list(events)}]


async def test_a_failing_job_with_two_attempts_sends_one_signed_run_failed(
    services: Services, receiver: WebhookReceiver
) -> None:
    await make_hook(services.store, services.keys, receiver.url)
    services.start_scheduler("s1")
    start_worker(services, "w1")
    job = spec(
        NOW,
        ["false"],
        retry={"max_attempts": 2, "initial_delay": "100ms"},
        notify=notify("run.failed", "run.succeeded", "run.recovered"),
    )
    await services.jobs.create(job, "wh-fail")
    (run,) = await wait_runs(services, "wh-fail", terminal, timeout=20)
    assert run.state == "failed" and run.attempt == 2
    delivery = await ended_delivery(services.store, services.keys, run)
    assert delivery.state == "delivered" and delivery.attempts == 1
    assert [r.kind for r in receiver.received] == ["run.failed"]
    got = receiver.received[0]
    assert got.event_id == got.idempotency_key == delivery.event_id
    assert verify_signature(SECRET, got.body, got.signature, int(time.time()))
    assert not verify_signature("another secret", got.body, got.signature, int(time.time()))
    body = got.json
    assert body["type"] == "run.failed" and body["id"] == delivery.event_id
    assert body["run"]["id"] == run.id and body["run"]["attempt"] == 2
    assert body["run"]["exit_code"] == 1 and body["link"] == f"/v1/runs/{run.id}"
    assert "failed" in body["text"]


async def test_a_receiver_failing_three_times_gets_the_same_event_four_times(
    services: Services, receiver: WebhookReceiver
) -> None:
    receiver.statuses = [500, 500, 500]
    await make_hook(services.store, services.keys, receiver.url)
    services.config = services.config.model_copy(update={"webhook_retry_initial_ms": 100})
    services.start_scheduler("s1")
    start_worker(services, "w1")
    await services.jobs.create(spec(NOW, ["true"], notify=notify("run.succeeded")), "wh-retry")
    (run,) = await wait_runs(services, "wh-retry", terminal, timeout=20)
    delivery = await ended_delivery(services.store, services.keys, run)
    assert delivery.state == "delivered", delivery
    assert (delivery.attempts, delivery.last_status) == (4, 200)
    assert receiver.event_ids() == [delivery.event_id] * 4
    assert {r.kind for r in receiver.received} == {"run.succeeded"}


async def test_a_run_nobody_subscribed_to_writes_no_outbox_record(
    services: Services, receiver: WebhookReceiver
) -> None:
    await make_hook(services.store, services.keys, receiver.url)
    services.start_scheduler("s1")
    start_worker(services, "w1")
    await services.jobs.create(spec(NOW, ["true"], notify=notify("run.failed")), "wh-quiet")
    (run,) = await wait_runs(services, "wh-quiet", terminal, timeout=20)
    assert run.state == "succeeded"
    assert await deliveries_of(services.store, services.keys, run) == []
    assert receiver.received == []


# -- the sender is killed between the outcome and its first POST ------------------
P = 8


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for agent in started:
        agent.terminate()


@pytest.mark.slow
async def test_a_sender_killed_before_its_post_completes_is_replaced_and_the_event_sent_once(
    store: EtcdStore,
    keys: Keys,
    etcd_endpoints: list[str],
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    """s1 holds the delivery: the receiver keeps s1's first POST unanswered.
    s1 is killed -9; s2 takes the partition over once s1's lease expires and
    sends the pending delivery again: one event id, delivered."""
    receiver = await WebhookReceiver(hold_first=True).start()
    try:
        clock = SystemClock()
        await ensure_cluster(store, keys, P, clock.now_ms())
        await make_hook(store, keys, receiver.url)
        env = agent_env(etcd_endpoints, keys.prefix, tmp_path, webhook_retry_initial_ms=200)
        s1 = AgentProcess("s1", ["scheduler"], env, tmp_path).start()
        agents += [s1, AgentProcess("w1", ["worker"], env, tmp_path).start()]
        jobs = JobService(store, keys, clock, P)
        await jobs.create(spec(NOW, ["false"], notify=notify("run.failed")), "wh-crash")

        def first_post_held() -> None:
            assert len(receiver.received) == 1, s1.log_tail()

        await assert_eventually(first_post_held, timeout=20)
        s1.kill9()
        agents.append(AgentProcess("s2", ["scheduler"], env, tmp_path).start())
        job_id = full_id("wh-crash")
        page = await store.range(keys.runs_prefix(job_id))
        run = page.kvs[0].decode(RunRecord).value
        assert run.partition == partition_of(job_id, P)
        delivery = await ended_delivery(store, keys, run)
        assert delivery.state == "delivered"
        ids = receiver.event_ids()
        assert len(ids) >= 2 and set(ids) == {delivery.event_id}, ids
        assert {r.kind for r in receiver.received} == {"run.failed"}
    finally:
        await receiver.stop()


async def test_a_job_failing_twice_in_a_row_is_paused_and_says_so_once(
    services: Services, receiver: WebhookReceiver
) -> None:
    await make_hook(services.store, services.keys, receiver.url)
    services.start_scheduler("s1")
    start_worker(services, "w1")
    job = spec(
        {"kind": "interval", "every": "1s"},
        ["false"],
        pause_after_failures=2,
        notify=notify("job.paused"),
    )
    await services.jobs.create(job, "wh-pause")

    async def paused() -> None:
        assert (await services.jobs.get(full_id("wh-pause"))).state == "paused"

    await assert_eventually(paused, timeout=20)
    runs = await wait_runs(services, "wh-pause", terminal, timeout=20)
    failed = [run for run in runs if run.state == "failed"]
    assert len(failed) >= 2, [(r.id, r.state) for r in runs]

    async def all_sent() -> None:
        prefix = f"{services.keys.prefix}outbox/"
        assert (await services.store.range(prefix, count_only=True)).count == 0
        assert [r.kind for r in receiver.received] == ["job.paused"]

    await assert_eventually(all_sent, timeout=15)
    body = receiver.received[0].json
    assert body["job"]["id"] == full_id("wh-pause") and "2 failed runs in a row" in body["reason"]
    assert body["run"]["id"] in {run.id for run in failed[:2]}


async def test_resuming_a_paused_job_sends_one_slot_skipped_for_the_paused_slots(
    services: Services, receiver: WebhookReceiver
) -> None:
    """The resume's own transaction writes the skip record and its event:
    the API reads the tenant's webhooks for it (it keeps no watched copy)."""
    await make_hook(services.store, services.keys, receiver.url)
    services.start_scheduler("s1")
    job = spec(every_second(), ["true"], notify=notify("slot.skipped"))
    created = await services.jobs.create(job, "wh-resume")
    await services.jobs.pause(created.id)
    paused_slot = await services.jobs.next_slot_of(created.id)
    assert paused_slot is not None
    await wait_until_ms(paused_slot + 2_300)
    await services.jobs.resume(created.id)

    async def one_skip_event() -> None:
        kinds = [(got.kind, got.json["run"]["reason"]) for got in receiver.received]
        assert kinds == [("slot.skipped", "paused")], receiver.received

    await assert_eventually(one_skip_event, timeout=15)


def failed_run(job: JobRecord, slot_ms: int, partitions: int) -> RunRecord:
    run = new_run(RunOrigin(job.id, job.spec, job.version), slot_ms, slot_ms, partitions)
    run = start_attempt(assign_attempt(run, "w1", slot_ms), slot_ms, pid=1)
    return finish_attempt(run, "failed", slot_ms + 10, exit_code=1)


async def paused_events(store: Store, keys: Keys, partition: int) -> list[Delivery]:
    page = await store.range(
        keys.outbox_prefix(partition), prefix_end(keys.outbox_prefix(partition))
    )
    found = [kv.decode(Delivery).value for kv in page.kvs]
    return [d for d in found if d.kind == "job.paused" and d.webhook != PAUSE_CHECK]


async def test_a_pause_check_run_again_after_a_resume_leaves_the_job_active(
    services: Services,
) -> None:
    """A pause check acted on (the job paused, its job.paused event written)
    whose own removal was lost, run again from the same read after a user
    resumed the job: the pausing transaction deleted the check and compared
    it, so the job stays active and no second job.paused is written."""
    store, keys = services.store, services.keys
    now = int(time.time() * 1000)
    tenant_hook = Webhook(tenant="default", name="ops", url="https://h.example/x",
                          events=frozenset({"job.paused"}), secret=SECRET,
                          created_ms=now, updated_ms=now)  # fmt: skip
    outbox = Outbox(keys, lambda tenant: [tenant_hook])
    job = await services.jobs.create(
        spec(every_second(), ["false"], pause_after_failures=2), "wh-race"
    )
    runs = [failed_run(job, now - 2000 + n, services.config.partitions) for n in (0, 1)]
    partition = runs[-1].partition
    await store.txn([], [*(Ops.put(keys.run(r.id), r) for r in runs), *outbox.run_ops(runs[-1])])
    (check_kv,) = (
        await store.range(keys.outbox_prefix(partition), prefix_end(keys.outbox_prefix(partition)))
    ).kvs
    check = check_kv.decode(Delivery).value
    assert check.webhook == PAUSE_CHECK
    owner = OwnerRecord(scheduler="s1", since_ms=now)
    owned = await store.txn([], [Ops.put(keys.owner(partition), owner)])
    fence = Cmp.created(keys.owner(partition), owned.revision)
    pauses = FailurePause(store, keys, SystemClock(), services.jobs, outbox)

    assert await pauses.check(check, check_kv, partition, fence)
    assert (await services.jobs.get(job.id)).state == "paused"
    (event,) = await paused_events(store, keys, partition)
    assert await store.get(check_kv.key) is None, "the pause deleted its check"
    sent = keys.outbox(partition, event.run_id, event.event_id)
    await store.txn([], [Ops.delete(sent)])  # (as the sender moves it once delivered)
    await services.jobs.resume(job.id)

    assert not await pauses.check(check, check_kv, partition, fence)  # the lost removal's retry
    assert (await services.jobs.get(job.id)).state == "active"
    assert await paused_events(store, keys, partition) == []
