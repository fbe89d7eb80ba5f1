"""Read-only transactions are never cancelled on the wire.

etcd 3.5.0-3.5.4 panics when the context of a read-only transaction is
cancelled while the server executes it (etcd-io/etcd#14110); the etcd we
ship is 3.5.1 and the failover benchmark once killed it that way. So a
read-only transaction keeps running when its caller gives up waiting or is
cancelled, and the caller still gets its usual timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from etcdsched.model.errors import StoreUnavailable
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.kv import Ops


@pytest_asyncio.fixture(loop_scope="session")
async def impatient(etcd_endpoints: list[str]) -> AsyncIterator[EtcdStore]:
    store = await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd_endpoints), timeout=0.2))
    try:
        yield store
    finally:
        await store.close()


async def test_a_caller_cancelled_mid_read_leaves_the_request_running(
    impatient: EtcdStore,
) -> None:
    request: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    waiter = asyncio.create_task(impatient._never_cancelled(lambda: request))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not request.cancelled()
    request.set_result("answered")


async def test_a_slow_read_times_out_for_the_caller_only(impatient: EtcdStore) -> None:
    request: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    with pytest.raises(StoreUnavailable, match="did not answer a read"):
        await impatient._never_cancelled(lambda: request)
    assert not request.cancelled()
    request.set_exception(RuntimeError("etcd went away"))  # consumed, not logged as unretrieved
    await asyncio.sleep(0)


async def test_read_only_and_write_transactions_both_work(
    impatient: EtcdStore, key_prefix: str
) -> None:
    key = f"{key_prefix}/read-only"
    await impatient.txn([], [Ops.put(key, b"v")])
    result = await impatient.txn([], [Ops.get(key), Ops.get(key + "/absent")])
    assert result.succeeded
    assert [[kv.value for kv in kvs] for kvs in result.responses] == [[b"v"], []]
