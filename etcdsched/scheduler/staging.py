"""How far ahead a scheduler stages runs: the lookahead, or more when a
herd is coming (issue 28, ADR 0022).

Staging a run (firing it, placing it, its worker claiming it) goes at a
rate the pipeline can carry, here 600-1,900 runs/s. With a fixed 2 s
lookahead, 50,000 runs due at midnight are fired from 23:59:58 and the
last starts tens of seconds late, though the scheduler held them all in
memory for a minute. So once a second the scheduler looks at what its
partitions hold within their horizon, second by second, and fires early
enough that the whole herd is staged by its instant at the measured rate:
the lead reaches past the furthest second ``t`` for which

    (slots due within t) * 1.25 / rate >= t - lookahead

that is, whose backlog can no longer wait, and everything up to it is
fired, in slot order. The slots counted are capped at what may be staged
at all (the workers' capacity, and ``max_staged_runs`` so etcd's space
holds). Never more than the horizon less two seconds (what is surely in
memory: the horizon moves every second, ``HorizonCache``). With no herd,
the lead is the lookahead: behaviour is as before.

The rate is measured: fired runs per second while a herd was being staged
(the lead beyond the lookahead) or the firing brake was engaged: then the
pipeline, not the clock, set the pace. Staging that is ahead of its need
fires slower than it could, so the measure errs low, and a low rate only
stages earlier.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable

from etcdsched.runtime.clock import Clock

RATE_GUESS = 300.0
"""Runs/s staged, before anything is measured (this machine: 600-1,900
with an agent per process, about 290 with the scheduler and worker in the
tests' one process, 270 for a million at once); low on purpose: too low
stages early, too high stages late."""
RATE_FLOOR = 100.0
SAFETY = 1.25
"""Staging is planned at the rate divided by this: the rate is a guess."""
RECOMPUTE_MS = 1000
MIN_WORK_MS = 1000
"""A backlog of less staging work than this is no herd: the lookahead does."""
HORIZON_SLACK_MS = 2000
"""The lead stays this far inside the horizon: the due index held moves
its horizon every second (``etcdsched.store.horizon_cache``), so the last
second or two of it may not be in memory yet."""


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
        return min(self.max_ms, herd_lead_ms(due, self.rate / SAFETY, cap, self.lookahead_ms))

    def observe(self, fired_total: int, brake_engaged: bool) -> None:
        """Fed the running total of fired runs, twice a second; while a herd
        is staged or the brake is engaged, their rate is the pipeline's."""
        now = self.clock.now_ms()
        if not brake_engaged and self._lead_ms <= self.lookahead_ms:
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


def herd_lead_ms(due_by_second: Counter[int], rate: float, cap: int, lookahead_ms: int) -> int:
    """How far ahead to fire now: past the furthest second ``t`` whose
    backlog (slots due within ``t``, at most ``cap``) takes longer to stage
    at ``rate`` than the time left before it, ``t`` less the lookahead;
    so from then on everything up to that second is staged, in slot order.
    Never less than the lookahead. ``due_by_second`` counts slots by whole
    seconds left, rounded down and a second less (``herd_profile``): the
    lead reaches two seconds past the offset, beyond the herd's own
    instant. (Reaching one second past, the first version stopped short of
    it, and the herd waited for the lookahead after all.)"""
    lead_ms = lookahead_ms
    offsets = sorted(due_by_second)
    backlogs = itertools.accumulate(due_by_second[t] for t in offsets)
    for offset, backlog in zip(offsets, backlogs, strict=True):
        work_ms = min(backlog, cap) / rate * 1000
        if work_ms >= max(offset * 1000 - lookahead_ms, MIN_WORK_MS):
            lead_ms = max(lead_ms, (offset + 2) * 1000)
    return lead_ms
