"""Pure placement: which live worker gets a run.

A worker fits when it is not draining, has every label the run's selector
asks for, and has free slots, cpu, memory and gpu for the run. Among those
that fit, prefer a worker other than the one the last attempt ran on (a
retry should move), then the one with the most free slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from etcdsched.models import WorkerMember
from etcdsched.spec import Capacity, Resources


@dataclass(frozen=True)
class WorkerView:
    """A worker and what is placed on it: the resources of each of its
    assignments (``assign/<worker>/``) as of store revision ``revision``."""

    member: WorkerMember
    runs: dict[str, Resources]
    revision: int

    def with_run(self, run_id: str, need: Resources) -> WorkerView:
        """This view with one more run on the worker (same revision)."""
        view = WorkerView(self.member, {**self.runs, run_id: need}, self.revision)
        free = self.free()
        left = Capacity.model_construct(
            slots=max(0, free.slots - need.slots),
            cpu=max(0.0, free.cpu - need.cpu),
            memory_mb=max(0, free.memory_mb - need.memory_mb),
            gpu=max(0, free.gpu - need.gpu),
        )
        object.__setattr__(view, "_free", left)  # seed the cache: no re-summing
        return view

    def free(self) -> Capacity:
        """Cached: placement asks every view for it once per candidate run.
        Built unvalidated: the values are differences of validated ones."""
        return self._free

    @cached_property
    def _free(self) -> Capacity:
        used = self.runs.values()
        used_slots = sum(r.slots for r in used)
        used_cpu = sum(r.cpu for r in used)
        used_mem = sum(r.memory_mb for r in used)
        used_gpu = sum(r.gpu for r in used)
        cap = self.member.capacity
        return Capacity.model_construct(
            slots=max(0, cap.slots - used_slots),
            cpu=max(0.0, cap.cpu - used_cpu),
            memory_mb=max(0, cap.memory_mb - used_mem),
            gpu=max(0, cap.gpu - used_gpu),
        )


def fits(need: Resources, free: Resources, capacity: Resources) -> bool:
    """cpu/memory of 0 on a worker means "not tracked" (only slots count)."""
    if need.slots > free.slots or need.gpu > free.gpu:
        return False
    if capacity.cpu > 0 and need.cpu > free.cpu:
        return False
    return not (capacity.memory_mb > 0 and need.memory_mb > free.memory_mb)


def never_fits(need: Resources, selector: dict[str, str], workers: list[WorkerView]) -> str:
    """Why no live worker could ever take the run (empty if one could)."""
    if not workers:
        return "no live worker"
    labelled = [w for w in workers if _labels_match(selector, w.member.labels)]
    if not labelled:
        return f"no worker has labels {selector}"
    if not any(fits(need, w.member.capacity, w.member.capacity) for w in labelled):
        return f"no worker has capacity for {need.model_dump()}"
    return ""


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def choose_worker(
    need: Resources, selector: dict[str, str], workers: list[WorkerView], avoid: str | None
) -> WorkerView | None:
    candidates = [
        w
        for w in workers
        if not w.member.draining
        and _labels_match(selector, w.member.labels)
        and fits(need, w.free(), w.member.capacity)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda w: (w.member.id != avoid, w.free().slots, w.member.id))
