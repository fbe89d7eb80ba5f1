"""Pure placement: which live worker gets a run.

A worker fits when it is not draining, serves the run's tenant, has every label the run's selector
asks for, is not reserved for others (a *reserved* worker takes only runs
whose non-empty selector its labels match), and has free slots, cpu, memory
and gpu for the run. Among those that fit, prefer a worker other than the
one the last attempt ran on (a retry should move), then the one with the
most free slots.

Every path that puts a run on a worker (placement from the queue, firing
straight onto a worker) chooses through :func:`choose_worker`, so a rule
added here holds for all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, Protocol

from etcdsched.model.records import WorkerMember
from etcdsched.model.spec import Resources


class Sized(Protocol):
    """Anything with the four dimensions: a run's :class:`Resources`, a
    worker's ``Capacity``, or an :class:`Amount` computed from them."""

    @property
    def slots(self) -> int: ...
    @property
    def cpu(self) -> float: ...
    @property
    def memory_mb(self) -> int: ...
    @property
    def gpu(self) -> int: ...


class Amount(NamedTuple):
    """Sums and differences of resources (what a worker's runs take, what
    is free on it). Plain numbers, not a pydantic model: placement and a
    worker's reports add and subtract these for every run, and
    ``Resources.model_construct`` cost ten times a tuple."""

    slots: int
    cpu: float
    memory_mb: int
    gpu: int


@dataclass(frozen=True)
class WorkerView:
    """A worker and what is placed on it: the resources of each of its
    assignments (``assign/<worker>/``) as of store revision ``revision``.

    ``used`` is what they take in total, carried rather than summed so a
    view of a worker holding thousands of runs costs O(1) to make; it may
    also count runs chosen for the worker in this pass (:meth:`with_run`)
    and runs being written (``WorkerBatcher.planned``). ``runs`` may be a
    live mapping that is newer than ``revision``: the capacity compare
    (no assignment created after ``revision``) is what makes a placement
    safe, and newer contents only count deletes, which free room."""

    member: WorkerMember
    runs: Mapping[str, Resources]
    revision: int
    used: Amount | None = None
    """Total of ``runs`` (plus chosen ones); summed from ``runs`` if None."""

    def with_run(self, run_id: str, need: Sized) -> WorkerView:
        """This view with one more run chosen for the worker (same revision)."""
        return WorkerView(self.member, self.runs, self.revision, plus(self.total, need))

    @cached_property
    def total(self) -> Amount:
        return self.used if self.used is not None else total_of(self.runs.values())

    def free(self) -> Amount:
        """Cached: placement asks every view for it once per candidate run."""
        return self._free

    @cached_property
    def _free(self) -> Amount:
        used, cap = self.total, self.member.capacity
        return Amount(
            max(0, cap.slots - used.slots),
            max(0.0, cap.cpu - used.cpu),
            max(0, cap.memory_mb - used.memory_mb),
            max(0, cap.gpu - used.gpu),
        )


NOTHING = Amount(0, 0.0, 0, 0)


def plus(a: Sized, b: Sized, sign: int = 1) -> Amount:
    """``a + b`` (or ``a - b`` with ``sign=-1``)."""
    return Amount(
        a.slots + sign * b.slots,
        a.cpu + sign * b.cpu,
        a.memory_mb + sign * b.memory_mb,
        a.gpu + sign * b.gpu,
    )


def total_of(needs: Iterable[Sized]) -> Amount:
    items = list(needs)
    return Amount(
        sum(r.slots for r in items),
        sum(r.cpu for r in items),
        sum(r.memory_mb for r in items),
        sum(r.gpu for r in items),
    )


def fits(need: Sized, free: Sized, capacity: Sized) -> bool:
    """cpu/memory of 0 on a worker means "not tracked" (only slots count)."""
    if need.slots > free.slots or need.gpu > free.gpu:
        return False
    if capacity.cpu > 0 and need.cpu > free.cpu:
        return False
    return not (capacity.memory_mb > 0 and need.memory_mb > free.memory_mb)


def never_fits(
    need: Resources, selector: dict[str, str], tenant: str, workers: list[WorkerView]
) -> str:
    """Why no live worker could ever take the run (empty if one could)."""
    if not workers:
        return "no live worker"
    serving = [w for w in workers if serves(w.member.tenants, tenant)]
    if not serving:
        return f"no live worker serves tenant {tenant}"
    labelled = [w for w in serving if _labels_match(selector, w.member.labels)]
    if not labelled:
        return f"no worker that serves tenant {tenant} has labels {selector}"
    open_to_it = [w for w in labelled if takes_selector(w.member, selector)]
    if not open_to_it:
        return _only_reserved(tenant, labelled)
    if not any(fits(need, w.member.capacity, w.member.capacity) for w in open_to_it):
        return f"no worker has capacity for {need.model_dump()}"
    return ""


def _only_reserved(tenant: str, reserved: list[WorkerView]) -> str:
    """Why a run without a selector waits when every worker that serves its
    tenant is reserved: say what they are reserved for, so the fix (a
    selector, or an open worker) is plain."""
    labels = sorted({f"{k}={v}" for w in reserved for k, v in w.member.labels.items()})
    shown = ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else "")
    return (
        f"every live worker that serves tenant {tenant} is reserved for runs whose selector"
        f" matches its labels ({shown or 'none'}); this run has no selector"
    )


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def takes_selector(member: WorkerMember, selector: dict[str, str]) -> bool:
    """Whether the worker's reservation lets a run with ``selector`` on it
    (its labels are matched separately): an open worker takes any run, a
    reserved one only a run that selects workers (a run without a selector
    matches every worker's labels, so it must be turned away here)."""
    return bool(selector) or not member.reserved


def serves(tenants: list[str], tenant: str) -> bool:
    """Whether a worker declaring ``tenants`` takes runs of ``tenant``: a
    selector can never send a run to a worker that does not serve its tenant."""
    return "*" in tenants or tenant in tenants


def choose_worker(
    need: Resources,
    selector: dict[str, str],
    tenant: str,
    workers: list[WorkerView],
    avoid: str | None,
) -> WorkerView | None:
    """The worker to place a run on now, or None (it waits). Every rule of
    the module docstring is applied here, in one place, for every caller."""
    candidates = [
        w
        for w in workers
        if not w.member.draining
        and serves(w.member.tenants, tenant)
        and _labels_match(selector, w.member.labels)
        and takes_selector(w.member, selector)
        and fits(need, w.free(), w.member.capacity)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda w: (w.member.id != avoid, w.free().slots, w.member.id))
