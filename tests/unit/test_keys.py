"""Every key family: build, parse back, and sort in time order."""

from __future__ import annotations

import pytest

from etcdsched.store.keys import KeyError_, Keys, parse_run_id, partition_of, run_id, run_seq

K = Keys("/p/")
RID = run_id("nightly.backup", run_seq(1_767_225_600_000))
MANUAL = run_id("job-1", run_seq(1_767_225_600_000, "m3"))


def test_prefix_must_be_a_directory() -> None:
    with pytest.raises(KeyError_):
        Keys("p/")


def test_job_round_trip() -> None:
    assert K.parse_job(K.job("job-1")) == "job-1"


def test_due_round_trip_and_order() -> None:
    key = K.due(7, 1_767_225_600_000, "job-1")
    assert key == "/p/due/007/01767225600000/job-1"
    parsed = K.parse_due(key)
    assert (parsed.partition, parsed.slot_ms, parsed.job_id) == (7, 1_767_225_600_000, "job-1")
    assert K.due(7, 999, "z") < K.due(7, 1000, "a") < K.due_until(7, 1000)
    assert K.due(7, 1001, "a") >= K.due_until(7, 1000)


def test_run_round_trip() -> None:
    for rid in (RID, MANUAL):
        ref = K.parse_run(K.run(rid))
        assert ref.run_id == rid
    assert parse_run_id(MANUAL).slot_ms == 1_767_225_600_000
    with pytest.raises(KeyError_):
        parse_run_id("no-at-sign")


def test_active_round_trip_and_job_prefix() -> None:
    key = K.active(3, RID)
    assert key.startswith(K.active_prefix(3, "nightly.backup"))
    pp, ref = K.parse_active(key)
    assert pp == 3 and ref.run_id == RID


def test_queue_round_trip_and_priority_order() -> None:
    high = K.queue(1, 900, 5000, RID)
    low = K.queue(1, 100, 1000, MANUAL)
    assert high < low
    parsed = K.parse_queue(high)
    assert (parsed.partition, parsed.rank, parsed.not_before_ms, parsed.run_id) == (
        1,
        99,
        5000,
        RID,
    )


def test_members_owners_assign_claims_skips() -> None:
    assert K.parse_owner(K.owner(12)) == 12
    assert K.parse_member("workers", K.member("workers", "w-1")) == "w-1"
    with pytest.raises(KeyError_):
        K.members_prefix("cooks")
    assert K.parse_assign(K.assign("w-1", RID)) == ("w-1", RID)
    assert K.parse_claim(K.claim(4, RID)) == (4, RID)
    assert K.parse_skip(K.skip("job-1", 42)) == ("job-1", 42)


def test_partition_is_stable_and_in_range() -> None:
    assert partition_of("job-1", 64) == partition_of("job-1", 64)
    spread = {partition_of(f"job-{i}", 8) for i in range(200)}
    assert spread == set(range(8))


def test_out_of_range_components_are_refused() -> None:
    with pytest.raises(KeyError_):
        K.owner(1000)
    with pytest.raises(KeyError_):
        run_seq(-1)
