"""Fail-over of the store over a 3-member cluster, and session loss when etcd stalls."""

from __future__ import annotations

import time
from pathlib import Path

from etcdsched.model.errors import EtcdschedError
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.embedded import EtcdTuning
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.etcd_cluster import EtcdCluster
from etcdsched.store.kv import Ops
from etcdsched.store.session import Session
from tests.support.eventually import assert_eventually

RETRY_WINDOW = 3.0


async def test_killing_a_member_fails_calls_only_within_one_retry_window(
    healthy_cluster3: EtcdCluster, key_prefix: str
) -> None:
    store = await EtcdStore.connect(
        EtcdOptions(endpoints=tuple(healthy_cluster3.endpoints), timeout=1.0)
    )
    try:
        for i in range(20):
            await store.txn([], [Ops.put(f"{key_prefix}warm/{i}", b"x")])
        leader = healthy_cluster3.leader_index()
        assert leader is not None
        healthy_cluster3.member(leader).kill()
        killed = time.monotonic()
        failures: list[float] = []
        successes = 0
        while successes < 50:
            try:
                await store.txn([], [Ops.put(f"{key_prefix}after/{successes}", b"x")])
                await store.get(f"{key_prefix}after/{successes}")
                successes += 1
            except EtcdschedError:
                failures.append(time.monotonic() - killed)
            assert time.monotonic() - killed < 20, "calls keep failing"
        last = max(failures, default=0.0)
        print(f"failures after killing the leader: {len(failures)}, last at {last:.2f} s")
        assert all(t <= RETRY_WINDOW for t in failures), failures
    finally:
        await store.close()


async def test_session_is_lost_before_its_lease_can_expire_when_etcd_stalls(
    tmp_path: Path, key_prefix: str
) -> None:
    with EtcdCluster(tmp_path / "stall", 1, tuning=EtcdTuning(unsafe_no_fsync=True)) as cluster:
        store = await EtcdStore.connect(
            EtcdOptions(endpoints=tuple(cluster.endpoints), timeout=1.0)
        )
        clock = SystemClock()
        try:
            session = await Session.open(store, clock, ttl=2)
            key = f"{key_prefix}held"
            await store.txn([], [Ops.put(key, b"x", lease=session.lease_id)])
            await assert_eventually(lambda: session.last_renewal_sent > 0, timeout=3)
            cluster.member(0).pause()
            try:
                await assert_eventually(lambda: session.lost, timeout=5)
                lost_at = time.monotonic()
                earliest_expiry = session.last_renewal_sent + session.ttl
                print(f"lost {earliest_expiry - lost_at:.2f} s before the lease could expire")
                assert lost_at < earliest_expiry
            finally:
                cluster.member(0).resume()

            async def expired() -> None:
                assert await store.get(key) is None

            await assert_eventually(expired, timeout=10)
            await session.orphan()
        finally:
            await store.close()
