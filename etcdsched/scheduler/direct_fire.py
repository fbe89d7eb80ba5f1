"""Firing a run straight onto a worker with room (ADR 0016).

Below saturation a fired run finds a worker with room at once, and placing
it from the queue cost four more writes and three more watch events than
the run itself needs. So when a firing batch holds entries whose plan is
one run that placement would place at once, each such run is handed to a
worker's :class:`~etcdsched.scheduler.assigner.WorkerBatcher` as a
:class:`~etcdsched.scheduler.assign_requests.FireRequest`: it is created ``assigned``
with its assignment, in the transaction that deletes its due entry. Every
other entry fires into the queue as before, and so does one whose worker
turned out full or gone.

A run may go straight onto a worker only when nothing waits for placement
in this scheduler: no fired run that placement has not looked at, and no
ready run that the last placement pass left waiting for room. So a run
waiting for room keeps its turn (priority, then not-before). The one gap:
a run queued by someone else (a retry, a hand-back) is not known to be
waiting until the next pass looks at it, and a run fired in that moment
(at most the 50 ms gathering wait) may take the slot it would have got;
that pass then finds it waiting, and firing goes to the queue again.
"""

from __future__ import annotations

import asyncio
import logging

from etcdsched.model.placement import WorkerView, choose_worker
from etcdsched.model.records import RunRecord
from etcdsched.scheduler.assign_requests import FireRequest
from etcdsched.scheduler.assigner import Assigner
from etcdsched.scheduler.firing_conflicts import EntryWrite
from etcdsched.scheduler.placement_loop import PlacementLoop
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Compare
from etcdsched.store.runs import starting_deadline_ms

log = logging.getLogger(__name__)


def lone_run(write: EntryWrite, now_ms: int) -> RunRecord | None:
    """The run ``write`` creates, when placement would place it at once:
    the plan is exactly one run, the job's overlap policy is ``allow`` (no
    active-run compare, no run to cancel), it depends on no other job, and
    its starting deadline has not passed."""
    if len(write.unqueued) != 1 or write.cancel_after:
        return None
    run = write.unqueued[0]
    if run.spec.overlap != "allow" or run.spec.depends_on:
        return None
    deadline = starting_deadline_ms(run)
    if deadline is not None and now_ms > deadline:
        return None
    return run


DirectFiring = list[tuple[int, FireRequest, "asyncio.Task[str]"]]
"""Entries of a batch handed to batchers: index in the batch, the request,
and the task that awaits its outcome."""


class DirectPlacement:
    """One scheduler's chooser of workers for runs as they are fired."""

    def __init__(self, placement: PlacementLoop, assigner: Assigner, keys: Keys) -> None:
        self.placement = placement
        self.assigner = assigner
        self.keys = keys

    def fire(
        self, chunk: list[tuple[KV, EntryWrite]], partition: int, guard: Compare, now_ms: int
    ) -> DirectFiring:
        """Hand every entry of ``chunk`` that may go straight onto a worker
        to that worker's batcher; the others are left to the caller."""
        if not self.placement.may_place_at_fire():
            return []
        views = self.placement.worker_views()
        sent: DirectFiring = []
        for index, (kv, write) in enumerate(chunk):
            run = lone_run(write, now_ms)
            worker = None if run is None else self._choose(run, views)
            if run is None or worker is None:
                continue
            request = FireRequest(
                partition,
                guard,
                now_ms,
                pending=run,
                run_key=self.keys.run(run.id),
                due=kv,
                firing=write.compares,
                entry_ops=write.ops,
            )
            task = asyncio.ensure_future(self.assigner.assign(worker, request))
            sent.append((index, request, task))
        return sent

    @staticmethod
    def _choose(run: RunRecord, views: dict[str, WorkerView]) -> WorkerView | None:
        """A worker with room for ``run``, counted as taken in ``views``."""
        need = run.spec.resources
        worker = choose_worker(need, run.spec.selector, run.tenant, list(views.values()), None)
        if worker is not None:
            views[worker.member.id] = worker.with_run(run.id, need)
        return worker
