"""The coalescing store: concurrent requests share transactions, yet each
gets the verdict it would have got alone (against a real etcd)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio

from etcdsched.store.coalesce import CoalescingStore
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.kv import Cmp, Ops


@pytest_asyncio.fixture(loop_scope="session")
async def coalescing(etcd_endpoints: list[str]) -> AsyncIterator[CoalescingStore]:
    store = CoalescingStore(await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd_endpoints))))
    try:
        yield store
    finally:
        await store.close()


async def test_one_failing_compare_does_not_fail_the_others(
    coalescing: CoalescingStore, key_prefix: str
) -> None:
    keys = [f"{key_prefix}co/{i}" for i in range(40)]
    await coalescing.inner.txn([], [Ops.put(keys[7], b"taken")])
    txns_before = coalescing.stats.txns
    results = await asyncio.gather(
        *(coalescing.txn([Cmp.absent(k)], [Ops.put(k, b"mine")], [Ops.get(k)]) for k in keys)
    )
    verdicts = [r.succeeded for r in results]
    assert verdicts == [i != 7 for i in range(40)]
    assert results[7].responses[0][0].value == b"taken"  # its own failure read
    values = await asyncio.gather(*(coalescing.get(k) for k in keys))
    assert [v.value if v else None for v in values] == [
        b"taken" if i == 7 else b"mine" for i in range(40)
    ]
    # 40 writes (plus the replays after the failed batch) and 40 reads in far fewer requests
    assert coalescing.stats.txns - txns_before < 60


async def test_transactions_on_one_key_never_share_a_batch(
    coalescing: CoalescingStore, key_prefix: str
) -> None:
    """Twenty compare-and-swap increments racing on one key: batched
    together, the compares would all see the same revision and all but one
    increment would be lost."""
    key = f"{key_prefix}counter"
    await coalescing.txn([], [Ops.put(key, b"0")])

    async def increment() -> None:
        while True:
            kv = await coalescing.get(key)
            assert kv is not None
            bumped = str(int(kv.value) + 1).encode()
            if (
                await coalescing.txn([Cmp.mod(key, kv.mod_revision)], [Ops.put(key, bumped)])
            ).succeeded:
                return

    await asyncio.gather(*(increment() for _ in range(20)))
    final = await coalescing.get(key)
    assert final is not None and final.value == b"20"


async def test_success_reads_are_split_per_transaction(
    coalescing: CoalescingStore, key_prefix: str
) -> None:
    a, b = f"{key_prefix}sa", f"{key_prefix}sb"
    first, second = await asyncio.gather(
        coalescing.txn([], [Ops.put(a, b"1"), Ops.get(a)]),
        coalescing.txn([], [Ops.put(b, b"2"), Ops.get(b)]),
    )
    assert first.responses[1][0].value == b"1" and second.responses[1][0].value == b"2"
    assert len(first.responses) == len(second.responses) == 2


async def test_transactions_asked_in_one_turn_travel_as_one(
    coalescing: CoalescingStore, key_prefix: str
) -> None:
    """What is asked in one event-loop turn (e.g. the reports a gathering
    window releases together) is one transaction, not the first two alone
    and the rest behind them."""
    keys = [f"{key_prefix}turn/{i}" for i in range(10)]
    txns_before = coalescing.stats.txns
    results = await asyncio.gather(
        *(coalescing.txn([Cmp.absent(k)], [Ops.put(k, b"v")]) for k in keys)
    )
    assert all(r.succeeded for r in results)
    assert coalescing.stats.txns - txns_before == 1
