"""A session: one lease, kept alive in the background, with a "lost" signal.

Like etcd's ``concurrency.Session``. The lease may expire on the server no
earlier than ``send time of the last successful renewal + TTL``; the session
declares itself lost a safety margin *before* that instant, measured on the
monotonic clock, so a process that cannot renew stops acting for its lease
while the lease still protects it. A lost session never comes back: open a
new one.

``close()`` revokes the lease (keys vanish now); ``orphan()`` stops renewing
and lets the lease expire on its own (what a crash looks like).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from etcdsched.clock import Clock
from etcdsched.errors import EtcdschedError, OwnershipLost
from etcdsched.store import Store

log = logging.getLogger(__name__)
MIN_TTL = 2


class Session:
    def __init__(self, store: Store, clock: Clock, lease_id: int, ttl: int, margin: float) -> None:
        self._store = store
        self._clock = clock
        self.lease_id = lease_id
        self.ttl = ttl
        self.margin = margin
        self._safe_until = 0.0
        self.last_renewal_sent = 0.0
        self._lost = asyncio.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(
        cls, store: Store, clock: Clock, ttl: int = 5, margin: float | None = None
    ) -> Session:
        """Grant a lease and start renewing it. ``margin`` defaults to a
        quarter of the TTL (at least 0.5 s)."""
        ttl = max(MIN_TTL, ttl)
        sent = clock.monotonic()
        lease_id, granted = await store.grant(ttl)
        session = cls(store, clock, lease_id, granted, margin or max(0.5, granted / 4))
        session._safe_until = sent + granted - session.margin
        session.last_renewal_sent = sent
        session._task = asyncio.create_task(session._keepalive(), name=f"session-{lease_id:x}")
        return session

    @property
    def safe_until(self) -> float:
        """Monotonic instant until which the lease surely still holds (minus margin)."""
        return self._safe_until

    @property
    def lost(self) -> bool:
        """True once renewals failed long enough that the lease may expire."""
        if not self._lost.is_set() and self._clock.monotonic() >= self._safe_until:
            self._declare_lost("no renewal within the TTL")
        return self._lost.is_set()

    def check(self) -> None:
        """Raise :class:`OwnershipLost` if this session can no longer be trusted."""
        if self.lost or self._closed:
            raise OwnershipLost(f"session {self.lease_id:x} is lost")

    async def wait_lost(self) -> None:
        await self._lost.wait()

    def on_lost(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    async def _keepalive(self) -> None:
        interval = self.ttl / 3
        next_renewal = self._clock.monotonic() + interval
        while not self.lost:
            now = self._clock.monotonic()
            await self._clock.sleep(max(0.0, min(next_renewal, self._safe_until) - now))
            if self.lost:
                return
            sent = self._clock.monotonic()
            # a renewal that lands before safe_until is still useful: give it that long
            timeout = max(0.1, self._safe_until - sent)
            try:
                remaining = await self._store.keepalive_once(self.lease_id, timeout)
            except EtcdschedError as exc:
                log.warning("session %x: renewal failed: %s", self.lease_id, exc)
                next_renewal = self._clock.monotonic() + min(0.25, interval)
                continue
            if remaining <= 0:
                self._declare_lost("lease expired on the server")
                return
            self._safe_until = max(self._safe_until, sent + remaining - self.margin)
            self.last_renewal_sent = sent
            next_renewal = sent + interval

    def _declare_lost(self, why: str) -> None:
        if self._lost.is_set():
            return
        log.warning("session %x lost: %s", self.lease_id, why)
        self._lost.set()
        for callback in self._callbacks:
            try:
                callback()
            except Exception:  # a callback must not stop the others
                log.exception("session lost callback failed")

    async def _stop(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def close(self) -> None:
        """Stop renewing and revoke: every key bound to the lease goes now."""
        await self._stop()
        await self._store.revoke(self.lease_id)

    async def orphan(self) -> None:
        """Stop renewing without revoking: keys stay until the TTL runs out."""
        await self._stop()
