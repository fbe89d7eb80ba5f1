"""A session renewed on its own thread survives a main loop that is busy
for longer than the TTL (an overloaded scheduler), and still stops renewing
when closed."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from etcdsched.model.errors import StoreUnavailable
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.lease_renewer import BlockingRenewer
from etcdsched.store.session import Renewer, RenewerFactory, Session

pytestmark = pytest.mark.asyncio(loop_scope="session")
TTL = 2


def connector(etcd_endpoints: list[str]) -> RenewerFactory:
    """The renewal thread's own (blocking) connection to the test etcd."""

    async def connect() -> Renewer:
        return BlockingRenewer(EtcdOptions(endpoints=tuple(etcd_endpoints)))

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


async def test_blocking_renewer_renews_reports_a_gone_lease_and_an_unreachable_etcd(
    store: EtcdStore, etcd_endpoints: list[str]
) -> None:
    renewer = BlockingRenewer(EtcdOptions(endpoints=tuple(etcd_endpoints)))
    lease_id, _ = await store.grant(TTL)
    try:
        assert 0 < await renewer.keepalive_once(lease_id, 2.0) <= TTL
        await store.revoke(lease_id)
        assert await renewer.keepalive_once(lease_id, 2.0) <= 0
    finally:
        await renewer.close()
    nowhere = BlockingRenewer(EtcdOptions(endpoints=("127.0.0.1:1",)))
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await nowhere.keepalive_once(lease_id, 0.5)
    assert time.monotonic() - started < 5, "bounded by the timeout it was given"
    await nowhere.close()


async def test_renewal_failures_are_logged_once_then_summarised(
    store: EtcdStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Renewals against an etcd that refuses connections fail every quarter
    second; the log says so once, and sums the rest up when the session is
    given up (``etcdsched.runtime.ratelimited_log``)."""
    caplog.set_level(logging.WARNING, "etcdsched.store.session")
    session = await Session.open(store, SystemClock(), TTL, renew_store=connector(["127.0.0.1:1"]))
    try:
        await asyncio.wait_for(session.wait_lost(), TTL + 5)
    finally:
        await session.orphan()
    said = [r.getMessage() for r in caplog.records if r.name == "etcdsched.store.session"]
    failed = [line for line in said if "renewal failed" in line]
    assert len(failed) == 2, said  # the first failure, then the summary
    assert "repeated" not in failed[0] and "repeated" in failed[1], failed
    assert any("lost" in line for line in said), said
