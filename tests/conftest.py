"""Suite-wide fixtures: the etcd plugin and a check for leaked asyncio tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

pytest_plugins = [
    "tests.support.etcd_fixtures",
    "tests.support.store_fixtures",
    "tests.support.services",
    "tests.support.seaweed",
    "tests.support.webhook_receiver",
]

# How long a finished test's tasks get to wind down before they count as leaked.
_SETTLE_CYCLES = 20
_SETTLE_SECONDS = 0.1


def _on_session_loop(item: pytest.Item) -> bool:
    """An async test that runs on the session loop, where the leak check runs."""
    if not pytest_asyncio.is_async_test(item):
        return False
    marker = item.get_closest_marker("asyncio")
    scope = marker.kwargs.get("loop_scope") if marker is not None else None
    default = str(item.config.getini("asyncio_default_test_loop_scope"))
    return (scope or default) == "session"


@pytest.fixture(autouse=True)
def _no_leaked_tasks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail an async test that leaves tasks running after its fixtures are torn down.

    Autouse fixtures are set up before, and so torn down after, the test's
    other function-scoped fixtures; the check therefore sees what the test
    and its fixtures together left behind. Sync tests pay nothing.
    """
    if _on_session_loop(request.node):
        request.getfixturevalue("_leak_check_on_loop")
    yield


async def _still_pending(before: set[asyncio.Task[object]]) -> set[asyncio.Task[object]]:
    current = asyncio.current_task()
    for _ in range(_SETTLE_CYCLES):
        leaked = asyncio.all_tasks() - before - {current}
        if not leaked:
            return set()
        await asyncio.sleep(0)
    await asyncio.wait(leaked, timeout=_SETTLE_SECONDS)
    return {task for task in leaked if not task.done()}


def _describe(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    return f"{task.get_name()} ({getattr(coro, '__qualname__', coro)!s})"


@pytest_asyncio.fixture(loop_scope="session")
async def _leak_check_on_loop() -> AsyncIterator[None]:
    before = asyncio.all_tasks()
    yield
    leaked = await _still_pending(before)
    if leaked:
        names = ", ".join(sorted(_describe(task) for task in leaked))
        for task in leaked:
            task.cancel()  # so the leak does not spill into later tests
        await asyncio.wait(leaked, timeout=1.0)
        pytest.fail(f"test leaked asyncio tasks still pending: {names}", pytrace=False)
