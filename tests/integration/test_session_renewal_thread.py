"""A session renewed on its own thread survives a main loop that is busy
for longer than the TTL (an overloaded scheduler), and still stops renewing
when closed."""

from __future__ import annotations

import asyncio
import time

import pytest

from etcdsched.clock import SystemClock
from etcdsched.etcd_store import EtcdOptions, EtcdStore
from etcdsched.session import Session, StoreFactory
from etcdsched.store import Store

pytestmark = pytest.mark.asyncio(loop_scope="session")
TTL = 2


def connector(etcd_endpoints: list[str]) -> StoreFactory:
    """The renewal thread's own connection to the test etcd."""

    async def connect() -> Store:
        return await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd_endpoints)))

    return connect


def busy_loop(seconds: float) -> None:
    """Hold the event loop without yielding, as a CPU-bound burst does."""
    time.sleep(seconds)


async def test_threaded_renewal_survives_a_busy_main_loop(
    store: EtcdStore, etcd_endpoints: list[str]
) -> None:
    threaded = await Session.open(store, SystemClock(), TTL, renew_store=connector(etcd_endpoints))
    in_loop = await Session.open(store, SystemClock(), TTL)
    lost_calls: list[str] = []
    threaded.on_lost(lambda: lost_calls.append("threaded"))
    try:
        busy_loop(TTL + 1.5)
        assert in_loop.lost, "the in-loop renewal could not run: that session is lost"
        assert not threaded.lost, "the renewal thread kept the lease alive"
        assert await store.keepalive_once(threaded.lease_id, 2.0) > 0
    finally:
        await threaded.close()
        await in_loop.orphan()
    assert lost_calls == []


async def test_renewal_thread_stops_with_the_session(
    store: EtcdStore, etcd_endpoints: list[str]
) -> None:
    session = await Session.open(store, SystemClock(), TTL, renew_store=connector(etcd_endpoints))
    await session.orphan()  # stop renewing, do not revoke: the lease must now expire
    await asyncio.sleep(TTL + 1.0)
    assert await store.keepalive_once(session.lease_id, 2.0) <= 0
