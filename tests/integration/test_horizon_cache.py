"""HorizonCache against a real etcd: moving the horizon by listing only the
window it newly covers holds exactly what a whole listing would, while
writers put and delete keys on both sides of the moving edge."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from etcdsched.runtime.clock import SystemClock
from etcdsched.store.cache import list_all, list_at
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.horizon_cache import HorizonCache
from etcdsched.store.kv import Ops, Store
from tests.support.eventually import assert_eventually


async def put(store: Store, key: str, value: bytes) -> None:
    await store.txn([], [Ops.put(key, value)])


async def delete(store: Store, key: str) -> None:
    await store.txn([], [Ops.delete(key)])


class Edge:
    """A horizon moved by hand: keys ``<prefix>NNNN`` below ``until``."""

    def __init__(self, prefix: str, until: int) -> None:
        self.prefix = prefix
        self.until = until
        self.end = self.key(until)

    def key(self, n: int) -> str:
        return f"{self.prefix}{n:04d}"

    def move(self) -> str:
        self.end = self.key(self.until)
        return self.end

    def keep(self, key: str) -> bool:
        return key < self.end


@pytest_asyncio.fixture(loop_scope="session")
async def running(store: EtcdStore, key_prefix: str) -> AsyncIterator[tuple[HorizonCache, Edge]]:
    edge = Edge(f"{key_prefix}h/", until=10)
    cache = HorizonCache(
        store,
        SystemClock(),
        edge.prefix,
        horizon_end=edge.move,
        keep=edge.keep,
        extend_every=0.05,
        relist_every=3600,
        group_by=lambda key: key[-4:-1],  # by tens
    )
    task = asyncio.create_task(cache.run())
    await cache.ready.wait()
    try:
        yield cache, edge
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_horizon_moves_by_listing_the_new_window_only(
    store: EtcdStore, running: tuple[HorizonCache, Edge]
) -> None:
    cache, edge = running
    for n in (5, 15, 25):
        await put(store, edge.key(n), b"x")
    await put(store, edge.key(16), b"gone soon")
    await delete(store, edge.key(16))
    await assert_eventually(lambda: set(cache.items) == {edge.key(5)})
    edge.until = 20
    await assert_eventually(lambda: set(cache.items) == {edge.key(5), edge.key(15)})
    await delete(store, edge.key(15))
    await put(store, edge.key(19), b"y")
    await assert_eventually(lambda: set(cache.items) == {edge.key(5), edge.key(19)})
    assert set(cache.group("000")) == {edge.key(5)} and set(cache.group("001")) == {edge.key(19)}
    assert cache.relists == 1 and cache.extensions >= 1


@pytest.mark.parametrize("seed", [28, 29, 30])
async def test_what_is_held_equals_a_whole_listing_under_concurrent_writes(
    store: EtcdStore, running: tuple[HorizonCache, Edge], seed: int
) -> None:
    cache, edge = running
    rng = random.Random(seed)

    async def write() -> None:
        for _ in range(600):
            n = rng.randrange(0, 200)
            if rng.random() < 0.3:
                await delete(store, edge.key(n))
            else:
                await put(store, edge.key(n), str(rng.random()).encode())

    async def move() -> None:
        while edge.until < 200:
            edge.until += rng.randrange(1, 8)
            await asyncio.sleep(0.02)

    await asyncio.gather(write(), move())
    await put(store, f"{edge.prefix}~", b"end")  # past every numbered key: never held
    final = (await store.range(edge.prefix)).revision

    def caught_up() -> bool:
        return cache.revision >= final and cache.listed_end == edge.key(edge.until)

    await assert_eventually(caught_up)
    whole, _ = await list_all(store, edge.prefix, cache.listed_end)
    assert {k: kv.value for k, kv in cache.items.items()} == {
        k: kv.value for k, kv in whole.items()
    }
    assert cache.relists == 1


async def test_a_quiet_prefix_whose_revision_was_compacted_still_moves_without_a_relist(
    store: EtcdStore, key_prefix: str, running: tuple[HorizonCache, Edge]
) -> None:
    cache, edge = running
    await put(store, edge.key(30), b"later")
    await put(store, edge.key(3), b"seen")  # held: proves the watch runs before the compaction
    await assert_eventually(lambda: edge.key(3) in cache.items)
    held = cache.revision
    await put(store, f"{key_prefix}elsewhere", b"moves the revision past what the cache holds")
    head = (await store.range(edge.prefix)).revision
    await store.compact(head)
    assert head > held
    edge.until = 40
    await assert_eventually(lambda: edge.key(30) in cache.items)
    await put(store, edge.key(31), b"after")
    await assert_eventually(lambda: edge.key(31) in cache.items)
    assert cache.relists == 1


async def test_a_window_of_many_pages_is_listed_as_one_revision(
    store: EtcdStore, key_prefix: str
) -> None:
    prefix = f"{key_prefix}pages/"
    keys = [f"{prefix}{n:05d}" for n in range(2500)]
    for at in range(0, len(keys), 100):
        await store.txn([], [Ops.put(k, b"old") for k in keys[at : at + 100]])
    pinned = (await store.range(prefix, limit=1)).revision
    await store.txn([], [Ops.delete(keys[2400]), Ops.put(keys[2401], b"new")])
    listed, revision = await list_at(store, prefix, f"{prefix}~", None, pinned)
    assert revision == pinned and len(listed) == 2500
    assert listed[keys[2401]].value == b"old"
