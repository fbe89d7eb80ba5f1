"""``etcdsched.runtime.ratelimited_log``: a repeating warning is written once,
then summarised every 30 s; a different warning or a flush writes the
pending summary at once."""

from __future__ import annotations

import logging

import pytest

from etcdsched.runtime.ratelimited_log import RateLimitedLog

LOGGER = "tests.ratelimited"


class Ticks:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ticks() -> Ticks:
    return Ticks()


@pytest.fixture
def limited(ticks: Ticks) -> RateLimitedLog:
    return RateLimitedLog(logging.getLogger(LOGGER), ticks)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_the_first_warning_is_written_and_repeats_are_counted(
    limited: RateLimitedLog, ticks: Ticks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    for _ in range(120):  # a quarter second apart, for 30 s
        limited.log("renewal", "renewal failed: %s", "etcd unavailable")
        ticks.now += 0.25
    assert lines(caplog) == ["renewal failed: etcd unavailable"]
    assert caplog.records[0].levelno == logging.WARNING

    limited.log("renewal", "renewal failed: %s", "etcd unavailable")  # the window is over
    assert lines(caplog)[1:] == [
        "renewal failed: etcd unavailable (repeated 119 times in the last 30 s)"
    ]


def test_the_key_decides_what_is_identical_not_the_text(
    limited: RateLimitedLog, ticks: Ticks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    for attempt in range(3):
        limited.log("renewal", "renewal failed: attempt %d", attempt)
        ticks.now += 1
    assert lines(caplog) == ["renewal failed: attempt 0"]


def test_another_warning_writes_the_pending_summary_first(
    limited: RateLimitedLog, ticks: Ticks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    limited.log("a", "a failed")
    ticks.now += 1
    limited.log("a", "a failed")
    ticks.now += 1
    limited.log("b", "b failed")
    assert lines(caplog) == ["a failed", "a failed (repeated 1 times in the last 1 s)", "b failed"]


def test_flush_writes_the_summary_and_the_next_occurrence_is_written_again(
    limited: RateLimitedLog, ticks: Ticks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    limited.log("a", "a failed")
    limited.flush()  # no repeats: nothing to summarise
    limited.log("a", "a failed")
    ticks.now += 2
    limited.log("a", "a failed")
    limited.flush()
    limited.flush()
    limited.log("a", "a failed")
    assert lines(caplog) == [
        "a failed",
        "a failed",
        "a failed (repeated 1 times in the last 2 s)",
        "a failed",
    ]


def test_a_warning_that_stopped_for_a_window_is_written_in_full_again(
    limited: RateLimitedLog, ticks: Ticks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    limited.log("a", "a failed")
    ticks.now += 5
    limited.log("a", "a failed")
    ticks.now += 300  # quiet for five minutes
    limited.log("a", "a failed")
    assert lines(caplog) == [
        "a failed",
        "a failed (repeated 1 times in the last 5 s)",
        "a failed",
    ]
