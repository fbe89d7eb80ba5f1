"""assert_eventually / wait_until: retry until truthy, then report the last failure."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from tests.support.eventually import assert_eventually, wait_until

TIMEOUT = 0.2
INTERVAL = 0.01


def _succeeds_on(attempt: int) -> Callable[[], int]:
    """A check that fails (by asserting) until its ``attempt``-th call."""
    calls = itertools.count(1)

    def check() -> int:
        n = next(calls)
        assert n >= attempt, f"attempt {n}"
        return n

    return check


async def test_returns_first_truthy_result() -> None:
    calls = itertools.count(1)
    assert (
        await assert_eventually(
            lambda: next(calls) >= 3 and "done", timeout=TIMEOUT, interval=INTERVAL
        )
        == "done"
    )


async def test_awaits_async_checks() -> None:
    calls = itertools.count(1)

    async def check() -> int:
        n = next(calls)
        assert n >= 2
        return n

    assert await assert_eventually(check, timeout=TIMEOUT, interval=INTERVAL) == 2


async def test_retries_assertion_errors() -> None:
    assert await assert_eventually(_succeeds_on(3), timeout=TIMEOUT, interval=INTERVAL) == 3


async def test_reraises_last_assertion_error_with_message() -> None:
    with pytest.raises(AssertionError, match=r"^run done: attempt \d+"):
        await assert_eventually(
            _succeeds_on(10**6), message="run done", timeout=TIMEOUT, interval=INTERVAL
        )


async def test_falsy_result_times_out_with_message() -> None:
    with pytest.raises(AssertionError, match=r"leader elected: .*last result 0"):
        await assert_eventually(
            lambda: 0, message="leader elected", timeout=TIMEOUT, interval=INTERVAL
        )


async def test_assert_only_check_passes_by_not_raising() -> None:
    assert await assert_eventually(lambda: None, timeout=TIMEOUT, interval=INTERVAL) is None


async def test_other_exceptions_propagate_at_once() -> None:
    calls = itertools.count(1)

    def check() -> bool:
        next(calls)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await assert_eventually(check, timeout=5.0)
    assert next(calls) == 2


def test_wait_until_is_the_sync_twin() -> None:
    assert wait_until(_succeeds_on(2), timeout=TIMEOUT, interval=INTERVAL) == 2
    with pytest.raises(AssertionError, match="never"):
        wait_until(lambda: False, message="never", timeout=TIMEOUT, interval=INTERVAL)


def test_wait_until_rejects_async_checks() -> None:
    async def check() -> bool:
        return True

    with pytest.raises(TypeError, match="assert_eventually"):
        wait_until(check, timeout=TIMEOUT, interval=INTERVAL)  # type: ignore[unused-coroutine]
