"""The store contract, against a real etcd: directly and through the
coalescing wrapper the worker uses (it must be indistinguishable)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from etcdsched.store.coalesce import CoalescingStore
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.kv import Cmp, Ops, Store
from tests.support.eventually import assert_eventually


@pytest_asyncio.fixture(loop_scope="session", params=["direct", "coalescing"])
async def store(request: pytest.FixtureRequest, etcd_endpoints: list[str]) -> AsyncIterator[Store]:
    direct = await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd_endpoints)))
    s: Store = direct if request.param == "direct" else CoalescingStore(direct)
    try:
        yield s
    finally:
        await s.close()


def _etcd_under(store: Store) -> EtcdStore:
    """The real etcd client behind ``store`` (tests that compact call it directly)."""
    etcd = store.inner if isinstance(store, CoalescingStore) else store
    assert isinstance(etcd, EtcdStore)
    return etcd


async def test_talks_to_a_real_etcd_server(store: Store) -> None:
    version = await store.server_version()
    assert version.startswith(("3.4.", "3.5."))  # docs/adr/0023-etcd-server.md


async def test_create_only_if_absent(store: Store, key_prefix: str) -> None:
    key = f"{key_prefix}a"
    first = await store.txn([Cmp.absent(key)], [Ops.put(key, b"1")])
    second = await store.txn([Cmp.absent(key)], [Ops.put(key, b"2")])
    assert first.succeeded and not second.succeeded
    kv = await store.get(key)
    assert kv is not None and kv.value == b"1" and kv.version == 1


async def test_cas_on_mod_revision(store: Store, key_prefix: str) -> None:
    key = f"{key_prefix}b"
    await store.txn([], [Ops.put(key, b"x")])
    kv = await store.get(key)
    assert kv is not None
    ok = await store.txn([Cmp.mod(key, kv.mod_revision)], [Ops.put(key, b"y")])
    stale = await store.txn([Cmp.mod(key, kv.mod_revision)], [Ops.put(key, b"z")])
    assert ok.succeeded and not stale.succeeded
    now = await store.get(key)
    assert now is not None and now.value == b"y"


async def test_compare_on_create_revision_and_value(store: Store, key_prefix: str) -> None:
    key = f"{key_prefix}c"
    put = await store.txn([], [Ops.put(key, b"v1")])
    kv = await store.get(key)
    assert kv is not None and kv.create_revision == put.revision
    assert (await store.txn([Cmp.created(key, kv.create_revision)], [])).succeeded
    assert (await store.txn([Cmp.value(key, b"v1")], [])).succeeded
    assert not (await store.txn([Cmp.value(key, b"v2")], [])).succeeded
    await store.txn([], [Ops.delete(key)])
    await store.txn([], [Ops.put(key, b"v1")])
    assert not (await store.txn([Cmp.created(key, kv.create_revision)], [])).succeeded


async def test_prefix_empty_compare(store: Store, key_prefix: str) -> None:
    prefix = f"{key_prefix}active/job/"
    assert (await store.txn([Cmp.prefix_empty(prefix)], [])).succeeded
    await store.txn([], [Ops.put(prefix + "1", b"")])
    assert not (await store.txn([Cmp.prefix_empty(prefix)], [])).succeeded


async def test_failure_branch_reads(store: Store, key_prefix: str) -> None:
    key = f"{key_prefix}d"
    await store.txn([], [Ops.put(key, b"held")])
    result = await store.txn([Cmp.absent(key)], [Ops.put(key, b"mine")], [Ops.get(key)])
    assert not result.succeeded
    assert result.responses[0][0].value == b"held"


async def test_range_limit_keys_only_count(store: Store, key_prefix: str) -> None:
    for i in range(5):
        await store.txn([], [Ops.put(f"{key_prefix}r/{i:02d}", b"v")])
    page = await store.range(f"{key_prefix}r/", limit=2)
    assert [kv.key[-2:] for kv in page.kvs] == ["00", "01"] and page.more and page.count == 5
    keys_only = await store.range(f"{key_prefix}r/", keys_only=True)
    assert all(kv.value == b"" for kv in keys_only.kvs) and len(keys_only.kvs) == 5
    counted = await store.range(f"{key_prefix}r/", count_only=True)
    assert counted.count == 5 and counted.kvs == []
    desc = await store.range(f"{key_prefix}r/", descending=True, limit=1)
    assert desc.kvs[0].key.endswith("04")


async def test_leased_key_disappears_after_keepalive_stops(store: Store, key_prefix: str) -> None:
    key = f"{key_prefix}leased"
    lease_id, ttl = await store.grant(2)
    await store.txn([], [Ops.put(key, b"x", lease=lease_id)])
    assert (await store.keepalive_once(lease_id, 2.0)) > 0
    stopped = time.monotonic()

    async def gone() -> None:
        assert await store.get(key) is None

    await assert_eventually(gone, timeout=ttl + 2)
    assert time.monotonic() - stopped <= ttl + 1.5


async def test_touch_raises_mod_revision_and_keeps_the_lease(store: Store, key_prefix: str) -> None:
    """The assignment epoch (ADR 0013): a touch is a write every later
    ``mod <`` compare sees, on a key that still dies with its lease."""
    key = f"{key_prefix}epoch"
    lease_id, _ = await store.grant(30)
    created = await store.txn([], [Ops.put(key, b"", lease=lease_id)])
    below = Cmp.unwritten_since(key, created.revision)
    touched = await store.txn([Cmp.exists(key), below], [Ops.touch(key)])
    assert touched.succeeded
    assert not (await store.txn([below], [])).succeeded
    kv = await store.get(key)
    assert kv is not None and kv.mod_revision == touched.revision and kv.lease == lease_id
    await store.revoke(lease_id)
    assert await store.get(key) is None
    assert not (await store.txn([Cmp.exists(key)], [Ops.touch(key)])).succeeded


async def test_watch_delivers_every_event_in_order(store: Store, key_prefix: str) -> None:
    prefix = f"{key_prefix}w/"
    start = (await store.txn([], [Ops.put(prefix + "0", b"0")])).revision
    for i in range(1, 20):
        await store.txn([], [Ops.put(prefix + str(i % 3), str(i).encode())])
    await store.txn([], [Ops.delete(prefix + "1")])
    seen: list[tuple[str, bytes]] = []

    async def collect() -> None:
        async for batch in store.watch(prefix, start):
            for event in batch.events:
                seen.append((event.kind, event.kv.value))
            if len(seen) >= 21:
                return

    await asyncio.wait_for(collect(), 10)
    assert [v for k, v in seen if k == "put"] == [str(i).encode() for i in range(20)]
    assert seen[-1][0] == "delete"


async def test_compacted_watch_relists_and_resumes(store: Store, key_prefix: str) -> None:
    from etcdsched.runtime.clock import SystemClock
    from etcdsched.store.cache import PrefixCache
    from etcdsched.store.kv import Compacted

    prefix = f"{key_prefix}cw/"
    await store.txn([], [Ops.put(prefix + "a", b"1")])
    cache = PrefixCache(store, SystemClock(), prefix)
    await cache.relist()
    listed_at = cache.revision
    await store.txn([], [Ops.put(prefix + "b", b"2")])
    await store.txn([], [Ops.delete(prefix + "a")])
    latest = (await store.txn([], [Ops.put(prefix + "c", b"3")])).revision
    etcd = _etcd_under(store)
    await etcd.compact(latest)
    with pytest.raises(Compacted):
        async for _ in store.watch(prefix, listed_at + 1):
            pass
    task = asyncio.create_task(cache.run())
    try:

        async def caught_up() -> None:
            assert sorted(k[-1] for k in cache.items) == ["b", "c"]
            assert cache.relists == 2

        await assert_eventually(caught_up, timeout=5)
        await store.txn([], [Ops.put(prefix + "d", b"4")])

        async def resumed() -> None:
            assert prefix + "d" in cache.items

        await assert_eventually(resumed, timeout=5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_read_at_a_compacted_revision_says_compacted(store: Store, key_prefix: str) -> None:
    from etcdsched.store.kv import Compacted

    key = f"{key_prefix}cr"
    old = (await store.txn([], [Ops.put(key, b"1")])).revision
    latest = (await store.txn([], [Ops.put(key, b"2")])).revision
    etcd = _etcd_under(store)
    await etcd.compact(latest)
    with pytest.raises(Compacted):
        await store.range(key, revision=old)


class _CompactsAfterFirstPages:
    """A real store that compacts etcd right after each of the first
    ``times`` listings' first page: the race a paged listing can lose."""

    def __init__(self, etcd: EtcdStore, times: int) -> None:
        self.etcd, self.times = etcd, times

    async def range(self, start: str, end: str | None = None, **kw: object) -> object:
        page = await self.etcd.range(start, end, **kw)  # type: ignore[arg-type]
        if self.times and not kw.get("revision"):
            self.times -= 1
            mark = await self.etcd.txn([], [Ops.put(start + "~mark", b"")])
            await self.etcd.compact(mark.revision)
        return page


@pytest.mark.parametrize("compactions", [1, 3])
async def test_a_listing_that_a_compaction_overtakes_starts_over(
    etcd_endpoints: list[str], key_prefix: str, monkeypatch: pytest.MonkeyPatch, compactions: int
) -> None:
    from etcdsched.model.errors import StoreUnavailable
    from etcdsched.store import cache

    etcd = await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd_endpoints)))
    try:
        prefix = f"{key_prefix}paged/"
        await etcd.txn([], [Ops.put(f"{prefix}{i:02d}", b"x") for i in range(10)])
        monkeypatch.setattr(cache, "PAGE", 3)
        racing = _CompactsAfterFirstPages(etcd, compactions)
        if compactions < cache.LIST_ATTEMPTS:
            items, _ = await cache.list_all(racing, prefix, prefix + "~")  # type: ignore[arg-type]
            assert sorted(items) == [f"{prefix}{i:02d}" for i in range(10)]
        else:
            with pytest.raises(StoreUnavailable, match="outran compaction"):
                await cache.list_all(racing, prefix, prefix + "~")  # type: ignore[arg-type]
    finally:
        await etcd.close()
