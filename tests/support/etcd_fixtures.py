"""Pytest plugin: real etcd servers for the tests.

``etcd_endpoints`` is a single-member etcd started once per session (or the
cluster given with ``--etcd host:port,...``); every test gets its own
``key_prefix`` so tests never see each other's keys. ``etcd_cluster3`` is a
3-member cluster for fail-over tests, started only if a test asks for it;
fault tests that kill or stall members should take ``healthy_cluster3``,
which repairs the cluster before handing it out.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from etcdsched.store.embedded import EtcdTuning, can_skip_fsync
from etcdsched.store.etcd_cluster import EtcdCluster

_TEST_TUNING = EtcdTuning(unsafe_no_fsync=True)
_TMPFS = Path("/dev/shm")
_CLUSTER3_FIXTURES = frozenset({"etcd_cluster3", "healthy_cluster3"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--etcd",
        metavar="HOST:PORT,...",
        default=None,
        help="run against this existing etcd cluster instead of starting one",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Keep the tests' files on tmpfs when the etcd server cannot skip fsync.

    The fixtures ask etcd not to sync (``_TEST_TUNING``): a test needs a
    working etcd, not a durable one. Debian's etcd 3.4 has no
    ``--unsafe-no-fsync``, so on it every commit waits for the disk, and
    timing tests that pass on 3.5 failed in the full suite (ADR 0023).
    Every etcd a test starts (fixtures, ``etcdsched up`` processes, the
    fault harness's fleets) keeps its data under pytest's base temp, so
    putting that on tmpfs is the same trade the flag makes: a sync that
    costs nothing, and data a machine crash would lose.
    """
    if config.option.basetemp or can_skip_fsync() or not _TMPFS.is_dir():
        return
    if not os.access(_TMPFS, os.W_OK):
        return
    base = Path(tempfile.mkdtemp(prefix="etcdsched-tests-", dir=_TMPFS))
    config.option.basetemp = str(base)
    config.add_cleanup(lambda: shutil.rmtree(base, ignore_errors=True))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests that use the 3-member cluster, so ``-m "not cluster"`` skips them."""
    for item in items:
        if _CLUSTER3_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


def _parse_endpoints(option: str) -> list[str]:
    endpoints = [part.strip().removeprefix("http://") for part in option.split(",")]
    return [endpoint for endpoint in endpoints if endpoint]


@pytest.fixture(scope="session")
def etcd_endpoints(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[str]]:
    """``["127.0.0.1:PORT", ...]`` of the session's etcd."""
    option = request.config.getoption("--etcd")
    if option:
        yield _parse_endpoints(option)
        return
    base_dir = tmp_path_factory.mktemp("etcd")
    with EtcdCluster(base_dir, size=1, tuning=_TEST_TUNING) as cluster:
        yield cluster.endpoints


@pytest.fixture(scope="session")
def etcd_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A 3-member cluster of its own (never the ``--etcd`` one: tests kill members)."""
    base_dir = tmp_path_factory.mktemp("etcd3")
    with EtcdCluster(base_dir, size=3, tuning=_TEST_TUNING) as cluster:
        yield cluster


@pytest.fixture
def healthy_cluster3(etcd_cluster3: EtcdCluster) -> EtcdCluster:
    """``etcd_cluster3`` after resuming paused and restarting dead members."""
    etcd_cluster3.heal()
    return etcd_cluster3


@pytest.fixture
def key_prefix() -> str:
    """A fresh namespace such as ``/t-1a2b3c4d/`` for this test's keys."""
    return f"/t-{uuid.uuid4().hex[:8]}/"
