"""PrefixCache's per-group view stays equal to grouping ``items`` afresh,
through puts, deletes and re-lists (the firer and placer rely on it)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from etcdsched.model.records import ActivePointer
from etcdsched.runtime.clock import FakeClock
from etcdsched.store.cache import PrefixCache
from etcdsched.store.horizon_cache import HorizonCache
from etcdsched.store.kv import KV, Event, Store


def kv(key: str, rev: int) -> KV:
    return KV(key, b"{}", rev, rev, 1)


def by_job(key: str) -> str:
    return key.split("/")[1]


def regrouped(cache: PrefixCache) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for key in cache.items:
        groups.setdefault(by_job(key), set()).add(key)
    return groups


def views(cache: PrefixCache, names: set[str]) -> dict[str, set[str]]:
    return {name: set(cache.group(name)) for name in names if cache.group(name)}


def test_groups_follow_puts_and_deletes() -> None:
    cache = PrefixCache(cast(Store, None), FakeClock(0), "a/", group_by=by_job)
    events = [
        Event("put", kv("a/j1/1", 1)),
        Event("put", kv("a/j1/2", 2)),
        Event("put", kv("a/j2/1", 3)),
        Event("delete", kv("a/j1/1", 4)),
        Event("put", kv("a/j2/1", 5)),
        Event("delete", kv("a/j3/9", 6)),  # never seen: harmless
    ]
    for event in events:
        cache.apply(event)
        assert views(cache, {"j1", "j2", "j3"}) == regrouped(cache)
    assert set(cache.group("j1")) == {"a/j1/2"}
    assert cache.group("j3") == {}


def test_relist_rebuilds_groups() -> None:
    cache = PrefixCache(cast(Store, None), FakeClock(0), "a/", group_by=by_job)
    cache.apply(Event("put", kv("a/j1/1", 1)))
    cache.items = {"a/j2/1": kv("a/j2/1", 2)}
    cache._regroup()
    assert cache.group("j1") == {} and set(cache.group("j2")) == {"a/j2/1"}


def test_group_without_group_by_is_a_programming_error() -> None:
    cache: Any = PrefixCache(cast(Store, None), FakeClock(0), "a/")
    with pytest.raises(TypeError):
        cache.group("j1")


def pointer_kv(key: str, rev: int, run_id: str) -> KV:
    return KV(key, ActivePointer(run_id=run_id).model_dump_json().encode(), rev, rev, 1)


def test_decoded_values_follow_revisions_and_are_decoded_once_each() -> None:
    cache = PrefixCache(cast(Store, None), FakeClock(0), "a/")
    cache.apply(Event("put", pointer_kv("a/1", 1, "r1")))
    cache.apply(Event("put", pointer_kv("a/2", 2, "r2")))
    first = cache.decoded(ActivePointer)
    assert [p.run_id for p in first] == ["r1", "r2"]
    again = cache.decoded(ActivePointer)
    assert again[0] is first[0] and again[1] is first[1]  # same revisions: not decoded again
    cache.apply(Event("put", pointer_kv("a/2", 3, "r2b")))
    cache.apply(Event("delete", pointer_kv("a/1", 4, "r1")))
    assert [p.run_id for p in cache.decoded(ActivePointer)] == ["r2b"]


def test_a_horizon_window_listed_ahead_of_the_watch_skips_its_older_events() -> None:
    """Events still buffered when a window was listed at a later revision
    are in the listing already: applying them would show older keys."""
    cache = HorizonCache(
        cast(Store, None),
        FakeClock(0),
        "a/",
        horizon_end=lambda: "a/~",
        keep=lambda key: True,
        extend_every=1,
        relist_every=300,
        group_by=by_job,
    )
    cache.put_item(kv("a/j5/1", 10))  # listed at revision 10 in the window [a/j5, a/j7)
    cache._floors = [("a/j5", "a/j7", 10)]
    cache.apply(Event("delete", kv("a/j5/1", 9)))  # older than the listing: skipped
    cache.apply(Event("put", kv("a/j6/1", 8)))  # created then deleted before 10: skipped
    cache.apply(Event("put", kv("a/j2/1", 9)))  # outside the window: applied
    cache.apply(Event("put", kv("a/j6/2", 11)))  # after the listing: applied
    assert set(cache.items) == {"a/j5/1", "a/j2/1", "a/j6/2"}
    assert cache.revision == 11
