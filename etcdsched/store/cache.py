"""A watch-driven in-memory copy of one key prefix.

List the prefix (paged, at one revision), then watch from the next revision.
When the watch start was compacted, or the watch fails, or simply every
``relist_every`` seconds (watches can lag without bound on an unhealthy
cluster), list again and resume. Consumers read :attr:`items` and wait on
:meth:`wait_changed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from etcdsched.model.errors import StoreUnavailable
from etcdsched.runtime.clock import Clock
from etcdsched.store.kv import KV, Compacted, Event, Store, prefix_end

log = logging.getLogger(__name__)
PAGE = 1000
LIST_ATTEMPTS = 3
"""Listings a compaction may overtake in a row before ``list_all`` gives up."""
M = TypeVar("M", bound=BaseModel)


async def list_all(
    store: Store, start: str, end: str, keep: Callable[[str], bool] | None = None
) -> tuple[dict[str, KV], int]:
    """Every key in ``[start, end)`` read page by page at one revision.

    A compaction that passes the pinned revision between two pages starts
    the listing over at a fresh one; a listing that keeps losing that race
    (it takes longer than etcd keeps history) is reported unavailable."""
    for _ in range(LIST_ATTEMPTS):
        with contextlib.suppress(Compacted):
            return await list_at(store, start, end, keep)
    raise StoreUnavailable(f"listing {start!r} outran compaction {LIST_ATTEMPTS} times")


async def list_at(
    store: Store,
    start: str,
    end: str,
    keep: Callable[[str], bool] | None,
    revision: int = 0,
) -> tuple[dict[str, KV], int]:
    """Every key in ``[start, end)`` as of ``revision`` (0: now), page by
    page; raises ``Compacted`` when that revision is gone."""
    items: dict[str, KV] = {}
    first = await store.range(start, end, limit=PAGE, revision=revision)
    revision = revision or first.revision  # a read in the past answers with today's revision
    page = first
    while True:
        for kv in page.kvs:
            if keep is None or keep(kv.key):
                items[kv.key] = kv
        if not page.more or not page.kvs:
            return items, revision
        page = await store.range(page.kvs[-1].key + "\0", end, limit=PAGE, revision=revision)


class ChangeSignal:
    """A version bumped on every change, and a way to wait for the next one.

    A consumer reads :attr:`version` before it looks at what changes and
    waits with it, so a change made while it was busy is never missed (one
    shared set-and-clear event lost such wake-ups when several consumers
    waited on one cache)."""

    def __init__(self) -> None:
        self.version = 0
        self._changed = asyncio.Event()

    async def wait_changed(self, seen: int) -> None:
        """Return once :attr:`version` is no longer ``seen``."""
        while self.version == seen:
            await self._changed.wait()

    def notify(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()


class PrefixCache(ChangeSignal):
    """Keeps ``items`` equal to the keys under ``prefix`` (those ``keep``
    accepts); a change signal that fires after every applied batch."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        prefix: str,
        *,
        relist_every: float = 30.0,
        keep: Callable[[str], bool] | None = None,
        on_event: Callable[[Event], None] | None = None,
        list_end: Callable[[], str] | None = None,
        group_by: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__()
        self._store = store
        self._clock = clock
        self.prefix = prefix
        self.relist_every = relist_every
        self.keep = keep
        self._on_event = on_event
        self._list_end = list_end
        self.items: dict[str, KV] = {}
        self._group_by = group_by
        self._groups: dict[str, dict[str, KV]] = {}
        self.revision = 0
        self.ready = asyncio.Event()
        self.relists = 0
        self.on_put: Callable[[str], None] = lambda key: None
        """Told each key :meth:`put_item` holds anew or again (not the keys a
        whole listing brings: :attr:`relists` counts those)."""
        self.listed_end = prefix
        """Where the last listing ended (``list_end``'s answer, or the prefix's end)."""
        self._decoded: dict[str, tuple[int, BaseModel]] = {}

    def group(self, name: str) -> dict[str, KV]:
        """The items whose ``group_by(key)`` is ``name``, kept up to date with
        ``items``: a consumer asking about one job does not walk every key
        (with thousands of active runs per partition that walk, repeated on
        every firing pass, was most of a scheduler's CPU)."""
        if self._group_by is None:
            raise TypeError(f"cache {self.prefix} was made without group_by")
        return self._groups.get(name, {})

    def decoded(self, model: type[M]) -> list[M]:
        """Every item decoded as ``model`` (one model per cache), each key
        decoded once per revision: recovery walks every active pointer of
        a partition every few seconds, and with a hundred thousand runs
        placed ahead, decoding them all each time was a tenth of the
        scheduler's CPU."""
        fresh: dict[str, tuple[int, BaseModel]] = {}
        values: list[M] = []
        for key, kv in self.items.items():
            value = self.decode_once(kv, model)
            fresh[key] = (kv.mod_revision, value)
            values.append(value)
        self._decoded = fresh
        return values

    def decode_once(self, kv: KV, model: type[M]) -> M:
        """``kv`` (an item) decoded as ``model``, once per revision of its
        key; raises ``CorruptRecord`` as ``KV.decode`` does."""
        revision, cached = self._decoded.get(kv.key, (0, None))
        if revision == kv.mod_revision and isinstance(cached, model):
            return cached
        value = kv.decode(model).value
        self._decoded[kv.key] = (kv.mod_revision, value)
        return value

    def group_names(self) -> Iterable[str]:
        """The names of the non-empty groups (see :meth:`group`)."""
        return self._groups.keys()

    def put_item(self, kv: KV) -> None:
        """Hold ``kv`` (a write this process made, before the watch echoes
        it, or a listed key), keeping the groups in step."""
        self.items[kv.key] = kv
        if self._group_by is not None:
            self._groups.setdefault(self._group_by(kv.key), {})[kv.key] = kv
        self.on_put(kv.key)

    def discard(self, key: str) -> None:
        """Forget ``key`` (deleted, or found changed), groups in step."""
        self.items.pop(key, None)
        self._decoded.pop(key, None)
        if self._group_by is None:
            return
        name = self._group_by(key)
        members = self._groups.get(name)
        if members is not None:
            members.pop(key, None)
            if not members:
                del self._groups[name]

    def _regroup(self) -> None:
        if self._group_by is None:
            return
        self._groups = {}
        for key, kv in self.items.items():
            self._groups.setdefault(self._group_by(key), {})[key] = kv

    async def relist(self) -> None:
        """List again. ``list_end`` bounds the listing (the due index lists
        only up to its horizon, so memory and reads follow the horizon, not
        the number of stored jobs); the watch still covers the whole prefix.

        Changes absorbed by the listing (made while no watch was running)
        are handed to ``on_event`` as synthetic events, so a consumer that
        reacts to events (a worker's assignments) never misses one;
        consumers must tolerate repeats."""
        end = self._list_end() if self._list_end is not None else prefix_end(self.prefix)
        items, revision = await list_all(self._store, self.prefix, end, self.keep)
        previous, self.items, self.revision = self.items, items, revision
        self.listed_end = end
        self._decoded = {k: v for k, v in self._decoded.items() if k in items}
        self._regroup()
        self.relists += 1
        self.ready.set()
        if self._on_event is not None:
            for key, kv in items.items():
                old = previous.get(key)
                if old is None or old.mod_revision != kv.mod_revision:
                    self._on_event(Event("put", kv))
            for key, kv in previous.items():
                if key not in items:
                    self._on_event(Event("delete", kv))
        self.notify()

    def apply(self, event: Event) -> None:
        key = event.kv.key
        if event.kind == "put" and (self.keep is None or self.keep(key)):
            self.put_item(event.kv)
        else:
            self.discard(key)
        self.revision = max(self.revision, event.kv.mod_revision)
        if self._on_event is not None:
            self._on_event(event)

    async def run(self) -> None:
        """List (unless already listed), then follow; forever (cancel to stop)."""
        backoff = 0.1
        while True:
            try:
                if not self.ready.is_set():
                    await self.relist()
                await asyncio.wait_for(self._follow(), timeout=self.relist_every)
                backoff = 0.1
            except TimeoutError:
                self.ready.clear()  # periodic re-list
            except (Compacted, StoreUnavailable) as exc:
                self.ready.clear()
                log.info("cache %s: re-listing after %s", self.prefix, exc)
                await self._clock.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _follow(self) -> None:
        async for batch in self._store.watch(self.prefix, self.revision + 1):
            for event in batch.events:
                self.apply(event)
            self.notify()


Seen = Sequence[tuple[ChangeSignal, int]]
"""Signals (caches) with the version a consumer last looked at."""


def versions(*caches: ChangeSignal) -> list[tuple[ChangeSignal, int]]:
    return [(cache, cache.version) for cache in caches]


async def wait_any_change(seen: Seen, timeout: float, *also: Coroutine[Any, Any, object]) -> None:
    """Return when any cache moved past its seen version, any of ``also``
    completes, or ``timeout`` seconds pass."""
    tasks: list[asyncio.Future[object]] = [
        asyncio.ensure_future(c.wait_changed(v)) for c, v in seen
    ]
    tasks += [asyncio.ensure_future(a) for a in also]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when="FIRST_COMPLETED")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
