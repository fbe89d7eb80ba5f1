"""Which fired runs may go straight onto a worker (ADR 0016), pure."""

from __future__ import annotations

from typing import Any

from etcdsched.model.spec import JobSpec
from etcdsched.scheduler.direct_fire import lone_run
from etcdsched.scheduler.firing_conflicts import EntryWrite
from etcdsched.store.keys import Keys
from etcdsched.store.runs import RunOps, RunOrigin, new_run

SLOT_MS = 1_800_000_000_000


def write_for(count: int = 1, **spec_fields: Any) -> EntryWrite:
    spec = JobSpec.model_validate(
        {"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}, **spec_fields}
    )
    runs = [
        new_run(RunOrigin("j", spec, 1), SLOT_MS + i * 1000, SLOT_MS - 2000, 4)
        for i in range(count)
    ]
    return EntryWrite(RunOps(Keys("/t/")), unqueued=runs)


def test_a_lone_run_of_an_allow_job_goes_straight_onto_a_worker() -> None:
    write = write_for()
    assert lone_run(write, SLOT_MS - 2000) is write.unqueued[0]


def test_catch_up_dependencies_overlap_rules_and_cancels_go_through_the_queue() -> None:
    now = SLOT_MS - 2000
    assert lone_run(write_for(count=2), now) is None  # catch-up: several runs
    assert lone_run(write_for(count=0), now) is None  # every slot skipped
    assert lone_run(write_for(depends_on=["upstream"]), now) is None
    for overlap in ("skip", "queue_one", "cancel_previous"):
        assert lone_run(write_for(overlap=overlap), now) is None
    cancelling = write_for()
    cancelling.cancel_after = ["j@older"]
    assert lone_run(cancelling, now) is None


def test_a_run_past_its_starting_deadline_is_left_to_placement_to_skip() -> None:
    write = write_for(starting_deadline="1s")
    assert lone_run(write, SLOT_MS) is write.unqueued[0]
    assert lone_run(write, SLOT_MS + 1001) is None
