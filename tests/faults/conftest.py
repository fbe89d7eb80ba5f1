"""Fixtures shared by the fault tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.procs import AgentProcess


@pytest.fixture
def agents() -> Iterator[dict[str, AgentProcess]]:
    """Agent processes a test starts, by name; all terminated at teardown
    (``test_scheduler_faults`` has its own, a list)."""
    started: dict[str, AgentProcess] = {}
    yield started
    for agent in started.values():
        agent.terminate()
