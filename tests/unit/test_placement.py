"""Pure placement (``etcdsched.model.placement``): which worker a run goes to,
and why none could ever take it. Reserved workers (issue 29): a reserved
worker takes only runs whose non-empty selector its labels match."""

from __future__ import annotations

from etcdsched.model.placement import WorkerView, choose_worker, never_fits
from etcdsched.model.records import WorkerMember
from etcdsched.model.spec import Capacity, Resources

ONE = Resources()
GPU = {"pool": "gpu"}


def view(
    name: str, labels: dict[str, str] | None = None, *, reserved: bool = False, slots: int = 4
) -> WorkerView:
    member = WorkerMember(
        id=name,
        capacity=Capacity(slots=slots),
        labels=labels or {},
        reserved=reserved,
        started_ms=0,
    )
    return WorkerView(member, {}, 0)


def chosen(selector: dict[str, str], workers: list[WorkerView]) -> str | None:
    worker = choose_worker(ONE, selector, "default", workers, None)
    return worker.member.id if worker is not None else None


def test_a_run_without_a_selector_never_lands_on_a_reserved_worker() -> None:
    workers = [view("reserved", GPU, reserved=True, slots=100), view("open", slots=1)]
    assert chosen({}, workers) == "open"  # even though the reserved one has more room
    assert chosen({}, workers[:1]) is None


def test_a_reserved_worker_takes_runs_whose_selector_its_labels_match() -> None:
    reserved = view("reserved", {"pool": "gpu", "zone": "a"}, reserved=True)
    assert chosen(GPU, [reserved]) == "reserved"
    assert chosen({"pool": "gpu", "zone": "a"}, [reserved]) == "reserved"
    assert chosen({"pool": "cpu"}, [reserved]) is None
    assert chosen({"pool": "gpu", "zone": "b"}, [reserved]) is None


def test_an_open_worker_with_the_labels_takes_both_kinds_of_run() -> None:
    labelled = view("labelled", GPU)
    assert chosen(GPU, [labelled]) == "labelled"
    assert chosen({}, [labelled]) == "labelled"


def test_a_selecting_run_may_go_to_a_reserved_or_an_open_matching_worker() -> None:
    workers = [view("reserved", GPU, reserved=True, slots=1), view("open", GPU, slots=3)]
    assert chosen(GPU, workers) == "open"  # most free slots, reservation or not
    full_open = [workers[0], view("open", GPU, slots=0)]
    assert chosen(GPU, full_open) == "reserved"


def test_never_fits_says_when_every_worker_is_reserved_for_runs_that_select_it() -> None:
    workers = [view("r1", GPU, reserved=True), view("r2", {"pool": "fpga"}, reserved=True)]
    why = never_fits(ONE, {}, "default", workers)
    assert "reserved" in why and "no selector" in why, why
    assert "pool=gpu" in why and "pool=fpga" in why, why


def test_never_fits_is_silent_when_a_reserved_worker_could_take_the_run() -> None:
    assert never_fits(ONE, GPU, "default", [view("r1", GPU, reserved=True)]) == ""
    assert never_fits(ONE, {}, "default", [view("r1", GPU, reserved=True), view("open")]) == ""


def test_never_fits_still_names_missing_labels_first() -> None:
    why = never_fits(ONE, {"pool": "tpu"}, "default", [view("r1", GPU, reserved=True)])
    assert why == "no worker that serves tenant default has labels {'pool': 'tpu'}"


def test_a_member_record_of_an_older_worker_is_open() -> None:
    old = WorkerMember.model_validate_json(
        '{"id": "w0", "capacity": {"slots": 1}, "started_ms": 0}'
    )
    assert old.reserved is False
