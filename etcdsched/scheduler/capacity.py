"""What is placed on each worker, as the scheduler knows it from the
assignments (``assign/<worker>/<run>``): the resources of each run, and
each worker's total kept up to date as assignments come and go."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from etcdsched.model.codec import CorruptRecord
from etcdsched.model.placement import NOTHING, Amount, WorkerView, plus
from etcdsched.model.records import Assignment
from etcdsched.model.spec import Resources
from etcdsched.store.keys import Keys
from etcdsched.store.kv import KV, Event

log = logging.getLogger(__name__)


def with_assignments(view: WorkerView, kvs: list[KV], revision: int) -> WorkerView:
    """``view`` with the worker's assignments as read at ``revision``."""
    runs = dict(run_resources(kv) for kv in kvs)
    return WorkerView(view.member, runs, revision)


FILLS_A_WORKER = Resources.model_construct(slots=10**9, cpu=1e9, memory_mb=10**12, gpu=10**6)


def run_resources(kv: KV) -> tuple[str, Resources]:
    """The run an assignment is for and what it takes; one that does not
    decode fills its worker (never under-count a worker's load)."""
    try:
        assignment = kv.decode(Assignment).value
    except CorruptRecord as exc:
        log.error("%s; its worker counts as full", exc)
        return kv.key, FILLS_A_WORKER
    return assignment.run_id, assignment.resources


class CapacityIndex:
    """What is placed on each worker, decoded once per change from the
    scheduler's cache of ``assign/`` (fed by its ``on_event``), with each
    worker's total kept up to date as assignments come and go."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self._runs: dict[str, dict[str, Resources]] = {}
        self._used: dict[str, Amount] = {}

    def on_event(self, event: Event) -> None:
        """Never raises: the cache would die with it, and relisting past an
        assignment the index lacks would let the capacity compare pass on a
        full worker. A key or value that does not decode counts as filling
        its worker."""
        try:
            worker, rid = self.keys.parse_assign(event.kv.key)
        except ValueError:
            log.error("assignment key %s does not parse; ignored", event.kv.key)
            return
        runs = self._runs.setdefault(worker, {})
        used = self._used.get(worker, NOTHING)
        before = runs.pop(rid, None)
        if before is not None:
            used = plus(used, before, -1)
        if event.kind != "delete":
            runs[rid] = run_resources(event.kv)[1]
            used = plus(used, runs[rid])
        self._used[worker] = used

    def runs(self, worker: str) -> Mapping[str, Resources]:
        """The worker's runs and their resources, live (see ``WorkerView``)."""
        return self._runs.get(worker, {})

    def used(self, worker: str) -> Amount:
        """What the worker's runs take in total."""
        return self._used.get(worker, NOTHING)
