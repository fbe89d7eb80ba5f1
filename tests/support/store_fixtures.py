"""Fixtures that connect an EtcdStore to the session's real etcd."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.keys import Keys


@pytest_asyncio.fixture(loop_scope="session")
async def store(etcd_endpoints: list[str]) -> AsyncIterator[EtcdStore]:
    s = await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd_endpoints)))
    try:
        yield s
    finally:
        await s.close()


@pytest_asyncio.fixture(loop_scope="session")
async def keys(key_prefix: str) -> Keys:
    return Keys(key_prefix)
