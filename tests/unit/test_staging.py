"""The staging lead: the lookahead with no herd; early enough, at the
measured rate, for a herd to be staged by its instant; bounded by the
horizon, the capacity and the staged-runs ceiling."""

from __future__ import annotations

from collections import Counter

from etcdsched.runtime.clock import FakeClock
from etcdsched.scheduler.staging import SAFETY, StagingLead, herd_lead_s


def test_no_herd_needs_nothing_beyond_the_lookahead() -> None:
    assert herd_lead_s(Counter({5: 10, 30: 20}), rate=1000, cap=10**6) == 0


def test_a_herd_needs_its_size_over_the_rate_minus_the_time_left() -> None:
    assert herd_lead_s(Counter({20: 50_000}), rate=1000, cap=10**6) == 30.0
    # what may be staged at all bounds it
    assert herd_lead_s(Counter({20: 50_000}), rate=1000, cap=25_000) == 5.0
    # an earlier smaller herd is counted in the later one's backlog
    assert herd_lead_s(Counter({2: 3000, 10: 9000}), rate=1000, cap=10**6) == 2.0


def _lead(clock: FakeClock, due: Counter[int], capacity: int = 10**6) -> StagingLead:
    return StagingLead(clock, 2000, 60_000, lambda now: [due], lambda: capacity, 250_000)


def test_the_lead_is_the_lookahead_unless_a_herd_comes_and_stays_inside_the_horizon() -> None:
    clock = FakeClock(1_000_000)
    assert _lead(clock, Counter({1: 100})).lead_ms() == 2000
    herd = _lead(clock, Counter({40: 20_000}))
    assert herd.lead_ms() == 2000  # 20 s of staging, 40 s left: nothing to do yet
    big = _lead(clock, Counter({40: 50_000}))
    assert big.lead_ms() == 2000 + int((50 - 40) * SAFETY * 1000)
    huge = _lead(clock, Counter({40: 200_000}))
    assert huge.lead_ms() == 58_000  # the horizon less its slack


async def test_the_rate_is_learned_while_the_brake_is_engaged_only() -> None:
    clock = FakeClock(1_000_000)
    lead = _lead(clock, Counter())
    lead.observe(0, brake_engaged=False)
    await clock.advance(1.0)
    lead.observe(5000, brake_engaged=False)
    assert lead.rate == 1000  # not measured: firing was not the bottleneck's pace
    lead.observe(5000, brake_engaged=True)
    await clock.advance(1.0)
    lead.observe(5400, brake_engaged=True)
    assert lead.rate == 0.7 * 1000 + 0.3 * 400
