"""How far ahead a scheduler stages runs: the lookahead, or more when a
herd is coming (issue 28, ADR 0022).

Staging a run (firing it, placing it, its worker claiming it) goes at a
rate the pipeline can carry, here 600-1,900 runs/s. With a fixed 2 s
lookahead, 50,000 runs due at midnight are fired from 23:59:58 and the
last starts tens of seconds late, though the scheduler held them all in
memory for a minute. So each pass looks at what the owned partitions hold
within their horizon, second by second, and stages early enough that the
whole herd is staged by its instant at the measured rate:

    lead = lookahead + max over t of (staged-by-t / rate - t)

where staged-by-t counts the slots due within t seconds, capped at what
may be staged at all (the workers' capacity, and ``max_staged_runs`` so
etcd's space holds). Never more than the horizon. With no herd, the lead
is the lookahead: behaviour is as before.

The rate is measured: fired runs per second while the firing brake was
engaged, i.e. while placement, not firing, set the pace.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable

from etcdsched.runtime.clock import Clock

RATE_GUESS = 1000.0
"""Runs/s staged, before anything is measured (this machine: 600-1,900)."""
RATE_FLOOR = 100.0
SAFETY = 1.25
"""The lead is this much longer than the rate says: the rate is a guess."""
RECOMPUTE_MS = 1000
HORIZON_SLACK_MS = 2000
"""The lead stays this far inside the horizon, where the slots are known."""


class StagingLead:
    """The scheduler's current lead (see the module docstring)."""

    def __init__(
        self,
        clock: Clock,
        lookahead_ms: int,
        horizon_ms: int,
        profiles: Callable[[int], Iterable[Counter[int]]],
        capacity: Callable[[], int],
        max_staged: int,
    ) -> None:
        """``profiles(now_ms)``: per owned partition, slots due by whole
        seconds from now; ``capacity()``: the live workers' total slots."""
        self.clock = clock
        self.lookahead_ms = lookahead_ms
        self.max_ms = max(lookahead_ms, horizon_ms - HORIZON_SLACK_MS)
        self._profiles = profiles
        self._capacity = capacity
        self.max_staged = max_staged
        self.rate = RATE_GUESS
        self._lead_ms = lookahead_ms
        self._computed_at = -RECOMPUTE_MS
        self._fired_mark: tuple[int, int] | None = None

    def lead_ms(self) -> int:
        """The lead now, recomputed at most once a second."""
        now = self.clock.now_ms()
        if now - self._computed_at >= RECOMPUTE_MS:
            self._computed_at = now
            self._lead_ms = self._compute(now)
        return self._lead_ms

    def _compute(self, now_ms: int) -> int:
        due: Counter[int] = Counter()
        for profile in self._profiles(now_ms):
            due.update(profile)
        cap = min(self._capacity(), self.max_staged)
        need_s = herd_lead_s(due, self.rate, cap)
        if need_s <= 0:
            return self.lookahead_ms
        return min(self.max_ms, self.lookahead_ms + int(need_s * SAFETY * 1000))

    def observe(self, fired_total: int, brake_engaged: bool) -> None:
        """Fed the running total of fired runs on each firing pass; while
        the brake is engaged, their rate is the pipeline's."""
        now = self.clock.now_ms()
        if not brake_engaged:
            self._fired_mark = None
            return
        if self._fired_mark is None:
            self._fired_mark = (now, fired_total)
            return
        since, fired = self._fired_mark
        if now - since >= RECOMPUTE_MS:
            measured = (fired_total - fired) * 1000 / (now - since)
            self.rate = max(RATE_FLOOR, 0.7 * self.rate + 0.3 * measured)
            self._fired_mark = (now, fired_total)


def herd_lead_s(due_by_second: Counter[int], rate: float, cap: int) -> float:
    """Seconds beyond the lookahead needed to stage everything by its
    instant: max over t of (slots due within t, at most ``cap``) / rate - t."""
    need = 0.0
    offsets = sorted(due_by_second)
    counts = itertools.accumulate(due_by_second[t] for t in offsets)
    for offset, staged in zip(offsets, counts, strict=True):
        need = max(need, min(staged, cap) / rate - max(offset, 0))
    return need
