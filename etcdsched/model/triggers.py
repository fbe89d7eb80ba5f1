"""Trigger models (when a job runs) and pure slot computation.

A *slot* is a scheduled instant of a job. All instants are ``int`` epoch
milliseconds in UTC (names end in ``_ms``). The functions here are pure: the
caller passes ``after_ms`` and the job's ``anchor_ms`` (its creation instant);
nothing reads the clock.

Conventions:

* :func:`next_slot` returns the first slot *strictly* after ``after_ms``; pass
  ``after_ms = anchor_ms - 1`` to include a slot at the anchor itself.
* Bounds shared by every kind: ``start_at`` (no slot before, inclusive),
  ``end_at`` (no slot after, inclusive), ``max_runs`` (exposed only: the pure
  functions do not know how many runs have fired).
* Datetimes must be RFC 3339 strings (or aware ``datetime``) with a UTC offset;
  naive datetimes and bare numbers (ambiguous: seconds or milliseconds?) are
  rejected.
  They become milliseconds by rounding down; ``start_at`` rounds up so that
  "no slot before" stays true.
* ``IntervalTrigger.every`` dumps in JSON mode as the compact duration string of
  :func:`~etcdsched.model.durations.format_duration` (``"30s"``, ``"5m"``, ``"1h30m"``),
  which validates back to the same value; Python mode keeps the ``timedelta``.
* Cron: see :class:`CronTrigger` and :mod:`etcdsched.model.cronwall` for the
  wall-clock and DST semantics.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import count, islice
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from etcdsched.model.cronwall import (
    FoldPolicy,
    GapPolicy,
    cron_instants,
    load_zone,
    ms_to_utc,
    normalize_cron_expr,
    utc_to_ms,
)
from etcdsched.model.durations import format_duration, parse_duration

__all__ = [
    "TRIGGER_ADAPTER",
    "AfterTrigger",
    "AtTrigger",
    "CronTrigger",
    "DstPolicy",
    "IntervalTrigger",
    "NowTrigger",
    "Trigger",
    "count_slots_between",
    "describe",
    "jitter_offset_ms",
    "next_slot",
    "slots_between",
]

MIN_INTERVAL = timedelta(seconds=1)
MAX_INTERVAL = timedelta(days=366)
_ONE_MS = timedelta(milliseconds=1)
_DATE_PREFIX = re.compile(r"\s*\d{4}-\d{2}-\d{2}")


def _instant_input(value: object, info: ValidationInfo) -> object:
    """Only RFC 3339 text or a datetime; a bare number is ambiguous (s or ms?)."""
    if isinstance(value, datetime) or (isinstance(value, str) and _DATE_PREFIX.match(value)):
        return value
    raise ValueError(
        f"{info.field_name} must be an RFC 3339 date-time with a UTC offset, "
        f"e.g. '2026-12-02T10:00:00Z', got {repr(value)[:64]}"
    )


_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LAST_INSTANT = datetime(5138, 11, 16, 9, 46, 39, 999000, tzinfo=UTC)
"""The last instant a slot can name: slots are 14-digit epoch milliseconds in
keys (``etcdsched.store.keys``), so 10^14 ms is out of reach."""


def _require_offset(value: datetime, info: ValidationInfo) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{info.field_name} must include a UTC offset (RFC 3339, e.g. "
            f"'2026-12-02T10:00:00Z' or '+01:00'); got naive {value.isoformat()!r}"
        )
    try:
        in_utc = value.astimezone(UTC)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-14:00 is past year 9999 in UTC
        in_utc = None
    if in_utc is None or not _EARLIEST <= in_utc <= LAST_INSTANT:
        raise ValueError(
            f"{info.field_name} must be between 1970-01-01T00:00:00Z and"
            f" {LAST_INSTANT.isoformat(timespec='milliseconds')} (in UTC)"
        )
    return value


Instant = Annotated[datetime, BeforeValidator(_instant_input), AfterValidator(_require_offset)]
"""An aware datetime given as RFC 3339 with an offset."""

Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""A non-negative duration; see :func:`etcdsched.model.durations.parse_duration`."""


class DstPolicy(BaseModel):
    """What a cron slot does at a DST transition of its time zone.

    ``gap`` is for a local wall time that does not exist (spring forward):
    ``skip`` drops the slot; ``shift`` moves it to the transition instant, the
    first instant after the gap (Berlin, 2026-03-29 02:30 -> 03:00 CEST). All
    gap slots of one gap collapse into that single instant.

    ``fold`` is for a local wall time that occurs twice (fall back):
    ``first`` keeps the earlier instant (``fold=0``), ``last`` the later one
    (``fold=1``), ``both`` keeps both, in order.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    gap: GapPolicy = "shift"
    fold: FoldPolicy = "first"


class _TriggerBase(BaseModel):
    """Bounds shared by every trigger kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start_at: Instant | None = None
    end_at: Instant | None = None
    max_runs: Annotated[int, Field(ge=1, strict=True)] | None = None

    @model_validator(mode="after")
    def _end_after_start(self) -> Self:
        start, end = self.start_at, self.end_at
        if start is not None and end is not None and end <= start:
            raise ValueError(
                f"end_at ({end.isoformat()}) must be after start_at ({start.isoformat()})"
            )
        return self

    @property
    def start_at_ms(self) -> int | None:
        """``start_at`` in ms, rounded up (no slot before it)."""
        if self.start_at is None:
            return None
        return -(-(self.start_at - ms_to_utc(0)) // _ONE_MS)

    @property
    def end_at_ms(self) -> int | None:
        """``end_at`` in ms, rounded down (no slot after it)."""
        return None if self.end_at is None else utc_to_ms(self.end_at)


class NowTrigger(_TriggerBase):
    """One slot at the job's anchor (its creation instant)."""

    kind: Literal["now"] = "now"


class AtTrigger(_TriggerBase):
    """One slot at ``at``."""

    kind: Literal["at"] = "at"
    at: Instant
    if_past: Literal["refuse", "run_now"] = "refuse"
    """An ``at`` already past (beyond the misfire grace) when the job is
    created: a 422, or ``run_now``: the job is stored with ``at`` = its
    creation instant."""

    @property
    def at_ms(self) -> int:
        return utc_to_ms(self.at)


class IntervalTrigger(_TriggerBase):
    """Slots at ``start + k * every`` for k >= 0; ``start`` defaults to the anchor.

    ``every`` is between 1 s and 366 days, in whole milliseconds.
    """

    kind: Literal["interval"] = "interval"
    every: Duration
    start: Instant | None = None

    @field_validator("every")
    @classmethod
    def _check_every(cls, value: timedelta) -> timedelta:
        shown = format_duration(value)
        if value < MIN_INTERVAL:
            raise ValueError(f"every must be at least 1s, got {shown}")
        if value > MAX_INTERVAL:
            raise ValueError(f"every must be at most 366d, got {shown}")
        if value % _ONE_MS:
            raise ValueError(f"every must be a whole number of milliseconds, got {shown}")
        return value

    @property
    def every_ms(self) -> int:
        return self.every // _ONE_MS

    def base_ms(self, anchor_ms: int) -> int:
        """The k = 0 slot: ``start`` if set, else the anchor."""
        return anchor_ms if self.start is None else utc_to_ms(self.start)


class CronTrigger(_TriggerBase):
    """Slots where a cron expression matches the local wall clock of ``tz``.

    ``expr`` has 5 fields (minute precision), 6 fields whose **first** field
    is seconds (Quartz/Spring order: ``"0 */5 * * * *"``), or a macro
    (``@yearly @annually @monthly @weekly @daily @midnight @hourly``).
    ``@reboot`` and random (``R``) fields are rejected. When both day-of-month
    and day-of-week are restricted, a day matching either one matches (Vixie
    cron). ``tz`` is an IANA zone name; ``dst`` says what happens to wall times
    that a DST transition skips or repeats.
    """

    kind: Literal["cron"] = "cron"
    expr: str
    tz: str = "UTC"
    dst: DstPolicy = DstPolicy()

    @field_validator("expr")
    @classmethod
    def _check_expr(cls, value: str) -> str:
        return normalize_cron_expr(value)

    @field_validator("tz")
    @classmethod
    def _check_tz(cls, value: str) -> str:
        load_zone(value)
        return value


UPSTREAM_NAME = r"^[A-Za-z0-9][A-Za-z0-9:._-]{0,199}$"
"""A job's name, or its full ``<tenant>:<name>`` id (``etcdsched.store.keys``)."""

WATCH_SLOT = 0
"""Where an ``after`` job waits in the due index: it has no instants of its
own, so its entry sits at the epoch, which the firer never fires; the
scheduler's after-watch moves it to *now* once its upstream runs have
ended as asked (docs/dependencies.md)."""


class AfterTrigger(_TriggerBase):
    """Runs once each time every job in ``jobs`` has a new run that ended as
    ``on`` asks (``success``: succeeded; ``completion``: any end) since the
    last run of this job (or since it was created)."""

    kind: Literal["after"] = "after"
    jobs: list[Annotated[str, Field(pattern=UPSTREAM_NAME)]] = Field(min_length=1, max_length=32)
    on: Literal["success", "completion"] = "success"


Trigger = Annotated[
    NowTrigger | AtTrigger | IntervalTrigger | CronTrigger | AfterTrigger,
    Field(discriminator="kind"),
]
"""Any trigger, told apart by its ``kind`` field."""

TRIGGER_ADAPTER: TypeAdapter[Trigger] = TypeAdapter(Trigger)
"""Validates/dumps a bare :data:`Trigger` (``TRIGGER_ADAPTER.validate_python(data)``)."""


def why_no_slot(trigger: Trigger, now_ms: int) -> tuple[str, str]:
    """Why a trigger has no slot left at ``now_ms``: (message, its field),
    for the 422 of a job that would never run."""
    if trigger.end_at is not None and trigger.end_at_ms is not None and trigger.end_at_ms < now_ms:
        return f"end_at {trigger.end_at.isoformat()} is in the past: the job would never run", (
            "end_at"
        )
    if isinstance(trigger, AtTrigger):
        hint = 'give "if_past": "run_now" to run it at once'
        return f"at {trigger.at.isoformat()} is in the past: the job would never run ({hint})", "at"
    return "the trigger has no slot after now: the job would never run", "kind"


def next_slot(trigger: Trigger, after_ms: int, anchor_ms: int) -> int | None:
    """The first slot strictly after ``after_ms`` within the bounds, or ``None``.

    ``None`` means there is no further slot: a one-shot already past, the
    ``end_at`` bound passed, or a cron expression that never matches again.
    An ``after`` trigger has no instants: its next "slot" is
    :data:`WATCH_SLOT` (waiting for its upstream runs) until ``end_at``.
    """
    if isinstance(trigger, AfterTrigger):
        end = trigger.end_at_ms
        return WATCH_SLOT if end is None or after_ms < end else None
    return next(_bounded(trigger, after_ms, None, anchor_ms), None)


def latest_slot_at_or_before(
    trigger: Trigger, at_ms: int, anchor_ms: int, window_ms: int
) -> int | None:
    """The last slot of ``trigger`` in ``[at_ms - window_ms, at_ms]``, or None.

    Slots are only listed forwards, so the window is searched from its end
    in widening steps: a schedule with slots every second is answered from
    the last two seconds, a daily one from the last day, and no step lists
    more than about 60 times the slots of the step before."""
    if isinstance(trigger, AfterTrigger):
        return None
    floor = at_ms - window_ms
    step = 2_000
    while True:
        since = max(floor, at_ms - step)
        slots = slots_between(trigger, since - 1, at_ms, anchor_ms, 100_000)
        if slots:
            return slots[-1]
        if since <= floor:
            return None
        step *= 60


def slots_between(
    trigger: Trigger, after_ms: int, until_ms: int, anchor_ms: int, limit: int
) -> list[int]:
    """Up to ``limit`` slots in ``(after_ms, until_ms]``, ascending.

    Work is proportional to the slots returned, so a per-second cron over a
    long window is cheap when ``limit`` is small.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return list(islice(_bounded(trigger, after_ms, until_ms, anchor_ms), limit))


def count_slots_between(
    trigger: Trigger, after_ms: int, until_ms: int, anchor_ms: int, cap: int
) -> int:
    """The number of slots in ``(after_ms, until_ms]``, counting no further than ``cap``.

    Intervals are counted arithmetically; cron is iterated, at most ``cap`` steps.
    """
    if cap < 0:
        raise ValueError(f"cap must be >= 0, got {cap}")
    if isinstance(trigger, IntervalTrigger):
        first = _first_interval_slot(trigger, after_ms, anchor_ms)
        last = _upper_bound(trigger, until_ms)
        if last is None or first > last:
            return 0
        return min(cap, (last - first) // trigger.every_ms + 1)
    return sum(1 for _ in islice(_bounded(trigger, after_ms, until_ms, anchor_ms), cap))


def jitter_offset_ms(job_id: str, slot_ms: int, window_ms: int) -> int:
    """A stable pseudo-random offset in ``[0, window_ms)`` for one slot of one job.

    Derived from BLAKE2b of (slot, job id), so every process computes the same
    value (the builtin ``hash()`` is salted per process). 0 when the window is 0.
    """
    if window_ms < 0:
        raise ValueError(f"window_ms must be >= 0, got {window_ms}")
    if window_ms == 0:
        return 0
    # The slot has a fixed width, so the (slot, job id) encoding is unambiguous.
    data = slot_ms.to_bytes(16, "big", signed=True) + job_id.encode("utf-8")
    digest = hashlib.blake2b(data, digest_size=8, person=b"etcdsched.jitter").digest()
    return int.from_bytes(digest, "big") % window_ms


def describe(trigger: Trigger) -> str:
    """A short human description, e.g. ``"every 5m"`` or ``"cron '0 3 * * *' in UTC"``."""
    if isinstance(trigger, NowTrigger):
        text = "now"
    elif isinstance(trigger, AtTrigger):
        text = f"at {_show(trigger.at)}"
    elif isinstance(trigger, IntervalTrigger):
        text = f"every {format_duration(trigger.every)}"
        if trigger.start is not None:
            text += f" from {_show(trigger.start)}"
    elif isinstance(trigger, AfterTrigger):
        text = f"after {', '.join(trigger.jobs)} (on {trigger.on})"
    else:
        text = f"cron {trigger.expr!r} in {trigger.tz}"
    bounds = [] if trigger.start_at is None else [f"not before {_show(trigger.start_at)}"]
    if trigger.end_at is not None:
        bounds.append(f"not after {_show(trigger.end_at)}")
    if trigger.max_runs is not None:
        bounds.append(f"at most {trigger.max_runs} run{'s' if trigger.max_runs > 1 else ''}")
    return f"{text} ({', '.join(bounds)})" if bounds else text


def _show(value: datetime) -> str:
    text = value.isoformat()
    return text[: -len("+00:00")] + "Z" if text.endswith("+00:00") else text


def _upper_bound(trigger: Trigger, until_ms: int | None) -> int | None:
    """The last allowed instant: the smaller of ``until_ms`` and ``end_at``."""
    bounds = [b for b in (until_ms, trigger.end_at_ms) if b is not None]
    return min(bounds) if bounds else None


def _lower_exclusive(trigger: Trigger, after_ms: int) -> int:
    """``after_ms`` raised so that no slot before ``start_at`` qualifies."""
    start = trigger.start_at_ms
    return after_ms if start is None else max(after_ms, start - 1)


def _first_interval_slot(trigger: IntervalTrigger, after_ms: int, anchor_ms: int) -> int:
    base = trigger.base_ms(anchor_ms)
    lowest = max(_lower_exclusive(trigger, after_ms) + 1, base)
    steps = -(-(lowest - base) // trigger.every_ms)
    return base + steps * trigger.every_ms


def _unbounded(trigger: Trigger, after_ms: int, anchor_ms: int) -> Iterator[int]:
    """Ascending slots after ``after_ms`` and not before ``start_at``; no upper bound."""
    lower = _lower_exclusive(trigger, after_ms)
    if isinstance(trigger, NowTrigger | AtTrigger):
        slot = anchor_ms if isinstance(trigger, NowTrigger) else trigger.at_ms
        return iter([slot] if slot > lower else [])
    if isinstance(trigger, IntervalTrigger):
        first = _first_interval_slot(trigger, after_ms, anchor_ms)
        return (first + k * trigger.every_ms for k in count())
    if isinstance(trigger, AfterTrigger):
        return iter([])  # no instants: its runs come when its upstreams end
    zone = load_zone(trigger.tz)
    return cron_instants(trigger.expr, zone, trigger.dst.gap, trigger.dst.fold, lower)


def _bounded(
    trigger: Trigger, after_ms: int, until_ms: int | None, anchor_ms: int
) -> Iterator[int]:
    upper = _upper_bound(trigger, until_ms)
    for slot in _unbounded(trigger, after_ms, anchor_ms):
        if upper is not None and slot > upper:
            return
        yield slot
