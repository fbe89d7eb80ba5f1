"""Pure placement: which live worker gets a run.

A worker fits when it is not draining, has every label the run's selector
asks for, and has free slots, cpu, memory and gpu for the run. Among those
that fit, prefer a worker other than the one the last attempt ran on (a
retry should move), then the one with the most free slots.
"""

from __future__ import annotations

from dataclasses import dataclass

from etcdsched.models import LoadRecord, WorkerMember
from etcdsched.spec import Resources


@dataclass(frozen=True)
class WorkerView:
    member: WorkerMember
    load: LoadRecord
    load_revision: int

    def free(self) -> Resources:
        used_slots = sum(r.slots for r in self.load.runs.values())
        used_cpu = sum(r.cpu for r in self.load.runs.values())
        used_mem = sum(r.memory_mb for r in self.load.runs.values())
        used_gpu = sum(r.gpu for r in self.load.runs.values())
        cap = self.member.capacity
        return Resources(
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
