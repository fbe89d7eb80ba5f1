"""The cluster page's capacity sums, over a real etcd: an assignment that
does not decode fills its worker's slots, as the schedulers count it
(design.md, "Capacity"), instead of failing the page."""

from __future__ import annotations

from etcdsched.api.ui.pages_cluster import used_by_worker, worker_row
from etcdsched.model.records import WorkerMember
from etcdsched.model.spec import Capacity
from etcdsched.store.kv import Ops
from tests.api.conftest import Api


async def test_an_undecodable_assignment_fills_its_worker(api: Api) -> None:
    services = api.services
    keys = services.keys
    await services.store.txn([], [Ops.put(keys.assign("w-bad", "t:j@00000000000001"), b"{")])
    used = await used_by_worker(services)
    assert (used["w-bad"].runs, used["w-bad"].undecodable) == (0, 1)
    member = WorkerMember(id="w-bad", capacity=Capacity(slots=4), started_ms=0)
    row = worker_row(member, used["w-bad"])
    slots = row.dimensions[0]
    assert (slots.name, slots.used, slots.free, row.runs) == ("slots", 4, 0, 1)
