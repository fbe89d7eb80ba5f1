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
window it newly covers, at the very revision the copy holds: while that
read runs, watch events wait (the watch stream buffers them), so the
window as listed and the events that follow fit together exactly. A whole
listing still happens every ``relist_every`` seconds and after any watch
failure, as the plain cache does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from etcdsched.model.errors import StoreUnavailable
from etcdsched.runtime.clock import Clock
from etcdsched.store.cache import PrefixCache, list_at
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
        self._applying = asyncio.Lock()
        """Held while a watch batch is applied and while a window is listed
        and merged: a window read at the held revision must not interleave
        with events past it."""

    async def extend(self) -> None:
        """Move the horizon: list the keys between the old end and the new
        one as of the revision held, and hold them. Every event up to that
        revision has been applied and none after, so no key can be missed
        or held stale; the keys of the window already held (from events
        that arrived after ``keep`` widened, in an extension cut short) are
        in the listing too, as of the same revision."""
        assert self._list_end is not None  # set by the constructor
        async with self._applying:
            start, end = self.listed_end, self._list_end()
            if end <= start:
                return
            window, _ = await list_at(self._store, start, end, self.keep, self.revision)
            for kv in window.values():
                self.put_item(kv)
                if self._on_event is not None:
                    self._on_event(Event("put", kv))
            self.listed_end = end
            self.extensions += 1
        if window:
            self.notify()

    async def run(self) -> None:
        """List, then follow and extend; list whole again every
        ``relist_every`` seconds or after a failure; forever."""
        backoff = 0.1
        while True:
            try:
                await self.relist()
                await self._follow_and_extend()
                backoff = 0.1
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
            self.notify()
