"""The staging lead: the lookahead with no herd; early enough, at the
measured rate, for a herd to be staged by its instant; bounded by the
horizon, the capacity and the staged-runs ceiling."""

from __future__ import annotations

from collections import Counter

from etcdsched.runtime.clock import FakeClock
from etcdsched.scheduler.staging import RATE_GUESS, SAFETY, StagingLead, herd_lead_ms


def test_no_herd_needs_nothing_beyond_the_lookahead() -> None:
    assert herd_lead_ms(Counter({5: 10, 30: 20}), rate=1000, cap=10**6, lookahead_ms=2000) == 2000


def test_a_herd_is_fired_once_its_backlog_can_no_longer_wait() -> None:
    # 30 s of staging for a herd 40 s away: not yet; 30 s away: now, up to it
    assert herd_lead_ms(Counter({40: 30_000}), rate=1000, cap=10**6, lookahead_ms=2000) == 2000
    assert herd_lead_ms(Counter({31: 30_000}), rate=1000, cap=10**6, lookahead_ms=2000) == 33_000
    # what may be staged at all bounds it
    assert herd_lead_ms(Counter({31: 30_000}), rate=1000, cap=5000, lookahead_ms=2000) == 2000
    # a steady load under the rate fires a few seconds ahead at most
    steady = Counter({t: 300 for t in range(60)})
    assert herd_lead_ms(steady, rate=1000, cap=10**6, lookahead_ms=2000) <= 6000


def _lead(clock: FakeClock, due: Counter[int], capacity: int = 10**6) -> StagingLead:
    return StagingLead(clock, 2000, 60_000, lambda now: [due], lambda: capacity, 250_000)


def test_the_lead_is_the_lookahead_unless_a_herd_comes_and_stays_inside_the_horizon() -> None:
    clock = FakeClock(1_000_000)
    assert _lead(clock, Counter({1: 100})).lead_ms() == 2000
    # 10,000 at the guessed 300/s, planned at 1.25x: 42 s; 50 s away: not yet
    assert _lead(clock, Counter({50: 10_000})).lead_ms() == 2000
    assert _lead(clock, Counter({20: 10_000})).lead_ms() == 22_000
    assert _lead(clock, Counter({57: 200_000})).lead_ms() == 58_000  # the horizon less slack
    assert SAFETY == 1.25


async def test_the_rate_is_learned_while_a_herd_is_staged_or_the_brake_is_engaged() -> None:
    clock = FakeClock(1_000_000)
    lead = _lead(clock, Counter())
    lead.observe(0, brake_engaged=False)
    await clock.advance(1.0)
    lead.observe(5000, brake_engaged=False)
    assert lead.rate == RATE_GUESS  # not measured: nothing set the pace but the clock
    lead.observe(5000, brake_engaged=True)
    await clock.advance(1.0)
    lead.observe(5400, brake_engaged=True)
    assert lead.rate == 0.7 * RATE_GUESS + 0.3 * 400
