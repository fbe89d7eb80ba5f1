"""A session: one lease, kept alive in the background, with a "lost" signal.

Like etcd's ``concurrency.Session``. The lease may expire on the server no
earlier than ``send time of the last successful renewal + TTL``; the session
declares itself lost a safety margin *before* that instant, measured on the
monotonic clock, so a process that cannot renew stops acting for its lease
while the lease still protects it. A lost session never comes back: open a
new one.

``close()`` revokes the lease (keys vanish now); ``orphan()`` stops renewing
and lets the lease expire on its own (what a crash looks like).

With ``renew_store`` the renewals run on a thread of their own, with their
own event loop and (blocking) etcd connection: a main loop that is busy for seconds (a
scheduler overloaded by a burst) then does not starve its lease into
expiry, which would cost it every partition and a full re-list, and make the
overload worse. A process that is stopped or dead stops that thread too, so
the lease still expires exactly when the process cannot act; a process
whose main loop is wedged for good says so through ``alive`` and its
lease is let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol

from etcdsched.model.errors import EtcdschedError, OwnershipLost, StoreRejected
from etcdsched.runtime.clock import Clock
from etcdsched.runtime.ratelimited_log import RateLimitedLog
from etcdsched.store.kv import Store

log = logging.getLogger(__name__)
MIN_TTL = 2


class Renewer(Protocol):
    """What renews a lease: a :class:`Store`, or the renewal thread's
    :class:`~etcdsched.store.lease_renewer.BlockingRenewer`."""

    async def keepalive_once(self, lease_id: int, timeout: float) -> int: ...

    async def close(self) -> None: ...


RenewerFactory = Callable[[], Awaitable[Renewer]]


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
        self._lost_flag = False  # read by the renewal thread too
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._callbacks: list[Callable[[], None]] = []
        self._alive: Callable[[], bool] | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: _RenewalThread | None = None
        self._closed = False
        self.warnings = RateLimitedLog(log, clock.monotonic)
        """Renewal failures repeat every quarter second while etcd is away:
        the first is logged, the rest counted into a line every 30 s."""

    @classmethod
    async def open(
        cls,
        store: Store,
        clock: Clock,
        ttl: int = 5,
        margin: float | None = None,
        renew_store: RenewerFactory | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> Session:
        """Grant a lease and start renewing it. ``margin`` defaults to a
        quarter of the TTL (at least 0.5 s). ``renew_store`` connects the
        renewal thread's own store (see the module docstring); needs a real clock.
        ``alive`` (called on the renewal thread) says whether the process
        still works: while it says no, the lease is not renewed, so a
        process whose event loop is wedged for good gives its lease up
        instead of holding its work hostage behind a live renewal thread."""
        ttl = max(MIN_TTL, ttl)
        sent = clock.monotonic()
        lease_id, granted = await store.grant(ttl)
        session = cls(store, clock, lease_id, granted, margin or max(0.5, granted / 4))
        session._safe_until = sent + granted - session.margin
        session.last_renewal_sent = sent
        session._alive = alive
        if renew_store is None:
            session._task = asyncio.create_task(
                session._keepalive(store), name=f"session-{lease_id:x}"
            )
        else:
            session._thread = _RenewalThread(session, renew_store)
        return session

    @property
    def safe_until(self) -> float:
        """Monotonic instant until which the lease surely still holds (minus margin)."""
        return self._safe_until

    @property
    def lost(self) -> bool:
        """True once renewals failed long enough that the lease may expire."""
        if not self._lost_flag and self._clock.monotonic() >= self._safe_until:
            self._declare_lost("no renewal within the TTL")
        return self._lost_flag

    def holds(self) -> bool:
        """False once this session can no longer be trusted. Safe from any thread."""
        return not (self.lost or self._closed)

    def check(self) -> None:
        """Raise :class:`OwnershipLost` if this session can no longer be trusted."""
        if not self.holds():
            raise OwnershipLost(f"session {self.lease_id:x} is lost")

    async def wait_lost(self) -> None:
        await self._lost.wait()

    def on_lost(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    async def _keepalive(self, store: Renewer) -> None:
        interval = self.ttl / 3
        next_renewal = self._clock.monotonic() + interval
        withheld = False  # a renewal is being withheld (``alive`` says no): said once
        while not self.lost:
            now = self._clock.monotonic()
            await self._clock.sleep(max(0.0, min(next_renewal, self._safe_until) - now))
            if self.lost:
                return
            sent = self._clock.monotonic()
            if self._alive is not None and not self._alive():
                if not withheld:
                    log.error("session %x: not renewing: the process does not work", self.lease_id)
                withheld, next_renewal = True, 0.0  # renew at once if it works again
                await self._clock.sleep(min(0.25, interval))
                continue
            withheld = False
            # a renewal that lands before safe_until is still useful: give it that long
            timeout = max(0.1, self._safe_until - sent)
            try:
                remaining = await store.keepalive_once(self.lease_id, timeout)
            except EtcdschedError as exc:
                why = f"renewal failed: {type(exc).__name__}"
                self.warnings.log(why, "session %x: renewal failed: %s", self.lease_id, exc)
                next_renewal = self._clock.monotonic() + min(0.25, interval)
                continue
            self.warnings.flush()
            if remaining <= 0:
                self._declare_lost("lease expired on the server")
                return
            self._safe_until = max(self._safe_until, sent + remaining - self.margin)
            self.last_renewal_sent = sent
            next_renewal = sent + interval

    def _declare_lost(self, why: str) -> None:
        if self._lost_flag:
            return
        self._lost_flag = True
        self.warnings.flush()  # the failures that led here are counted before the verdict
        log.warning("session %x lost: %s", self.lease_id, why)
        if threading.get_ident() == self._loop_thread:
            self._run_lost_callbacks()
        else:  # from the renewal thread: the event and callbacks belong to the main loop
            self._loop.call_soon_threadsafe(self._run_lost_callbacks)

    def _run_lost_callbacks(self) -> None:
        self._lost.set()
        for callback in self._callbacks:
            try:
                callback()
            except Exception:  # a callback must not stop the others
                log.exception("session lost callback failed")

    async def _stop(self) -> None:
        self._closed = True
        if self._thread is not None:
            await self._thread.stop()
            self._thread = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def close(self) -> None:
        """Stop renewing and revoke: every key bound to the lease goes now.
        Once closed or orphaned, a session is done: closing it again is a no-op."""
        if self._closed:
            return
        await self._stop()
        try:
            await self._store.revoke(self.lease_id)
        except StoreRejected:  # "lease not found": it expired already, nothing to revoke
            log.info("session %x: lease already gone at close", self.lease_id)

    async def orphan(self) -> None:
        """Stop renewing without revoking: keys stay until the TTL runs out."""
        await self._stop()


class _RenewalThread:
    """Runs ``session._keepalive`` on a daemon thread with its own event loop
    and its own connection: a :class:`~etcdsched.store.lease_renewer.BlockingRenewer`,
    whose blocking gRPC channel keeps this loop off ``grpc.aio``'s shared
    poller (see that module for what a second aio connection cost)."""

    def __init__(self, session: Session, connect: RenewerFactory) -> None:
        self._session = session
        self._connect = connect
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(
            target=self._main, name=f"session-{session.lease_id:x}", daemon=True
        )
        self._thread.start()

    def _main(self) -> None:
        asyncio.run(self._renew())

    async def _renew(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._started.set()
        store = None
        try:
            store = await self._connected()
            if store is not None:
                await self._session._keepalive(store)
        except asyncio.CancelledError:
            pass
        except Exception:  # the session then expires as lost: say why
            log.exception("session %x: renewal thread failed", self._session.lease_id)
        finally:
            if store is not None:
                with contextlib.suppress(Exception):
                    await store.close()

    async def _connected(self) -> Renewer | None:
        """Connect, retrying while the session can still be saved (etcd may
        be failing over just now); None once it is lost anyway."""
        while not self._session.lost:
            try:
                return await self._connect()
            except EtcdschedError as exc:
                lease = self._session.lease_id
                why = f"renewal connection failed: {type(exc).__name__}"
                self._session.warnings.log(
                    why, "session %x: renewal connection failed: %s", lease, exc
                )
                await asyncio.sleep(0.2)
        return None

    async def stop(self) -> None:
        await asyncio.to_thread(self._started.wait, 5.0)
        if self._loop is not None and self._task is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self._loop.call_soon_threadsafe(self._task.cancel)
        await asyncio.to_thread(self._thread.join, 10.0)
