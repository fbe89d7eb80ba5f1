"""Cron slots across DST transitions: every gap and fold policy, exact UTC instants.

Transitions used (2026; verified against zoneinfo by the first test):

* Europe/Berlin: 03-29 02:00 -> 03:00 (gap), 10-25 03:00 -> 02:00 (fold), both at 01:00Z.
* America/New_York: 03-08 02:00 -> 03:00 at 07:00Z; 11-01 02:00 -> 01:00 at 06:00Z.
* Australia/Lord_Howe (30-minute DST): 04-05 02:00 -> 01:30 (fold) at 04-04 15:00Z;
  10-04 02:00 -> 02:30 (gap) at 10-03 15:30Z.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etcdsched.model.cronwall import FoldPolicy, GapPolicy
from etcdsched.model.triggers import (
    CronTrigger,
    DstPolicy,
    count_slots_between,
    next_slot,
    slots_between,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUR_MS = 3_600_000
BERLIN, NEW_YORK, LORD_HOWE = "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"


def ms(text: str) -> int:
    return (datetime.fromisoformat(text) - EPOCH) // timedelta(milliseconds=1)


def utc(instants: list[int]) -> list[str]:
    """Epoch ms -> 'YYYY-MM-DDTHH:MM:SSZ', for readable assertion diffs."""
    return [(EPOCH + timedelta(milliseconds=x)).strftime("%Y-%m-%dT%H:%M:%SZ") for x in instants]


def cron(expr: str, tz: str, gap: GapPolicy = "shift", fold: FoldPolicy = "first") -> CronTrigger:
    return CronTrigger(expr=expr, tz=tz, dst=DstPolicy(gap=gap, fold=fold))


def window(trigger: CronTrigger, after: str, until: str) -> list[str]:
    slots = slots_between(trigger, ms(after), ms(until), 0, 10_000)
    assert count_slots_between(trigger, ms(after), ms(until), 0, 10_000) == len(slots)
    assert slots == sorted(set(slots)), "slots must be ascending without duplicates"
    return utc(slots)


def transitions_2026(tz: str) -> list[tuple[str, str, str]]:
    """(UTC instant, local time just before, local time at) of every offset change."""
    zone = ZoneInfo(tz)
    found = []
    t = datetime(2026, 1, 1, tzinfo=UTC)
    while t.year == 2026:
        step = t + timedelta(hours=1)
        if step.astimezone(zone).utcoffset() != t.astimezone(zone).utcoffset():
            lo, hi = t, step
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                same = mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset()
                lo, hi = (mid, hi) if same else (lo, mid)
            before = (hi - timedelta(seconds=1)).astimezone(zone) + timedelta(seconds=1)
            found.append(
                (
                    hi.strftime("%Y-%m-%dT%H:%MZ"),
                    before.strftime("%m-%d %H:%M"),
                    hi.astimezone(zone).strftime("%m-%d %H:%M"),
                )
            )
        t = step
    return found


def test_transition_dates_are_the_ones_these_tests_assume() -> None:
    assert transitions_2026(BERLIN) == [
        ("2026-03-29T01:00Z", "03-29 02:00", "03-29 03:00"),
        ("2026-10-25T01:00Z", "10-25 03:00", "10-25 02:00"),
    ]
    assert transitions_2026(NEW_YORK) == [
        ("2026-03-08T07:00Z", "03-08 02:00", "03-08 03:00"),
        ("2026-11-01T06:00Z", "11-01 02:00", "11-01 01:00"),
    ]
    assert transitions_2026(LORD_HOWE) == [
        ("2026-04-04T15:00Z", "04-05 02:00", "04-05 01:30"),
        ("2026-10-03T15:30Z", "10-04 02:00", "10-04 02:30"),
    ]


# --- gaps (spring forward) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "expr", "after", "until", "skipped", "shifted_to"),
    [
        # Daily 02:30 does not exist on the gap day; shift = the transition instant (03:00 local).
        (BERLIN, "30 2 * * *", "2026-03-28T00:00Z", "2026-03-31T00:00Z",
         ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"], "2026-03-29T01:00:00Z"),
        (NEW_YORK, "30 2 * * *", "2026-03-07T00:00Z", "2026-03-10T00:00Z",
         ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z"], "2026-03-08T07:00:00Z"),
        # Lord Howe's gap is 02:00-02:30; shift lands on 02:30 local (+11:00).
        (LORD_HOWE, "15 2 * * *", "2026-10-02T00:00Z", "2026-10-05T00:00Z",
         ["2026-10-02T15:45:00Z", "2026-10-04T15:15:00Z"], "2026-10-03T15:30:00Z"),
    ],
)  # fmt: skip
def test_daily_slot_in_the_gap(
    tz: str, expr: str, after: str, until: str, skipped: list[str], shifted_to: str
) -> None:
    assert window(cron(expr, tz, gap="skip"), after, until) == skipped
    assert window(cron(expr, tz, gap="shift"), after, until) == sorted([*skipped, shifted_to])


def test_berlin_gap_slots_collapse_into_one_at_the_transition() -> None:
    # 15,45: wall 02:15 and 02:45 do not exist; shift maps both to 03:00 CEST = 01:00Z.
    after, until = "2026-03-29T00:00Z", "2026-03-29T01:30Z"
    assert window(cron("15,45 * * * *", BERLIN, gap="skip"), after, until) == [
        "2026-03-29T00:15:00Z",  # 01:15 CET
        "2026-03-29T00:45:00Z",  # 01:45 CET
        "2026-03-29T01:15:00Z",  # 03:15 CEST
    ]
    assert window(cron("15,45 * * * *", BERLIN, gap="shift"), after, until) == [
        "2026-03-29T00:15:00Z",
        "2026-03-29T00:45:00Z",
        "2026-03-29T01:00:00Z",  # 02:15 and 02:45, shifted and deduplicated
        "2026-03-29T01:15:00Z",
    ]


@pytest.mark.parametrize("gap", ["skip", "shift"])
def test_every_15_minutes_through_the_berlin_gap(gap: GapPolicy) -> None:
    # 02:00..02:45 collapse into 03:00 CEST, which is itself a slot: one slot either way.
    assert window(
        cron("*/15 * * * *", BERLIN, gap=gap), "2026-03-29T00:20Z", "2026-03-29T01:30Z"
    ) == [
        "2026-03-29T00:30:00Z",
        "2026-03-29T00:45:00Z",
        "2026-03-29T01:00:00Z",
        "2026-03-29T01:15:00Z",
        "2026-03-29T01:30:00Z",
    ]


@pytest.mark.parametrize(
    ("gap", "expected"),
    [
        ("skip", ["2026-10-03T15:15:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z"]),
        ("shift", ["2026-10-03T15:15:00Z", "2026-10-03T15:30:00Z", "2026-10-03T15:45:00Z"]),
    ],
)
def test_every_15_minutes_through_the_lord_howe_gap(gap: GapPolicy, expected: list[str]) -> None:
    # 01:45 (+10:30), then 02:00 and 02:15 do not exist, 02:30 (+11:00) = transition, 02:45.
    trigger = cron("*/15 * * * *", LORD_HOWE, gap=gap)
    assert window(trigger, "2026-10-03T15:00Z", "2026-10-03T15:45Z") == expected


def test_new_york_gap_with_minutes_that_exist_only_under_shift() -> None:
    trigger = "10,40 2 * * *"
    after, until = "2026-03-08T06:00Z", "2026-03-08T08:00Z"
    assert window(cron(trigger, NEW_YORK, gap="skip"), after, until) == []
    assert window(cron(trigger, NEW_YORK, gap="shift"), after, until) == ["2026-03-08T07:00:00Z"]


def test_next_slot_just_before_and_after_a_gap() -> None:
    shift = cron("30 2 * * *", BERLIN, gap="shift")
    skip = cron("30 2 * * *", BERLIN, gap="skip")
    transition = ms("2026-03-29T01:00Z")
    assert next_slot(shift, transition - 1, 0) == transition
    assert next_slot(shift, transition, 0) == ms("2026-03-30T00:30Z")
    assert next_slot(skip, transition - 1, 0) == ms("2026-03-30T00:30Z")


def test_per_second_cron_jumps_over_the_gap() -> None:
    for gap in ("skip", "shift"):
        trigger = cron("* * * * * *", BERLIN, gap=gap)
        after = ms("2026-03-29T00:59:58Z")
        assert utc(slots_between(trigger, after, after + HOUR_MS, 0, 4)) == [
            "2026-03-29T00:59:59Z",  # 01:59:59 CET
            "2026-03-29T01:00:00Z",  # 03:00:00 CEST
            "2026-03-29T01:00:01Z",
            "2026-03-29T01:00:02Z",
        ]
        assert count_slots_between(trigger, after, after + HOUR_MS, 0, 5) == 5


# --- folds (fall back) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "expr", "after", "until", "first", "last"),
    [
        (NEW_YORK, "30 1 * * *", "2026-11-01T00:00Z", "2026-11-01T12:00Z",
         "2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"),
        (BERLIN, "30 2 * * *", "2026-10-24T23:00Z", "2026-10-25T12:00Z",
         "2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"),
        (LORD_HOWE, "45 1 * * *", "2026-04-04T12:00Z", "2026-04-04T18:00Z",
         "2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z"),
    ],
)  # fmt: skip
def test_daily_slot_in_the_fold(
    tz: str, expr: str, after: str, until: str, first: str, last: str
) -> None:
    assert window(cron(expr, tz, fold="first"), after, until) == [first]
    assert window(cron(expr, tz, fold="last"), after, until) == [last]
    assert window(cron(expr, tz, fold="both"), after, until) == [first, last]


@pytest.mark.parametrize(
    ("fold", "expected"),
    [
        ("first", ["04:30", "05:00", "05:30", "07:00", "07:30"]),
        ("last", ["04:30", "06:00", "06:30", "07:00", "07:30"]),
        ("both", ["04:30", "05:00", "05:30", "06:00", "06:30", "07:00", "07:30"]),
    ],
)
def test_every_30_minutes_through_the_new_york_fold(fold: FoldPolicy, expected: list[str]) -> None:
    # Wall 00:30 EDT, 01:00 and 01:30 twice (EDT then EST), 02:00 EST, 02:30 EST.
    got = window(
        cron("*/30 * * * *", NEW_YORK, fold=fold), "2026-11-01T04:00Z", "2026-11-01T07:30Z"
    )
    assert got == [f"2026-11-01T{hm}:00Z" for hm in expected]


@pytest.mark.parametrize(
    ("fold", "expected"),
    [
        ("first", ["10-24T23:30", "10-25T00:00", "10-25T00:30", "10-25T02:00"]),
        ("last", ["10-24T23:30", "10-25T01:00", "10-25T01:30", "10-25T02:00"]),
        ("both", ["10-24T23:30", "10-25T00:00", "10-25T00:30", "10-25T01:00", "10-25T01:30",
                  "10-25T02:00"]),
    ],
)  # fmt: skip
def test_every_30_minutes_through_the_berlin_fold(fold: FoldPolicy, expected: list[str]) -> None:
    got = window(cron("*/30 * * * *", BERLIN, fold=fold), "2026-10-24T23:00Z", "2026-10-25T02:00Z")
    assert got == [f"2026-{md}:00Z" for md in expected]


@pytest.mark.parametrize(
    ("fold", "expected"),
    [
        ("first", ["14:15", "14:30", "14:45", "15:30", "15:45"]),
        ("last", ["14:15", "15:00", "15:15", "15:30", "15:45"]),
        ("both", ["14:15", "14:30", "14:45", "15:00", "15:15", "15:30", "15:45"]),
    ],
)
def test_every_15_minutes_through_the_lord_howe_fold(fold: FoldPolicy, expected: list[str]) -> None:
    # 01:30 and 01:45 happen at +11:00 and again at +10:30; the fold is 30 minutes long.
    got = window(
        cron("*/15 * * * *", LORD_HOWE, fold=fold), "2026-04-04T14:00Z", "2026-04-04T15:45Z"
    )
    assert got == [f"2026-04-04T{hm}:00Z" for hm in expected]


def test_next_slot_from_inside_the_fold() -> None:
    # After 01:40 EDT (05:40Z) the second 01:30 (06:30Z) is still ahead.
    inside_first_pass = ms("2026-11-01T05:40Z")
    assert next_slot(cron("30 1 * * *", NEW_YORK, fold="first"), inside_first_pass, 0) == ms(
        "2026-11-02T06:30Z"
    )
    assert next_slot(cron("30 1 * * *", NEW_YORK, fold="last"), inside_first_pass, 0) == ms(
        "2026-11-01T06:30Z"
    )
    assert next_slot(cron("30 1 * * *", NEW_YORK, fold="both"), inside_first_pass, 0) == ms(
        "2026-11-01T06:30Z"
    )
    every_30 = cron("*/30 * * * *", NEW_YORK, fold="both")
    assert next_slot(every_30, ms("2026-11-01T05:30Z"), 0) == ms("2026-11-01T06:00Z")


def test_per_second_cron_through_a_fold_with_both() -> None:
    trigger = cron("* * * * * *", NEW_YORK, fold="both")
    after = ms("2026-11-01T05:59:58Z")  # 01:59:58 EDT
    assert utc(slots_between(trigger, after, after + HOUR_MS, 0, 4)) == [
        "2026-11-01T05:59:59Z",
        "2026-11-01T06:00:00Z",  # 01:00:00 EST
        "2026-11-01T06:00:01Z",
        "2026-11-01T06:00:02Z",
    ]


# --- consistency around every transition, for every policy -----------------------------

CASES = [
    (tz, expr, gap, fold)
    for tz in (BERLIN, NEW_YORK, LORD_HOWE)
    for expr in ("*/15 * * * *", "30 1,2 * * *", "0,30 1-3 * * *")
    for gap in ("skip", "shift")
    for fold in ("first", "last", "both")
]
CENTERS = {
    BERLIN: ["2026-03-29T01:00Z", "2026-10-25T01:00Z"],
    NEW_YORK: ["2026-03-08T07:00Z", "2026-11-01T06:00Z"],
    LORD_HOWE: ["2026-10-03T15:30Z", "2026-04-04T15:00Z"],
}


@settings(max_examples=120, deadline=None)
@given(
    case=st.sampled_from(CASES),
    which=st.integers(min_value=0, max_value=1),
    offset_s=st.integers(min_value=-4 * 3600, max_value=4 * 3600),
    nudge_ms=st.sampled_from([-1, 0, 1]),
)
def test_next_slot_agrees_with_a_window_started_earlier(
    case: tuple[str, str, GapPolicy, FoldPolicy], which: int, offset_s: int, nudge_ms: int
) -> None:
    tz, expr, gap, fold = case
    trigger = cron(expr, tz, gap=gap, fold=fold)
    center = ms(CENTERS[tz][which])
    until = center + 36 * HOUR_MS  # long enough for a daily slot after any `after`
    reference = slots_between(trigger, center - 12 * HOUR_MS, until, 0, 1000)
    assert reference == sorted(set(reference))
    after = center + offset_s * 1000 + nudge_ms
    ahead = [s for s in reference if s > after]
    assert next_slot(trigger, after, 0) == ahead[0]
    assert slots_between(trigger, after, until, 0, 1000) == ahead
    assert count_slots_between(trigger, after, until, 0, 1000) == len(ahead)
