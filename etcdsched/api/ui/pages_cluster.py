"""The cluster page (admin): schedulers and the partitions each owns,
workers with their capacity used and free per dimension, the queue, start
lag over the last minutes and the firing brake.

Members, owners and the queue come from the JSON cluster view
(:func:`~etcdsched.api.routes_cluster.cluster_view`) behind the same admin
check. Used capacity is what the schedulers count too: the sum of each
worker's assignments (design.md, "Capacity"), one range over ``assign/``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from etcdsched.api import routes_cluster
from etcdsched.api.services import ApiServices
from etcdsched.api.ui.recent import WINDOW_MS, RecentMetrics
from etcdsched.api.ui.session import View, page
from etcdsched.model.codec import CorruptRecord
from etcdsched.model.placement import NOTHING, Amount, plus
from etcdsched.model.records import Assignment, WorkerMember
from etcdsched.model.spec import Resources
from etcdsched.store.kv import prefix_end

RECENT = web.AppKey("etcdsched_ui_recent", RecentMetrics)


@dataclass
class Dimension:
    name: str
    used: float
    total: float
    tracked: bool = True
    """False for cpu or memory of 0: the worker does not track it."""

    @property
    def free(self) -> float:
        return max(0.0, self.total - self.used)

    @property
    def percent(self) -> int:
        return min(100, round(100 * self.used / self.total)) if self.total else 0


@dataclass
class WorkerRow:
    worker: WorkerMember
    dimensions: list[Dimension] = field(default_factory=list)
    runs: int = 0


@dataclass
class Used:
    """A worker's assignments summed (no bound: unlike one run's resources)."""

    amount: Amount = NOTHING
    runs: int = 0
    undecodable: int = 0
    """Assignments that did not decode: the schedulers count such a one as
    filling its worker (design.md, "Capacity")."""

    def add(self, res: Resources) -> None:
        self.amount = plus(self.amount, res)
        self.runs += 1


async def used_by_worker(services: ApiServices) -> dict[str, Used]:
    """Each worker's assignments summed."""
    keys = services.keys
    prefix = keys.assign_prefix()
    listing = await services.store.range(prefix, prefix_end(prefix))
    used: dict[str, Used] = {}
    for kv in listing.kvs:
        worker, _ = keys.parse_assign(kv.key)
        total = used.setdefault(worker, Used())
        try:
            total.add(kv.decode(Assignment).value.resources)
        except CorruptRecord:
            total.undecodable += 1
    return used


def worker_row(worker: WorkerMember, used: Used) -> WorkerRow:
    cap, amount = worker.capacity, used.amount
    full = used.undecodable > 0
    return WorkerRow(
        worker,
        [
            Dimension("slots", cap.slots if full else amount.slots, cap.slots),
            Dimension("cpu", amount.cpu, cap.cpu, cap.cpu > 0),
            Dimension("memory MB", amount.memory_mb, cap.memory_mb, cap.memory_mb > 0),
            Dimension("gpu", amount.gpu, cap.gpu, cap.gpu > 0 or amount.gpu > 0),
        ],
        used.runs + used.undecodable,
    )


def partition_ranges(partitions: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    spans: list[list[int]] = []
    for pp in sorted(partitions):
        if spans and spans[-1][1] == pp - 1:
            spans[-1][1] = pp
        else:
            spans.append([pp, pp])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


@page
async def cluster_page(view: View) -> web.StreamResponse:
    view.require(routes_cluster.cluster)
    services = view.ctx.services
    cluster, used = await asyncio.gather(
        routes_cluster.cluster_view(view.call()), used_by_worker(services)
    )
    owned: dict[str, list[int]] = {}
    for owner in cluster.owners:
        owned.setdefault(owner.scheduler, []).append(owner.partition)
    workers = [worker_row(w, used.get(w.id, Used())) for w in sorted(cluster.workers, key=_id)]
    recent = view.request.app[RECENT].observe()
    return view.page(
        "cluster.html",
        cluster=cluster,
        schedulers=sorted(cluster.schedulers, key=lambda s: s.id),
        owned={name: partition_ranges(pps) for name, pps in owned.items()},
        owned_count={name: len(pps) for name, pps in owned.items()},
        unowned=partition_ranges(cluster.unowned),
        workers=workers,
        recent=recent,
        window_minutes=WINDOW_MS // 60_000,
        queue=sorted(cluster.queue_by_partition.items(), key=lambda item: int(item[0])),
    )


def _id(worker: WorkerMember) -> str:
    return worker.id
