"""Retention trims at most ``TRIMS_PER_SECOND`` jobs a second: a herd of
one-off jobs ends a thousand runs a second, each of its own job, and
trimming every one as it ended doubled etcd's reads while the herd drained."""

from __future__ import annotations

from typing import cast

from etcdsched.scheduler.retention import TRIMS_PER_SECOND, RetentionSweeper
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Store


def test_the_trim_budget_is_a_second_worth_refilled_with_time() -> None:
    sweeper = RetentionSweeper(cast(Store, None), Keys("/t/"), None)
    now = 1_800_000_000_000
    taken = sum(sweeper._take_trim(now) for _ in range(TRIMS_PER_SECOND + 50))
    assert taken == TRIMS_PER_SECOND
    assert not sweeper._take_trim(now + 1)
    taken = sum(sweeper._take_trim(now + 500) for _ in range(TRIMS_PER_SECOND))
    assert taken == TRIMS_PER_SECOND // 2
    taken = sum(sweeper._take_trim(now + 60_000) for _ in range(3 * TRIMS_PER_SECOND))
    assert taken == TRIMS_PER_SECOND  # an idle minute does not save up more than a second
