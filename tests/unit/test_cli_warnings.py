"""Repeated warnings on the CLI's stderr are printed once, then counted
(issue 29: ``run wait`` against an unreachable API printed one identical
line per retry)."""

from __future__ import annotations

from etcdsched.cli.warnings import RepeatedWarnings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_warning_is_printed_once_then_summarised_per_window() -> None:
    clock, lines = Clock(), []
    warnings = RepeatedWarnings(lines.append, window=30, clock=clock)
    for _ in range(60):  # every half second for 30 s: one line
        warnings.warn("cannot reach the API")
        clock.now += 0.5
    assert lines == ["cannot reach the API"] and warnings.active
    warnings.warn("cannot reach the API")  # the window is over: its summary
    assert lines[1:] == ["cannot reach the API (repeated 59 times in the last 30 s)"]
    for _ in range(4):
        clock.now += 0.5
        warnings.warn("cannot reach the API")
    warnings.clear()  # the API answers: what was not yet said, said
    assert lines[2:] == ["cannot reach the API (repeated 5 times in the last 2 s)"]
    assert not warnings.active
    warnings.warn("cannot reach the API")  # and a new outage is said in full
    assert lines[3:] == ["cannot reach the API"]


def test_another_message_ends_the_run_of_the_first() -> None:
    clock, lines = Clock(), []
    warnings = RepeatedWarnings(lines.append, window=30, clock=clock)
    warnings.warn("a")
    clock.now = 1
    warnings.warn("a")
    warnings.warn("b")
    warnings.clear()  # nothing repeated of "b": nothing more to say
    assert lines == ["a", "a (repeated 1 times in the last 1 s)", "b"]
