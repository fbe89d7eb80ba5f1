"""What a worker's batcher commits: placements of queued runs, and runs
fired straight onto the worker (ADR 0016).

A :class:`~etcdsched.scheduler.assigner.WorkerBatcher` writes many requests in one
transaction. Each request brings its own compares, its own operations, the
reads the batcher makes when the transaction fails, and the check of those
reads that says whether the request can still succeed; the batcher adds
the partitions' owner guards and the worker's epoch compares once.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from etcdsched.model.records import ActivePointer, RunRecord
from etcdsched.model.statemachine import assign_attempt, transition
from etcdsched.model.states import RunState
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Cmp, Compare, Op, Ops, Versioned, holds
from etcdsched.store.runs import new_assignment

ASSIGNED = "assigned"
"""The run is on the worker (run, assignment and active pointer written)."""
FULL = "full"
"""The worker had no room for the run when its batch was written."""
CONFLICT = "conflict"
"""Something a compare looked at changed (the run, its due entry, its job,
or the partition's ownership); the requester re-reads."""
GONE = "gone"
"""The worker's assignment epoch is gone, so its member key is too (it
left or its lease expired)."""
UNKNOWN = "unknown"
"""The transaction's outcome is unknown; the requester re-reads."""

ASSIGN_OPS = 3
"""Puts per placed run: the run, its assignment, its active pointer."""


def _future() -> asyncio.Future[str]:
    return asyncio.get_running_loop().create_future()


def assignment_ops(
    keys: Keys, run: RunRecord, worker: str, now_ms: int
) -> tuple[RunRecord, list[Op]]:
    """Store ``run`` (pending or retry_wait) as assigned to ``worker``: the
    run as stored, and exactly ``ASSIGN_OPS`` puts (the run with a new
    attempt, its assignment, and its active pointer naming the worker and
    attempt)."""
    if run.state is RunState.RETRY_WAIT:
        run = transition(run, RunState.PENDING, now_ms)
    assigned = assign_attempt(run, worker, now_ms).model_copy(update={"queue_key": None})
    assignment = new_assignment(assigned, max(run.not_before_ms, run.retry_at_ms or 0))
    pointer = ActivePointer(run_id=run.id, worker=worker, attempt=assigned.attempt)
    return assigned, [
        Ops.put(keys.run(run.id), assigned),
        Ops.put(keys.assign(worker, run.id), assignment),
        Ops.put(keys.active(run.partition, run.id), pointer),
    ]


@dataclass
class BatchRequest(ABC):
    """One run for one worker's batcher, and the future its requester awaits."""

    partition: int
    guard: Compare
    """*We still own the partition* (owner key ``create_revision``)."""
    now_ms: int
    done: asyncio.Future[str] = field(default_factory=_future, init=False)
    revision: int = field(default=0, init=False)
    """The revision of the transaction that wrote it, once ``ASSIGNED``."""

    @property
    @abstractmethod
    def run(self) -> RunRecord:
        """The run as it is before the batcher writes it (its id, its needs)."""

    @property
    @abstractmethod
    def key(self) -> str:
        """The run's key: one request per run key in a transaction."""

    @abstractmethod
    def cost(self) -> int:
        """How many operations :meth:`ops` makes, counted without building them."""

    @abstractmethod
    def compares(self) -> list[Compare]:
        """The request's own compares (besides the guard and the epoch)."""

    @abstractmethod
    def ops(self, keys: Keys, worker: str) -> list[Op]:
        """What the request writes when the worker takes it."""

    def reads(self) -> list[Op]:
        """What the failure branch reads back: the key of each compare."""
        return [Ops.get(c.key) for c in self.compares()]

    def still_possible(self, responses: list[list[KV]]) -> bool:
        """From the answers to :meth:`reads`: every compare of
        :meth:`compares` would hold again."""
        return all(holds(c, kvs) for c, kvs in zip(self.compares(), responses, strict=True))

    def resolve(self, outcome: str) -> None:
        if not self.done.done():
            self.done.set_result(outcome)


@dataclass
class AssignRequest(BatchRequest):
    """Place a run that waits in the queue. Compare: *the run is unchanged
    since the placer read it* (``mod_revision``)."""

    current: Versioned[RunRecord] = field(kw_only=True)

    @property
    def run(self) -> RunRecord:
        return self.current.value

    @property
    def key(self) -> str:
        return self.current.key

    def cost(self) -> int:
        return ASSIGN_OPS + (1 if self.current.value.queue_key else 0)

    def compares(self) -> list[Compare]:
        return [Cmp.mod(self.current.key, self.current.mod_revision)]

    def ops(self, keys: Keys, worker: str) -> list[Op]:
        """The assignment, and the delete of the run's queue entry."""
        queue_key = self.current.value.queue_key
        release = [Ops.delete(queue_key)] if queue_key else []
        _, ops = assignment_ops(keys, self.current.value, worker, self.now_ms)
        return [*ops, *release]


@dataclass
class FireRequest(BatchRequest):
    """Fire one due entry whose plan is one run straight onto the worker.

    Compares: the firing's own, as the firer built them: *the due entry is
    unchanged* (``mod``), *the job is the version the entry was computed
    from* (``version`` of the job key) and *the run was never created* (run
    key absent). Ops: the run assigned, its assignment, its active pointer,
    and the entry's own writes (its delete, the next entry and due pointer)."""

    pending: RunRecord = field(kw_only=True)
    run_key: str = field(kw_only=True)
    due: KV = field(kw_only=True)
    """The due entry it fires, as the firer read it."""
    firing: list[Compare] = field(kw_only=True)
    """The firing's compares (see above)."""
    entry_ops: list[Op] = field(kw_only=True)
    stored: RunRecord | None = field(default=None, init=False)
    """The run as last written onto the worker (set by :meth:`ops`)."""

    @property
    def run(self) -> RunRecord:
        return self.pending

    @property
    def key(self) -> str:
        return self.run_key

    def cost(self) -> int:
        return ASSIGN_OPS + len(self.entry_ops)

    def compares(self) -> list[Compare]:
        return self.firing

    def ops(self, keys: Keys, worker: str) -> list[Op]:
        self.stored, ops = assignment_ops(keys, self.pending, worker, self.now_ms)
        return [*ops, *self.entry_ops]
