"""A watched copy of a prefix held only up to a moving horizon, which is
moved by listing just the keys it newly covers (issue 28, ADR 0025).

The due index is watched whole but held only up to the horizon (slots due
within a minute): memory follows the horizon, not the number of jobs. It
used to move the horizon by listing the whole held range again every half
horizon. With a million jobs due at midnight inside the horizon, every
such listing read a gigabyte from etcd (ranges of 350-500 ms there) and
rebuilt a million objects in the scheduler, and the lead of a herd could
reach only half the horizon (what was surely listed).

Here the horizon moves every ``extend_every`` seconds by reading only the
window it newly covers, as of etcd's current revision ``L``, while watch
batches wait (the watch stream buffers them). Events of that window up to
``L`` that are still buffered are already in the listing: they are skipped
(the window's *floor*), so the copy never shows a key older than it was
listed. A read pinned to the revision the copy holds would need no floor,
but that revision moves only when the partition changes: a quiet
partition's is compacted away within seconds (``COMPACT_EVERY``). A whole
listing still happens every ``relist_every`` seconds and after any watch
failure, as the plain cache does.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable

from etcdsched.model.errors import StoreUnavailable
from etcdsched.runtime.clock import Clock
from etcdsched.store.cache import PrefixCache, list_all
from etcdsched.store.kv import Compacted, Event, Store

log = logging.getLogger(__name__)


class HorizonCache(PrefixCache):
    """A :class:`PrefixCache` whose ``list_end`` (the horizon) is moved
    forward by listing the new window only (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        prefix: str,
        *,
        horizon_end: Callable[[], str],
        keep: Callable[[str], bool],
        extend_every: float,
        relist_every: float,
        group_by: Callable[[str], str] | None = None,
    ) -> None:
        """``horizon_end()`` moves the horizon and returns the exclusive end
        key of what is held; ``keep(key)`` says whether a key is within it
        (it must accept every key below the last ``horizon_end()``)."""
        super().__init__(
            store,
            clock,
            prefix,
            relist_every=relist_every,
            keep=keep,
            list_end=horizon_end,
            group_by=group_by,
        )
        self.extend_every = extend_every
        self.extensions = 0
        self._floors: list[tuple[str, str, int]] = []
        """Windows listed ahead of the watch: (start, end, revision listed)."""
        self._applying = asyncio.Lock()
        """Held while a watch batch is applied and while a window is listed
        and merged: a window read at the held revision must not interleave
        with events past it."""

    async def extend(self) -> None:
        """Move the horizon: list the keys between the old end and the new
        one as they are now (revision ``L``) and hold them. ``keep``
        refused the window's keys until now, so what the watch applied
        before says nothing of them; its events up to ``L`` still to come
        are in the listing already and are skipped (:meth:`apply`)."""
        assert self._list_end is not None  # set by the constructor
        async with self._applying:
            start, end = self.listed_end, self._list_end()
            if end <= start:
                return
            window, listed_at = await list_all(self._store, start, end, self.keep)
            for kv in window.values():
                self.put_item(kv)
                if self._on_event is not None:
                    self._on_event(Event("put", kv))
            if listed_at > self.revision:
                self._floors.append((start, end, listed_at))
            self.listed_end = end
            self.extensions += 1
        if window:
            self.notify()

    def apply(self, event: Event) -> None:
        """Apply a watch event, unless it is of a window listed after it."""
        kv = event.kv
        # the windows are disjoint and listed in key order: one bisect finds it
        at = bisect.bisect_right(self._floors, kv.key, key=lambda floor: floor[0]) - 1
        if at >= 0:
            _, end, listed_at = self._floors[at]
            if kv.key < end and kv.mod_revision <= listed_at:
                self.revision = max(self.revision, kv.mod_revision)
                return
        super().apply(event)

    async def relist(self) -> None:
        self._floors.clear()
        await super().relist()

    async def run(self) -> None:
        """List, then follow and extend; list whole again every
        ``relist_every`` seconds or after a failure; forever."""
        backoff = 0.1
        while True:
            try:
                await self.relist()
                backoff = 0.1
                await self._follow_and_extend()
            except (Compacted, StoreUnavailable) as exc:
                log.info("cache %s: re-listing after %s", self.prefix, exc)
                await self._clock.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _follow_and_extend(self) -> None:
        """Follow the watch and extend the horizon every ``extend_every``
        seconds until a whole listing is due; a failure of either ends it."""
        follow = asyncio.create_task(self._follow(), name=f"follow {self.prefix}")
        try:
            relist_at = self._clock.monotonic() + self.relist_every
            while self._clock.monotonic() < relist_at:
                await asyncio.wait([follow], timeout=self.extend_every)
                if follow.done():
                    follow.result()  # raises what ended the watch
                    return
                await self.extend()
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)

    async def _follow(self) -> None:
        async for batch in self._store.watch(self.prefix, self.revision + 1):
            async with self._applying:
                for event in batch.events:
                    self.apply(event)
                self._floors = [f for f in self._floors if f[2] > self.revision]
            self.notify()
