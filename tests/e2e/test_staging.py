"""Adaptive staging end to end: a herd due at one instant starts being
fired far ahead of the lookahead, early enough to be staged by its
instant at the rate the lead assumes, while a lone slot still goes out at
the lookahead."""

from __future__ import annotations

import asyncio
import time

from etcdsched.model.records import RunRecord
from etcdsched.model.states import RunState
from etcdsched.store.kv import prefix_end
from etcdsched.worker.executor import NoopExecutor
from tests.support.e2e_jobs import iso, spec
from tests.support.eventually import assert_eventually
from tests.support.services import Services

HERD = 1000


async def herd_runs(services: Services) -> list[RunRecord]:
    prefix = services.keys.runs_prefix()
    page = await services.store.range(prefix, prefix_end(prefix))
    return [kv.decode(RunRecord).value for kv in page.kvs]


async def test_a_herd_is_staged_well_ahead_of_the_lookahead(services: Services) -> None:
    # a 5 s lease, as the policy tests give theirs: this is about staging, and
    # with etcd syncing to disk (3.4.23, ADR 0023) a thousand creates at once
    # stalled the suite's 2 s leases past their TTL
    services.config = services.config.model_copy(update={"lookahead_ms": 500, "lease_ttl": 5})
    scheduler = services.start_scheduler("s1")
    services.start_worker("w1", NoopExecutor(), worker_slots=HERD)
    at_ms = int(time.time() * 1000) + 20_000  # the creates below take seconds (more, loaded)
    herd = spec({"kind": "at", "at": iso(at_ms)}, ["true"])
    for first in range(0, HERD, 200):
        names = (f"herd-{i}" for i in range(first, first + 200))
        await asyncio.gather(*(services.jobs.create(herd, name) for name in names))

    async def fired() -> list[RunRecord]:
        runs = await herd_runs(services)
        assert len(runs) == HERD, len(runs)
        return runs

    runs = await assert_eventually(fired, timeout=40)
    # with the 500 ms lookahead alone, none would be fired sooner than
    # 500 ms ahead; the lead starts the herd early enough for the rate it
    # assumes (how many make it by the instant depends on this machine's)
    first_ahead_ms = at_ms - min(run.created_ms for run in runs)
    assert first_ahead_ms > 2000, f"the herd began only {first_ahead_ms} ms ahead"
    assert scheduler.staging.lead_ms() >= 500

    async def all_ran() -> None:
        runs = await herd_runs(services)
        assert all(r.state is RunState.SUCCEEDED for r in runs)

    await assert_eventually(all_ran, timeout=20)
