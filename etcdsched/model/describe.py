"""Schedules in words, and the next slots with their DST marks, for people.

The dashboard shows each job's trigger as a sentence ("every day at 03:00
Europe/Berlin") and lists its upcoming slots. Both come from here, pure
functions of the trigger: the slots are those of
:func:`etcdsched.model.triggers.slots_between`, the very code firing uses,
so what the page lists is what will fire. A slot is *marked* when DST
touches it: its wall time did not exist (a spring-forward gap; ``gap``
``shift`` moved it to the end of the gap) or occurs twice (an autumn
fold), or the zone's UTC offset changed since the slot before it (with
gap ``skip`` that is where a slot went missing).

Anything this module does not know how to say in words falls back to the
exact text (``cron '17 */3 1-7 * 1' in UTC``): a wrong sentence would be
worse than a terse one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from croniter import croniter

from etcdsched.model.cronwall import load_zone, ms_to_utc
from etcdsched.model.triggers import (
    LAST_INSTANT,
    AfterTrigger,
    AtTrigger,
    CronTrigger,
    IntervalTrigger,
    NowTrigger,
    Trigger,
    slots_between,
)

__all__ = ["UpcomingSlot", "describe_schedule", "upcoming_slots"]

_DAY_NAMES = {
    "0": "Sunday",
    "1": "Monday",
    "2": "Tuesday",
    "3": "Wednesday",
    "4": "Thursday",
    "5": "Friday",
    "6": "Saturday",
    "7": "Sunday",
    "sun": "Sunday",
    "mon": "Monday",
    "tue": "Tuesday",
    "wed": "Wednesday",
    "thu": "Thursday",
    "fri": "Friday",
    "sat": "Saturday",
}
_DAY_RANGES = {"1-5": "weekday (Monday to Friday)", "mon-fri": "weekday (Monday to Friday)"}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_UNITS = (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000), ("second", 1000))
_LAST_MS = int((LAST_INSTANT - ms_to_utc(0)) / timedelta(milliseconds=1))


def describe_schedule(trigger: Trigger) -> str:
    """The trigger as a sentence, with its bounds: "every day at 03:00
    Europe/Berlin", "every 5 minutes", "once at 2026-12-02 10:00 UTC",
    "after extract succeeds (at most 3 runs)"."""
    if isinstance(trigger, NowTrigger):
        text = "once, when created"
    elif isinstance(trigger, AtTrigger):
        text = f"once at {_utc_text(trigger.at_ms)}"
    elif isinstance(trigger, IntervalTrigger):
        text = f"every {_span(trigger.every_ms)}"
        if trigger.start is not None:
            text += f" from {_utc_text(trigger.base_ms(0))}"
    elif isinstance(trigger, AfterTrigger):
        text = _after_text(trigger)
    else:
        text = describe_cron(trigger.expr, trigger.tz)
    bounds = []
    if trigger.start_at_ms is not None:
        bounds.append(f"from {_utc_text(trigger.start_at_ms)}")
    if trigger.end_at_ms is not None:
        bounds.append(f"until {_utc_text(trigger.end_at_ms)}")
    if trigger.max_runs is not None:
        bounds.append(f"at most {_count(trigger.max_runs, 'run')}")
    return f"{text} ({', '.join(bounds)})" if bounds else text


def describe_cron(expr: str, tz: str) -> str:
    """A cron expression in words where its shape is a common one, else
    the expression itself with its zone."""
    fields = _MACROS.get(expr, expr).split()
    if len(fields) == 6:
        seconds, fields = fields[0], fields[1:]
        if seconds.startswith("*/") and fields == ["*"] * 5:
            return f"every {_count(int(seconds[2:]), 'second')}"
        if seconds != "0":
            return f"cron {expr!r} in {tz}"
    if len(fields) != 5:
        return f"cron {expr!r} in {tz}"
    minute, hour, dom, month, dow = fields
    if hour == "*" and (dom, month, dow) == ("*", "*", "*"):
        return _sub_hourly(minute) or f"cron {expr!r} in {tz}"
    if not (minute.isdigit() and hour.isdigit()) or month != "*":
        return _hour_steps(minute, hour, dom, month, dow, tz) or f"cron {expr!r} in {tz}"
    at = f"at {int(hour):02d}:{int(minute):02d} {tz}"
    if dom == "*" and dow == "*":
        return f"every day {at}"
    if dom == "*" and dow.lower() in _DAY_RANGES:
        return f"every {_DAY_RANGES[dow.lower()]} {at}"
    if dom == "*" and dow.lower() in _DAY_NAMES:
        return f"every {_DAY_NAMES[dow.lower()]} {at}"
    if dow == "*" and dom.isdigit():
        return f"on day {int(dom)} of every month {at}"
    return f"cron {expr!r} in {tz}"


def _sub_hourly(minute: str) -> str | None:
    if minute == "*":
        return "every minute"
    if minute.startswith("*/") and minute[2:].isdigit():
        return f"every {_count(int(minute[2:]), 'minute')}"
    if minute.isdigit():
        return f"every hour at minute {int(minute)}"
    return None


def _hour_steps(minute: str, hour: str, dom: str, month: str, dow: str, tz: str) -> str | None:
    """``M */N * * *``: every N hours at minute M."""
    if (dom, month, dow) != ("*", "*", "*") or not minute.isdigit():
        return None
    if hour.startswith("*/") and hour[2:].isdigit():
        return f"every {_count(int(hour[2:]), 'hour')} at minute {int(minute)} ({tz} hours)"
    return None


def _after_text(trigger: AfterTrigger) -> str:
    names = trigger.jobs
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    if trigger.on == "success":
        return f"after {listed} {'succeeds' if len(names) == 1 else 'succeed'}"
    return f"after {listed} {'ends' if len(names) == 1 else 'end'} (any outcome)"


def _span(ms: int) -> str:
    """``every`` in words: the largest units that divide it exactly."""
    if ms % 1000:
        return _count(ms, "millisecond")
    parts = []
    rest = ms
    for unit, size in _UNITS:
        if rest >= size:
            parts.append((rest // size, unit))
            rest %= size
    if len(parts) == 1 and parts[0][0] == 1:
        return parts[0][1]
    return " ".join(_count(n, unit) for n, unit in parts)


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}{'' if n == 1 else 's'}"


def _utc_text(ms: int) -> str:
    moment = ms_to_utc(ms)
    text = moment.strftime("%Y-%m-%d %H:%M")
    if moment.second or moment.microsecond:
        text = moment.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text} UTC"


DstMark = Literal["", "gap", "fold", "offset"]


@dataclass(frozen=True)
class UpcomingSlot:
    """One slot to come, as the job's zone sees it."""

    slot_ms: int
    local: str
    """The wall time in the trigger's zone (UTC for non-cron triggers), with its offset."""
    mark: DstMark = ""
    """``gap``: the cron's wall time does not exist that day (spring
    forward), so the slot moved to the end of the gap; ``fold``: the wall
    time occurs twice (fall back); ``offset``: the zone's UTC offset
    changed since the slot before (a skipped gap time falls here)."""
    note: str = ""


def upcoming_slots(
    trigger: Trigger, after_ms: int, anchor_ms: int, count: int = 10
) -> list[UpcomingSlot]:
    """The next ``count`` slots strictly after ``after_ms``, from the trigger
    code itself, each marked when a DST transition touches it. An ``after``
    trigger has none: its runs come when its upstream runs end."""
    slots = slots_between(trigger, after_ms, _LAST_MS, anchor_ms, count)
    if not isinstance(trigger, CronTrigger):
        return [UpcomingSlot(ms, _wall(ms, "UTC")) for ms in slots]
    result = []
    previous: int | None = None
    for ms in slots:
        mark, note = _dst_mark(trigger, ms, previous)
        result.append(UpcomingSlot(ms, _wall(ms, trigger.tz), mark, note))
        previous = ms
    return result


def _wall(ms: int, tz: str) -> str:
    local = ms_to_utc(ms).astimezone(load_zone(tz))
    return f"{local.strftime('%Y-%m-%d %H:%M:%S')} {_offset(local.utcoffset())} {tz}"


def _dst_mark(trigger: CronTrigger, ms: int, previous: int | None) -> tuple[DstMark, str]:
    zone = load_zone(trigger.tz)
    local = ms_to_utc(ms).astimezone(zone)
    wall = local.replace(tzinfo=None)
    if not _cron_matches(trigger.expr, wall):
        return "gap", (
            "the scheduled wall time does not exist this day (clocks go forward):"
            f" moved to {wall.strftime('%H:%M')}, the end of the gap"
        )
    first = wall.replace(tzinfo=zone, fold=0).utcoffset()
    second = wall.replace(tzinfo=zone, fold=1).utcoffset()
    if first != second:
        which = "second" if local.fold else "first"
        return "fold", (
            f"{wall.strftime('%H:%M')} occurs twice this day (clocks go back):"
            f" this is the {which} time"
        )
    if previous is not None:
        before = ms_to_utc(previous).astimezone(zone).utcoffset()
        if before != local.utcoffset():
            skipped = "; a wall time in the gap was skipped (dst.gap: skip)"
            return "offset", (
                f"the UTC offset changed since the slot before ({_offset(before)} to"
                f" {_offset(local.utcoffset())})" + (skipped if trigger.dst.gap == "skip" else "")
            )
    return "", ""


def _cron_matches(expr: str, wall: datetime) -> bool:
    """Whether ``wall`` is one of the cron expression's own wall times."""
    start = wall - timedelta(seconds=1)
    it = croniter(expr, start, second_at_beginning=len(expr.split()) == 6)
    following: datetime = it.get_next(datetime)
    return following == wall


def _offset(delta: timedelta | None) -> str:
    minutes = int((delta or timedelta(0)).total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
