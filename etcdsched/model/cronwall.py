"""Cron schedules evaluated on local wall-clock time, mapped to UTC instants.

We do not use croniter's own time-zone handling. croniter iterates here over
*naive* datetimes, where it does plain calendar arithmetic and knows nothing of
DST; every wall time it yields is then mapped to instants with :mod:`zoneinfo`:

* a wall time is **nonexistent** (spring-forward gap) when local -> UTC -> local
  does not give the same wall time back;
* it is **ambiguous** (autumn fold) when ``fold=0`` and ``fold=1`` give
  different UTC offsets; ``fold=0`` is the earlier instant.

The DST policy then decides: gap ``skip`` drops the wall time, gap ``shift``
moves it to the transition instant (the first instant after the gap, i.e. when
the clock resumes at the gap's end, 03:00 in Berlin on spring-forward day);
fold ``first``/``last``/``both`` keep the earlier, the later or both instants.

Ordering: for a fixed fold choice the mapping wall time -> instant never goes
backwards, so the "first" and "last" mappings are each ascending streams;
"both" merges the two and drops duplicates (an unambiguous wall time is in
both, and all gap times of one gap shift onto the same instant).
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

__all__ = [
    "CRON_MACROS",
    "FoldPolicy",
    "GapPolicy",
    "cron_instants",
    "load_zone",
    "ms_to_utc",
    "normalize_cron_expr",
    "utc_to_ms",
]

GapPolicy = Literal["skip", "shift"]
FoldPolicy = Literal["first", "last", "both"]

CRON_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_SECOND = timedelta(seconds=1)
# UTC offsets span -12:00..+14:00, so no offset change exceeds 26 h; sampling
# every 30 min over that window finds any fold ahead (see _start_wall).
_LOOKAHEAD_STEP_MS = 30 * 60 * 1000
_LOOKAHEAD_STEPS = 52
# croniter's "R" field (random) would give every process a different schedule.
_RANDOM_FIELD = re.compile(r"(?:^|[^a-z])r(?:[^a-z]|$)")
_IANA_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(?:/[A-Za-z0-9_+\-]+)*")


def ms_to_utc(ms: int) -> datetime:
    """Epoch milliseconds -> aware UTC datetime (raises OverflowError out of range)."""
    return _EPOCH + timedelta(milliseconds=ms)


def utc_to_ms(dt: datetime) -> int:
    """Aware datetime -> epoch milliseconds, rounding down sub-millisecond parts."""
    return (dt.astimezone(UTC) - _EPOCH) // _MS


def normalize_cron_expr(expr: str) -> str:
    """Validate a cron expression and return it with whitespace collapsed.

    Accepts 5 fields (minute hour day-of-month month day-of-week), 6 fields
    whose **first** field is seconds (Quartz/Spring order), or one of
    :data:`CRON_MACROS`. Raises :class:`ValueError` naming the ``expr`` field.
    """
    text = " ".join(expr.split())
    if text.startswith("@"):
        return _normalize_macro(text)
    fields = text.split(" ") if text else []
    if len(fields) not in (5, 6):
        raise ValueError(
            f"expr {expr!r} has {len(fields)} fields; expected 5 "
            f"(minute hour day-of-month month day-of-week), 6 with seconds first, "
            f"or a macro such as @daily"
        )
    if _RANDOM_FIELD.search(text.lower()):
        raise ValueError(f"expr {expr!r} uses a random field (R), which is not deterministic")
    if not croniter.is_valid(text, second_at_beginning=len(fields) == 6, strict=True):
        raise ValueError(f"expr {expr!r} is not a valid cron expression")
    return text


def _normalize_macro(text: str) -> str:
    macro = text.lower()
    if macro == "@reboot":
        raise ValueError("expr '@reboot' is not supported: use a trigger of kind 'now'")
    if macro not in CRON_MACROS:
        raise ValueError(f"expr {text!r} is not a known macro; expected one of {CRON_MACROS}")
    return macro


@lru_cache(maxsize=512)
def load_zone(name: str) -> ZoneInfo:
    """Load an IANA time zone by key, raising :class:`ValueError` naming ``tz``."""
    if not _IANA_KEY.fullmatch(name) or name in ("localtime", "posixrules"):
        raise ValueError(f"tz {name!r} is not an IANA time zone name such as 'Europe/Berlin'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"tz {name!r} is not a known IANA time zone") from exc


def cron_instants(
    expr: str, zone: ZoneInfo, gap: GapPolicy, fold: FoldPolicy, after_ms: int
) -> Iterator[int]:
    """Yield the instants of ``expr`` in ``zone`` strictly after ``after_ms``.

    Ascending, without duplicates, unbounded: the caller stops iterating (by
    limit or upper bound). Ends when croniter finds no further match or the
    calendar runs out (year 9999).
    """
    try:
        start = _start_wall(zone, fold, after_ms)
    except OverflowError:
        return iter(())
    pairs = _instant_pairs(expr, zone, gap, start)
    stream: Iterable[int]
    if fold == "first":
        stream = (early for early, _ in pairs)
    elif fold == "last":
        stream = (late for _, late in pairs)
    else:
        for_early, for_late = itertools.tee(pairs)
        stream = heapq.merge((early for early, _ in for_early), (late for _, late in for_late))
    return _distinct_after(stream, after_ms)


def _distinct_after(stream: Iterable[int], after_ms: int) -> Iterator[int]:
    previous: int | None = None
    for instant in stream:
        if instant > after_ms and instant != previous:
            previous = instant
            yield instant


def _offset(zone: ZoneInfo, ms: int) -> timedelta:
    return ms_to_utc(ms).astimezone(zone).utcoffset() or timedelta(0)


def _local_wall(zone: ZoneInfo, ms: int) -> datetime:
    return ms_to_utc(ms).astimezone(zone).replace(tzinfo=None)


def _start_wall(zone: ZoneInfo, fold: FoldPolicy, after_ms: int) -> datetime:
    """Wall time to start croniter from so that no instant > ``after_ms`` is missed.

    For ``first`` that is local(after): the earliest instant of any earlier wall
    time is not later than ``after_ms``. With ``last``/``both``, a wall time
    earlier than local(after) still maps to a later instant when a fold lies
    ahead (the clock is set back), by at most the drop in UTC offset, so we
    step back by that drop. Minus one second because croniter returns matches
    strictly after its start; instants <= ``after_ms`` are filtered out later.
    """
    margin = timedelta(0)
    if fold != "first":
        lowest = min(
            _offset(zone, after_ms + step * _LOOKAHEAD_STEP_MS)
            for step in range(1, _LOOKAHEAD_STEPS + 1)
        )
        margin = max(margin, _offset(zone, after_ms) - lowest)
    return (_local_wall(zone, after_ms) - margin).replace(microsecond=0) - _SECOND


def _transition_ms(zone: ZoneInfo, lo_ms: int, hi_ms: int) -> int:
    """First instant in (lo_ms, hi_ms] whose UTC offset differs from lo_ms's."""
    before = _offset(zone, lo_ms)
    while hi_ms - lo_ms > 1:
        mid = (lo_ms + hi_ms) // 2
        if _offset(zone, mid) == before:
            lo_ms = mid
        else:
            hi_ms = mid
    return hi_ms


def _next_wall(it: croniter) -> datetime | None:
    try:
        wall: datetime = it.get_next(datetime)
    except (CroniterBadDateError, OverflowError, ValueError):
        return None
    return wall


def _instant_pairs(
    expr: str, zone: ZoneInfo, gap: GapPolicy, start: datetime
) -> Iterator[tuple[int, int]]:
    """Yield (first, last) instants per wall time; equal unless the wall time is in a fold.

    A wall time in a gap yields (T, T) for ``shift`` and nothing for ``skip``,
    where T is the transition instant; croniter then resumes at the gap's end,
    so a per-second cron does not walk through every nonexistent second.
    """
    it = croniter(expr, start, second_at_beginning=len(expr.split()) == 6)
    while (wall := _next_wall(it)) is not None:
        try:
            early = utc_to_ms(wall.replace(tzinfo=zone, fold=0))
            late = utc_to_ms(wall.replace(tzinfo=zone, fold=1))
            exists = _local_wall(zone, early) == wall
        except OverflowError:
            return
        if exists:
            # Distinct offsets for fold=0/1 mean an ambiguous wall time; fold=0 is earlier.
            yield min(early, late), max(early, late)
            continue
        transition = _transition_ms(zone, min(early, late), max(early, late))
        if gap == "shift":
            yield transition, transition
        gap_end = _local_wall(zone, transition).replace(microsecond=0) - _SECOND
        it.set_current(max(gap_end, wall), force=True)
