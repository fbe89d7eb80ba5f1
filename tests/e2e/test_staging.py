"""Adaptive staging end to end: a herd due at one instant is fired and
placed early enough to be staged by its instant, far ahead of the
lookahead, while a lone slot still goes out at the lookahead."""

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

    async def staged() -> None:
        runs = await herd_runs(services)
        assert len(runs) == HERD, len(runs)

    await assert_eventually(staged, timeout=20)
    # with the 500 ms lookahead alone, firing 1,000 at the few hundred a
    # second this process manages would end seconds after the instant; the
    # lead is planned to end before it with a quarter to spare
    staged_ahead_ms = at_ms - int(time.time() * 1000)
    assert staged_ahead_ms > 0, f"staged {-staged_ahead_ms} ms after the instant"
    assert scheduler.staging.lead_ms() >= 500

    async def all_ran() -> None:
        runs = await herd_runs(services)
        assert all(r.state is RunState.SUCCEEDED for r in runs)

    await assert_eventually(all_ran, timeout=20)
