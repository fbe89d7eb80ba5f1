"""Parsing and formatting of human-written durations.

Accepted inputs for :func:`parse_duration`:

* compact unit strings, Go style: ``"250ms"``, ``"30s"``, ``"5m"``, ``"1h30m"``,
  ``"2d"``, ``"1.5h"``; units ``d h m s ms us``, lower case (``"5M"`` would be
  ambiguous with months), any order, each number may have a decimal part;
* ISO 8601 durations with fixed-length parts only: ``"PT5M"``, ``"P1DT2H"``,
  ``"P2W"``, ``"PT0.5S"``; years and months are rejected because their length
  depends on the calendar;
* a number of seconds, as ``int``/``float`` or a numeric string (``"30"``);
* a :class:`~datetime.timedelta`, returned unchanged.

Durations are never negative and are exact to the microsecond (the resolution
of ``timedelta``); anything finer is rejected rather than silently rounded.

:func:`format_duration` writes the compact form (``"1h30m"``, ``"1s500ms"``,
``"0s"``), which :func:`parse_duration` reads back to the same value.
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation

__all__ = ["format_duration", "parse_duration"]

_US_PER = {
    "w": 7 * 86_400_000_000,
    "d": 86_400_000_000,
    "h": 3_600_000_000,
    "m": 60_000_000,
    "s": 1_000_000,
    "ms": 1_000,
    "us": 1,
}
_FORMAT_UNITS = ("d", "h", "m", "s", "ms", "us")

_NUMBER = r"\d+(?:\.\d+)?"
# "ms" and "us" must be tried before "m" and "s".
_COMPACT_PART = re.compile(rf"({_NUMBER})(ms|us|d|h|m|s)")
_COMPACT_FULL = re.compile(rf"(?:{_NUMBER}(?:ms|us|d|h|m|s))+")
_PLAIN_NUMBER = re.compile(_NUMBER)
_ISO = re.compile(
    rf"P(?:(?P<w>{_NUMBER})W)?(?:(?P<d>{_NUMBER})D)?"
    rf"(?:T(?:(?P<h>{_NUMBER})H)?(?:(?P<m>{_NUMBER})M)?(?:(?P<s>{_NUMBER})S)?)?"
)


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """Parse ``value`` into a non-negative :class:`timedelta`.

    Raises :class:`ValueError` with a message quoting the input when it is not
    a duration, is negative, is finer than a microsecond or is too large.
    """
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ValueError(f"duration must not be negative, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(
            f"duration must be a string like '30s' or 'PT5M' or a number of seconds, "
            f"got {type(value).__name__}"
        )
    if isinstance(value, str):
        return _parse_text(value)
    return _from_micros(_seconds_decimal(value) * _US_PER["s"], repr(value))


@functools.lru_cache(maxsize=1024)
def format_duration(td: timedelta) -> str:
    """Write ``td`` in the compact form, largest unit first: ``"1d2h"``, ``"1s500ms"``.

    Zero is ``"0s"``. Raises :class:`ValueError` for negative durations, which
    :func:`parse_duration` would not accept back.
    """
    if td < timedelta(0):
        raise ValueError(f"cannot format a negative duration: {td!r}")
    remaining = td // timedelta(microseconds=1)
    if remaining == 0:
        return "0s"
    parts: list[str] = []
    for unit in _FORMAT_UNITS:
        count, remaining = divmod(remaining, _US_PER[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


@functools.lru_cache(maxsize=1024)
def _parse_text(value: str) -> timedelta:
    text = value.strip()
    if not text:
        raise ValueError("duration must not be empty")
    if _PLAIN_NUMBER.fullmatch(text):
        return _from_micros(Decimal(text) * _US_PER["s"], value)
    if text[0] in "Pp":
        return _parse_iso(text.upper(), value)
    if _COMPACT_FULL.fullmatch(text):
        total = sum(
            (Decimal(number) * _US_PER[unit] for number, unit in _COMPACT_PART.findall(text)),
            Decimal(0),
        )
        return _from_micros(total, value)
    raise ValueError(
        f"invalid duration {value!r}: expected e.g. '30s', '5m', '1h30m', '2d', '250ms', "
        f"an ISO 8601 duration like 'PT5M', or a number of seconds"
    )


def _parse_iso(text: str, original: str) -> timedelta:
    match = _ISO.fullmatch(text)
    if match is None or not any(match.groupdict().values()) or text.endswith("T"):
        date_part = text.partition("T")[0]
        if "Y" in date_part or "M" in date_part:
            raise ValueError(
                f"invalid duration {original!r}: years and months have no fixed length; "
                f"use days or weeks"
            )
        raise ValueError(
            f"invalid ISO 8601 duration {original!r}: expected e.g. 'PT5M', 'P1DT2H', 'P2W'"
        )
    total = Decimal(0)
    for unit, number in match.groupdict().items():
        if number is not None:
            total += Decimal(number) * _US_PER[unit]
    return _from_micros(total, original)


def _seconds_decimal(value: int | float) -> Decimal:
    try:
        seconds = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    except InvalidOperation as exc:  # pragma: no cover - repr of a float is always a number
        raise ValueError(f"invalid duration {value!r}") from exc
    if not seconds.is_finite():
        raise ValueError(f"duration must be finite, got {value!r}")
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {value!r} seconds")
    return seconds


def _from_micros(micros: Decimal, original: object) -> timedelta:
    if micros != micros.to_integral_value():
        raise ValueError(f"duration {original!r} is finer than a microsecond")
    try:
        return timedelta(microseconds=int(micros))
    except OverflowError as exc:
        raise ValueError(f"duration {original!r} is too large") from exc
