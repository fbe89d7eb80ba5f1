"""Shared watches (ADR 0016), against a real etcd: each subscriber sees
exactly what a watch of its own would have seen, and one etcd watch
serves them all while it can."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from etcdsched.errors import StoreUnavailable
from etcdsched.etcd_store import EtcdOptions, EtcdStore
from etcdsched.store import Compacted, Event, Ops, WatchBatch
from etcdsched.watch_hub import SharedWatchStore

Seen = list[tuple[str, str, int]]
"""(kind, key, revision) of each event, in the order delivered."""


@pytest_asyncio.fixture(loop_scope="session")
async def etcd(etcd_endpoints: list[str]) -> AsyncIterator[EtcdStore]:
    store = await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd_endpoints)))
    try:
        yield store
    finally:
        await store.close()


def _seen(events: list[Event]) -> Seen:
    return [(e.kind, e.kv.key, e.kv.mod_revision) for e in events]


class Follower:
    """Collects one watch in the background, like a cache's follow loop."""

    def __init__(self, watches: AsyncIterator[WatchBatch]) -> None:
        self.seen: Seen = []
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._collect(watches))

    async def _collect(self, watches: AsyncIterator[WatchBatch]) -> None:
        try:
            async for batch in watches:
                self.seen += _seen(batch.events)
        except (StoreUnavailable, Compacted) as exc:
            self.error = exc

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _until(condition: object, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def _history(etcd: EtcdStore, root: str, first: int, last: int) -> Seen:
    """Every event under ``root`` from ``first`` to ``last`` (a revision
    that wrote under it), as one etcd watch of its own sees them."""
    seen: Seen = []
    async with asyncio.timeout(10):
        async for batch in etcd.watch(root, first):
            seen += _seen(batch.events)
            if seen[-1][2] >= last:
                break
    return [s for s in seen if s[2] <= last]


async def _caught_up(follower: Follower, events: int) -> None:
    await _until(lambda: len(follower.seen) >= events)


def _expected(history: Seen, prefix: str, start: int, upto: int | None = None) -> Seen:
    return [
        s for s in history if s[1].startswith(prefix) and s[2] >= start and s[2] <= (upto or s[2])
    ]


async def test_one_etcd_watch_serves_every_prefix_under_the_root(
    etcd: EtcdStore, key_prefix: str
) -> None:
    hub = SharedWatchStore(etcd, [key_prefix])
    start = (await etcd.txn([], [Ops.put(f"{key_prefix}a/0", b"x")])).revision
    followers = {
        f"{key_prefix}{p}/": Follower(hub.watch(f"{key_prefix}{p}/", start)) for p in "abc"
    }
    last = 0
    for i in range(30):
        key = f"{key_prefix}{'abcd'[i % 4]}/{i % 5}"
        op = Ops.delete(key) if i % 7 == 6 else Ops.put(key, str(i).encode())
        last = (await etcd.txn([], [op])).revision
    history = await _history(etcd, key_prefix, start, last)
    for prefix, follower in followers.items():
        expected = _expected(history, prefix, start)
        await _caught_up(follower, len(expected))
        assert follower.seen == expected
    shared = hub.shared[key_prefix]
    assert shared.task is not None and hub.own_watches == 0  # one etcd watch for all three
    for follower in followers.values():
        await follower.stop()
    assert shared.task is None  # the last one out stopped it


def _received(hub: SharedWatchStore, root: str, revision: int) -> bool:
    kept = hub.shared[root].kept
    return bool(kept) and kept[-1][0][-1].kv.mod_revision >= revision


async def _until_received(hub: SharedWatchStore, root: str, revision: int) -> None:
    await _until(lambda: _received(hub, root, revision))


async def test_a_late_subscriber_is_handed_what_it_missed(etcd: EtcdStore, key_prefix: str) -> None:
    hub = SharedWatchStore(etcd, [key_prefix])
    start = (await etcd.txn([], [Ops.put(f"{key_prefix}a/0", b"x")])).revision
    early = Follower(hub.watch(f"{key_prefix}a/", start))
    revisions = [
        (await etcd.txn([], [Ops.put(f"{key_prefix}b/{i}", b"y")])).revision for i in range(5)
    ]
    await _until_received(hub, key_prefix, revisions[-1])
    late = Follower(hub.watch(f"{key_prefix}b/", revisions[2]))
    last = (await etcd.txn([], [Ops.put(f"{key_prefix}b/9", b"z")])).revision
    expected = _expected(
        await _history(etcd, key_prefix, start, last), f"{key_prefix}b/", revisions[2]
    )
    await _until(lambda: len(late.seen) >= len(expected))
    assert late.seen == expected and len(expected) == 4
    assert hub.own_watches == 0
    await early.stop()
    await late.stop()


async def test_a_start_older_than_the_replay_gets_a_watch_of_its_own(
    etcd: EtcdStore, key_prefix: str
) -> None:
    hub = SharedWatchStore(etcd, [key_prefix], replay_bytes=1)  # keeps one batch
    old = (await etcd.txn([], [Ops.put(f"{key_prefix}a/0", b"x")])).revision
    first = Follower(hub.watch(f"{key_prefix}a/", old))
    for i in range(5):  # one batch each: the replay keeps only the last
        mark = (await etcd.txn([], [Ops.put(f"{key_prefix}a/{i}", b"y")])).revision
        await _until_received(hub, key_prefix, mark)
    behind = Follower(hub.watch(f"{key_prefix}a/", old + 1))
    last = (await etcd.txn([], [Ops.put(f"{key_prefix}a/9", b"z")])).revision
    expected = _expected(await _history(etcd, key_prefix, old, last), f"{key_prefix}a/", old + 1)
    await _until(lambda: len(behind.seen) >= len(expected))
    assert behind.seen == expected and len(expected) == 6
    assert hub.own_watches == 1
    await first.stop()
    await behind.stop()


async def test_a_failed_shared_watch_fails_every_subscriber_then_starts_afresh(
    etcd: EtcdStore, key_prefix: str
) -> None:
    hub = SharedWatchStore(etcd, [key_prefix])
    shared = hub.shared[key_prefix]
    gone = (await etcd.txn([], [Ops.put(f"{key_prefix}a/0", b"x")])).revision
    latest = (await etcd.txn([], [Ops.put(f"{key_prefix}a/0", b"y")])).revision
    await etcd.compact(latest)
    # both join before the watch (started at a compacted revision) reports
    a, b = shared.subscribe(f"{key_prefix}a/", gone), shared.subscribe(f"{key_prefix}b/", latest)
    assert a is not None and b is not None
    failures = [await asyncio.wait_for(s.inbox.get(), 5) for s in (a, b)]
    assert all(isinstance(f, Compacted) for f in failures) and failures[0] is not failures[1]
    assert shared.task is None
    again = Follower(hub.watch(f"{key_prefix}a/", latest + 1))
    last = (await etcd.txn([], [Ops.put(f"{key_prefix}a/1", b"z")])).revision
    await _until(lambda: again.seen == [("put", f"{key_prefix}a/1", last)])
    await again.stop()


@pytest.mark.parametrize("seed", [1, 2])
async def test_random_subscribers_each_see_exactly_their_own_watch(
    etcd: EtcdStore, key_prefix: str, seed: int
) -> None:
    """Subscribers come and go at random starts (some older than a small
    replay) while random writes land: each saw what its own watch would."""
    rng = random.Random(seed)
    hub = SharedWatchStore(etcd, [key_prefix], replay_bytes=2000)  # a few batches
    prefixes = [f"{key_prefix}{p:02d}/" for p in range(6)]
    revisions = [(await etcd.txn([], [Ops.put(f"{prefixes[0]}seed", b"")])).revision]
    stopped: list[tuple[str, int, Follower]] = []
    live: list[tuple[str, int, Follower]] = []
    for _ in range(60):
        keys = rng.sample(prefixes, rng.randint(1, 3))
        ops = [Ops.put(f"{k}{rng.randint(0, 3)}", b"v" * rng.randint(1, 40)) for k in keys]
        revisions.append((await etcd.txn([], ops)).revision)
        if rng.random() < 0.3:
            prefix, start = rng.choice(prefixes), rng.choice(revisions[-8:]) + 1
            live.append((prefix, start, Follower(hub.watch(prefix, start))))
        if live and rng.random() < 0.15:
            leaving = live.pop(rng.randrange(len(live)))
            await leaving[2].stop()
            stopped.append(leaving)
        await asyncio.sleep(rng.choice([0, 0, 0.01]))
    history = await _history(etcd, key_prefix, revisions[0], revisions[-1])
    for prefix, start, follower in live:
        expected = _expected(history, prefix, start)
        await _caught_up(follower, len(expected))
        assert follower.seen == expected
        await follower.stop()
    for prefix, start, follower in stopped:  # what it saw before it left: no gap, no repeat
        upto = follower.seen[-1][2] if follower.seen else start - 1
        assert follower.seen == _expected(history, prefix, start, upto)
    assert len(live) + len(stopped) >= 10 and hub.own_watches > 0  # both ways were taken
    assert hub.shared[key_prefix].task is None
