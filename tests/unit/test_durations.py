"""Duration parsing and formatting: accepted forms, errors, round trip."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from etcdsched.model.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("2d", timedelta(days=2)),
        ("250ms", timedelta(milliseconds=250)),
        ("1s500ms", timedelta(seconds=1, milliseconds=500)),
        ("1d2h3m4s5ms6us", timedelta(days=1, hours=2, minutes=3, seconds=4, microseconds=5006)),
        ("1.5h", timedelta(minutes=90)),
        ("0.25s", timedelta(milliseconds=250)),
        ("  5m ", timedelta(minutes=5)),
        ("0s", timedelta(0)),
        ("PT5M", timedelta(minutes=5)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("PT1H30M15S", timedelta(hours=1, minutes=30, seconds=15)),
        ("PT0.5S", timedelta(milliseconds=500)),
        ("P2W", timedelta(weeks=2)),
        ("P1D", timedelta(days=1)),
        ("pt5m", timedelta(minutes=5)),
        ("30", timedelta(seconds=30)),
        ("1.5", timedelta(seconds=1.5)),
        (30, timedelta(seconds=30)),
        (0, timedelta(0)),
        (1.5, timedelta(seconds=1, milliseconds=500)),
        (0.1, timedelta(milliseconds=100)),
        (timedelta(minutes=3), timedelta(minutes=3)),
    ],
)
def test_parse_duration_accepts(value: str | int | float | timedelta, expected: timedelta) -> None:
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("abc", "invalid duration 'abc'"),
        ("5x", "invalid duration '5x'"),
        ("5 m", "invalid duration '5 m'"),
        ("5M", "invalid duration '5M'"),
        ("-5s", "invalid duration '-5s'"),
        ("1e3s", "invalid duration '1e3s'"),
        ("P1Y", "years and months have no fixed length"),
        ("P1M", "years and months have no fixed length"),
        ("P1Y2M3DT4H", "years and months have no fixed length"),
        ("P", "invalid ISO 8601 duration 'P'"),
        ("PT", "invalid ISO 8601 duration 'PT'"),
        ("P1DT", "invalid ISO 8601 duration 'P1DT'"),
        ("PT5H3M2H", "invalid ISO 8601 duration"),
        ("0.0000001s", "finer than a microsecond"),
        ("99999999999d", "too large"),
        (-1, "must not be negative"),
        (-0.5, "must not be negative"),
        (float("nan"), "must be finite"),
        (float("inf"), "must be finite"),
        (timedelta(seconds=-1), "must not be negative"),
        (True, "got bool"),
        (None, "got NoneType"),
        ([30], "got list"),
    ],
)
def test_parse_duration_rejects(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_duration(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("td", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=30), "30s"),
        (timedelta(minutes=5), "5m"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(days=2), "2d"),
        (timedelta(weeks=1), "7d"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(seconds=1, milliseconds=500), "1s500ms"),
        (timedelta(microseconds=1), "1us"),
        (timedelta(days=1, seconds=1), "1d1s"),
    ],
)
def test_format_duration(td: timedelta, text: str) -> None:
    assert format_duration(td) == text
    assert parse_duration(text) == td


def test_format_duration_rejects_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_duration(timedelta(seconds=-1))


@given(st.timedeltas(min_value=timedelta(0)))
def test_format_then_parse_round_trips(td: timedelta) -> None:
    assert parse_duration(format_duration(td)) == td


@given(st.integers(min_value=0, max_value=10**12))
def test_integer_seconds_parse_exactly(seconds: int) -> None:
    assert parse_duration(seconds) == timedelta(seconds=seconds)
    assert parse_duration(str(seconds)) == timedelta(seconds=seconds)
