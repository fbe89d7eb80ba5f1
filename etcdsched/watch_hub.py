"""Watches that share one etcd watch per key family (ADR 0016).

A scheduler follows three prefixes per partition it owns: the due index,
the placement queue and the active runs, so 192 watch streams at 64
partitions. A transaction that touches runs of many partitions (a batch of
placements on one worker, a batch of reports) then reaches the scheduler
as one message per stream it touches, and each message costs etcd and the
scheduler a fixed amount of work whatever it carries.

:class:`SharedWatchStore` wraps a store. ``watch(prefix, start)`` for a
prefix under one of its *roots* (``due/``, ``queue/``, ``active/``) is
served from one etcd watch over the whole root, whose events are handed to
every subscriber whose prefix they fall under. Other calls go straight
through.

A subscriber sees exactly what a watch of its own would have seen: every
event under its prefix with a revision at or after its start, in revision
order, each once:

* the shared watch receives every event under the root, in revision order,
  from the revision it started at;
* it keeps the events it received recently (about ``replay_bytes`` of them). A
  subscriber that joins later is handed the kept events at or after its
  start first, then the live ones: everything received from
  ``covered_from`` on is either kept or still to come;
* a subscriber whose start is older than ``covered_from`` gets a watch of
  its own from etcd, as if the hub were not there (etcd replays its
  history);
* when the shared watch fails (etcd unavailable, its start compacted),
  every subscriber's watch fails with the same kind of error, the way each
  of their own watches would have; the next subscriber starts a new one.

The price: a scheduler receives the events of the partitions it does not
own too, and drops them on arrival (see the ADR for when that matters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence

from etcdsched.errors import StoreUnavailable
from etcdsched.store import (
    KV,
    Compacted,
    Compare,
    Event,
    Op,
    RangeResult,
    Store,
    StoreStats,
    TxnResult,
    WatchBatch,
)

log = logging.getLogger(__name__)
REPLAY_BYTES = 4 << 20
"""About how much memory of recent events a shared watch keeps for late
subscribers: a partition cache lists, then watches from the revision after
its listing, and under load the shared watch has moved past it by then.
About a second of events at 2,000 runs a second."""
EVENT_OVERHEAD = 400
"""Bytes an event's Python objects take besides its key and value."""

Failure = StoreUnavailable | Compacted


class _Subscriber:
    """One caller's watch of ``prefix`` from ``start``, fed by a shared watch."""

    def __init__(self, prefix: str, start: int) -> None:
        self.prefix = prefix
        self.start = start
        self.inbox: asyncio.Queue[WatchBatch | Failure] = asyncio.Queue()

    def take(self, events: Sequence[Event]) -> list[Event]:
        """The events this subscriber asked for: at or after its start."""
        if not events or events[0].kv.mod_revision >= self.start:
            return list(events)
        return [e for e in events if e.kv.mod_revision >= self.start]


class SharedWatch:
    """One etcd watch over ``root`` and the subscribers it feeds."""

    def __init__(self, inner: Store, root: str, replay_bytes: int) -> None:
        self.inner = inner
        self.root = root
        self.replay_bytes = replay_bytes
        self.by_prefix: dict[str, list[_Subscriber]] = {}
        self._lengths: Counter[int] = Counter()
        """Prefix lengths in use: an event's subscribers are found by one
        dict lookup per length, not by testing every subscriber."""
        self.task: asyncio.Task[None] | None = None
        self.covered_from = 0
        """Every event under the root at or after this revision that the
        watch received is in ``kept``; the ones not yet received will be."""
        self.kept: deque[tuple[list[Event], int]] = deque()
        """Recent event batches with their header revision, oldest first."""
        self._kept_bytes = 0

    def subscribe(self, prefix: str, start: int) -> _Subscriber | None:
        """A subscriber fed from the shared watch, started now if it is not
        running; None if ``start`` is older than what it can replay."""
        if self.task is None:
            self.covered_from = start
            self.task = asyncio.create_task(self._follow(start), name=f"watch {self.root}")
        elif start < self.covered_from:
            return None
        subscriber = _Subscriber(prefix, start)
        backlog = self._replay(prefix, start)
        if backlog:
            subscriber.inbox.put_nowait(WatchBatch(backlog, self.kept[-1][1]))
        self.by_prefix.setdefault(prefix, []).append(subscriber)
        self._lengths[len(prefix)] += 1
        return subscriber

    def unsubscribe(self, subscriber: _Subscriber) -> None:
        """Forget ``subscriber``; the etcd watch stops with the last one."""
        peers = self.by_prefix.get(subscriber.prefix, [])
        if subscriber not in peers:
            return  # the watch failed and forgot every subscriber already
        peers.remove(subscriber)
        if not peers:
            del self.by_prefix[subscriber.prefix]
        length = len(subscriber.prefix)
        self._lengths[length] -= 1
        if not self._lengths[length]:
            del self._lengths[length]
        if not self._lengths and self.task is not None:
            self.task.cancel()
            self._reset()

    def _replay(self, prefix: str, start: int) -> list[Event]:
        """Kept events under ``prefix`` at or after ``start``, in order.
        Walks back from the newest batch: a subscriber usually starts
        just behind the watch."""
        batches = []
        for events, _ in reversed(self.kept):
            if events[-1].kv.mod_revision < start:
                break
            batches.append([e for e in events if e.kv.key.startswith(prefix)])
        return [e for batch in reversed(batches) for e in batch if e.kv.mod_revision >= start]

    async def _follow(self, start: int) -> None:
        try:
            async for batch in self.inner.watch(self.root, start):
                self._deliver(batch)
        except (StoreUnavailable, Compacted) as exc:
            self._fail(exc)
        except Exception as exc:  # a bug: say so, and never leave subscribers waiting
            log.exception("shared watch of %s failed", self.root)
            self._fail(StoreUnavailable(f"the watch of {self.root} failed: {exc!r}"))
        else:
            self._fail(StoreUnavailable(f"the watch of {self.root} ended"))

    def _deliver(self, batch: WatchBatch) -> None:
        self._keep(batch)
        mine: dict[_Subscriber, list[Event]] = {}
        for event in batch.events:
            key = event.kv.key
            for length in self._lengths:
                for subscriber in self.by_prefix.get(key[:length], ()):
                    mine.setdefault(subscriber, []).append(event)
        for subscriber, events in mine.items():
            taken = subscriber.take(events)
            if taken:
                subscriber.inbox.put_nowait(WatchBatch(taken, batch.revision))

    def _keep(self, batch: WatchBatch) -> None:
        self.kept.append((batch.events, batch.revision))
        self._kept_bytes += _size(batch.events)
        while self._kept_bytes > self.replay_bytes and len(self.kept) > 1:
            events, _ = self.kept.popleft()
            self._kept_bytes -= _size(events)
            self.covered_from = events[-1].kv.mod_revision + 1

    def _fail(self, exc: Failure) -> None:
        """Every subscriber's watch fails as its own would have; forget them."""
        for peers in self.by_prefix.values():
            for subscriber in peers:
                subscriber.inbox.put_nowait(_like(exc, self.root))
        self._reset()

    def _reset(self) -> None:
        self.by_prefix = {}
        self._lengths = Counter()
        self.task = None
        self.kept.clear()
        self._kept_bytes = 0


def _size(events: list[Event]) -> int:
    return sum(len(e.kv.key) + len(e.kv.value) + EVENT_OVERHEAD for e in events)


def _like(exc: Failure, root: str) -> Failure:
    """A fresh error of the same kind for each subscriber (one exception
    object raised in many tasks would tangle their tracebacks)."""
    if isinstance(exc, Compacted):
        return Compacted(exc.compact_revision)
    return StoreUnavailable(f"shared watch of {root}: {exc}")


class SharedWatchStore:
    """Wraps a :class:`~etcdsched.store.Store`; see the module docstring."""

    def __init__(
        self, inner: Store, roots: Sequence[str], replay_bytes: int = REPLAY_BYTES
    ) -> None:
        self.inner = inner
        self.stats: StoreStats = inner.stats
        self.shared = {root: SharedWatch(inner, root, replay_bytes) for root in roots}
        self.own_watches = 0
        """Watches opened for a subscriber the shared watch could not replay for."""

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchBatch]:
        shared = next((s for r, s in self.shared.items() if prefix.startswith(r)), None)
        subscriber = shared.subscribe(prefix, start_revision) if shared is not None else None
        if shared is None or subscriber is None:
            if shared is not None:
                self.own_watches += 1
            async for batch in self.inner.watch(prefix, start_revision):
                yield batch
            return
        try:
            while True:
                item = await subscriber.inbox.get()
                if not isinstance(item, WatchBatch):
                    raise item
                yield item
        finally:
            shared.unsubscribe(subscriber)

    async def close(self) -> None:
        """Stop the shared watches, then close the inner store."""
        for shared in self.shared.values():
            task = shared.task
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            shared._reset()
        await self.inner.close()

    # -- everything else goes straight through -------------------------------
    async def get(self, key: str) -> KV | None:
        return await self.inner.get(key)

    async def range(
        self,
        start: str,
        end: str | None = None,
        *,
        limit: int = 0,
        keys_only: bool = False,
        count_only: bool = False,
        revision: int = 0,
        descending: bool = False,
    ) -> RangeResult:
        return await self.inner.range(
            start,
            end,
            limit=limit,
            keys_only=keys_only,
            count_only=count_only,
            revision=revision,
            descending=descending,
        )

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        return await self.inner.txn(compares, success, failure)

    async def grant(self, ttl: int) -> tuple[int, int]:
        return await self.inner.grant(ttl)

    async def keepalive_once(self, lease_id: int, timeout: float) -> int:
        return await self.inner.keepalive_once(lease_id, timeout)

    async def revoke(self, lease_id: int) -> None:
        await self.inner.revoke(lease_id)

    async def server_version(self) -> str:
        return await self.inner.server_version()
