"""How fast can *any* scheduler on this etcd and this client run no-op runs?
A side measurement behind docs/adr/0020-benchmark-history.md's throughput analysis, not
part of ``etcdsched bench``.

Two bare driver processes write what a run needs and nothing else: no
triggers, caches, placement choices, retries, timers or pydantic.
- The "scheduler" driver fires runs in transactions of several runs each.
  Per run it writes the run record (about 700 bytes) and an assignment to
  the worker, and it moves the job's due entry (a delete and a put), with
  one compare (the run is absent). It watches the assignment prefix to learn
  that runs are finished, and keeps at most ``WINDOW`` runs in flight.
- The "worker" driver watches its assignments. It claims each batch under
  its lease and marks the runs running (a JSON decode and an encode per
  run), then closes them: the record succeeded, the claim and the
  assignment deleted. Compares: the assignment exists, the claim is absent,
  then the claim exists.

That is 9 mutations and 4 watch events per run. ``--staged`` adds the rest
of etcdsched's write mix: active and next-due pointers, and placement as a
stage of its own (a queue entry, then a transaction that takes it, rewrites
the record and writes the assignment). That is 10 puts and 5 deletes per
run, like etcdsched. With it, the scheduler follows the due, active and
queue prefixes of each of ``partitions`` partitions (1 by default;
etcdsched has 64) and places from all of them in full transactions.
``--staged --direct`` is the write mix ADR 0016 proposes: the firing
transaction writes the assignment (and touches the worker's epoch) instead
of a queue entry, and there is no placement stage: 12 mutations per run.

The raw 64-in-flight put rate through the same client is measured in the
same run, so each result is a ratio comparable to issue 7's target. Run:
``.venv/bin/python scripts/lifecycle_floor.py [seconds [partitions]] [--staged [--direct]]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etcdsched.bench.env import cpu_seconds
from etcdsched.bench.raw import measure_puts
from etcdsched.store.embedded import EtcdTuning
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.etcd_cluster import EtcdCluster
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Cmp, Compare, Op, Ops

P = "/floor/"
WINDOW = 4096
JOBS = 20_000
IN_FLIGHT_TXNS = 4
RECORD: dict[str, Any] = {
    "job_id": "floor-000000",
    "status": "assigned",
    "attempt": 1,
    "spec": {"command": ["true"], "env": {}, "timeout": "1h", "labels": {}},
    "trigger": {"kind": "interval", "every": "1000ms"},
    "worker_id": "w1",
    "note": "x" * 450,
}


@dataclass(frozen=True)
class Mix:
    """Which writes a run costs, and so how many runs fit in one 128-op
    transaction at each stage."""

    staged: bool
    parts: int = 1
    """Partitions: with ``staged``, the scheduler watches the due, active
    and queue prefixes of each one, as etcdsched's does."""
    direct: bool = False
    """With ``staged``: fire onto the worker (ADR 0016), no queue, no placement."""

    @property
    def placed_apart(self) -> bool:
        return self.staged and not self.direct

    def pp(self, rid: str) -> str:
        return f"{int(rid[-14:]) % self.parts:03d}"

    @property
    def per_fire(self) -> int:
        return 21 if self.staged else 32  # 6 or 4 ops a run

    per_place = 42  # 3 ops a run, and the worker's epoch
    per_claim = 64  # 2 ops a run

    @property
    def per_close(self) -> int:
        return 31 if self.staged else 42  # 4 or 3 ops a run


def fire_writes(mix: Mix, n: int) -> tuple[list[Compare], list[Op]]:
    compares: list[Compare] = []
    ops: list[Op] = []
    for i in range(n, n + mix.per_fire):
        rid, job = f"floor-{i % JOBS:06d}@{i:014d}", f"floor-{i % JOBS:06d}"
        pp = mix.pp(rid)
        compares.append(Cmp.absent(f"{P}runs/{rid}"))
        ops += [
            Ops.put(f"{P}runs/{rid}", json.dumps(dict(RECORD, job_id=job)).encode()),
            Ops.delete(f"{P}due/{pp}/{i:014d}"),
            Ops.put(f"{P}due/{pp}/{i + JOBS:014d}", json.dumps(RECORD["spec"]).encode()),
        ]
        if mix.staged:
            ops += [
                Ops.put(f"{P}active/{pp}/{rid}", b"{}"),
                Ops.put(f"{P}nextdue/{job}", b"x" * 60),
            ]
        if mix.placed_apart:
            ops.append(Ops.put(f"{P}queue/{pp}/{rid}", b"{}"))
        else:
            ops.append(Ops.put(f"{P}assign/w1/{rid}", b"{}"))
    if mix.direct:
        ops.append(Ops.put(f"{P}assign-epoch/w1", b""))
    return compares, ops


def place_writes(mix: Mix, rids: list[str]) -> tuple[list[Compare], list[Op]]:
    compares = [Cmp.exists(f"{P}queue/{mix.pp(rid)}/{rid}") for rid in rids]
    ops = [Ops.put(f"{P}assign-epoch/w1", b"")]
    for rid in rids:
        ops += [
            Ops.delete(f"{P}queue/{mix.pp(rid)}/{rid}"),
            Ops.put(f"{P}runs/{rid}", json.dumps(RECORD).encode()),
            Ops.put(f"{P}assign/w1/{rid}", b"{}"),
        ]
    return compares, ops


def claim_writes(rids: list[str], lease: int) -> tuple[list[Compare], list[Op]]:
    compares: list[Compare] = []
    ops: list[Op] = []
    for rid in rids:
        compares += [Cmp.exists(f"{P}assign/w1/{rid}"), Cmp.absent(f"{P}claims/{rid}")]
        record = json.loads(json.dumps(RECORD))  # stands for reading the record
        record["status"] = "running"
        ops += [
            Ops.put(f"{P}claims/{rid}", b"w1", lease=lease),
            Ops.put(f"{P}runs/{rid}", json.dumps(record).encode()),
        ]
    return compares, ops


def close_writes(mix: Mix, rids: list[str]) -> tuple[list[Compare], list[Op]]:
    compares = [Cmp.exists(f"{P}claims/{rid}") for rid in rids]
    ops: list[Op] = []
    for rid in rids:
        done = dict(RECORD, status="succeeded", exit_code=0)
        ops += [
            Ops.put(f"{P}runs/{rid}", json.dumps(done).encode()),
            Ops.delete(f"{P}claims/{rid}"),
            Ops.delete(f"{P}assign/w1/{rid}"),
        ]
        if mix.staged:
            ops.append(Ops.delete(f"{P}active/{mix.pp(rid)}/{rid}"))
    return compares, ops


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


async def _connect(endpoint: str) -> EtcdStore:
    return await EtcdStore.connect(EtcdOptions(endpoints=(endpoint,)))


async def _revision(store: EtcdStore) -> int:
    return (await store.range(f"{P}x", f"{P}y")).revision + 1


async def _put_rids(store: EtcdStore, prefix: str, since: int) -> Any:
    """Each watch batch's run ids newly put under ``prefix``."""
    async for batch in store.watch(prefix, since):
        yield [e.kv.key.rsplit("/", 1)[1] for e in batch.events if e.kind == "put"]


class SchedulerDriver:
    def __init__(self, store: EtcdStore, mix: Mix) -> None:
        self.store, self.mix = store, mix
        self.room = asyncio.Semaphore(WINDOW // mix.per_fire)
        self.finished: list[float] = []
        self.queued: list[str] = []
        self.queued_more = asyncio.Event()

    async def follow_finishes(self, since: int) -> None:
        async for batch in self.store.watch(f"{P}assign/", since):
            for event in batch.events:
                if event.kind == "delete":
                    self.finished.append(time.monotonic())
                    if len(self.finished) % self.mix.per_fire == 0:
                        self.room.release()

    async def queue(self, pp: int, since: int) -> None:
        async for rids in _put_rids(self.store, f"{P}queue/{pp:03d}/", since):
            self.queued += rids
            self.queued_more.set()

    async def place(self) -> None:
        """One placement loop for every partition, in full transactions
        (etcdsched's placement commits per worker across partitions)."""
        while True:
            await self.queued_more.wait()
            self.queued_more.clear()
            queued, self.queued = self.queued, []
            for batch in _chunks(queued, self.mix.per_place):
                await self.store.txn(*place_writes(self.mix, batch))

    async def follow(self, prefix: str, since: int) -> None:
        """Decode a prefix's events, as a cache would, and drop them."""
        async for _ in self.store.watch(prefix, since):
            pass

    async def run(self, seconds: float) -> list[float]:
        since = await _revision(self.store)
        stages = [asyncio.create_task(self.follow_finishes(since))]
        if self.mix.placed_apart:
            stages.append(asyncio.create_task(self.place()))
        for pp in range(self.mix.parts if self.mix.staged else 0):
            stages += [
                asyncio.create_task(self.follow(f"{P}due/{pp:03d}/", since)),
                asyncio.create_task(self.follow(f"{P}active/{pp:03d}/", since)),
            ]
            if self.mix.placed_apart:
                stages.append(asyncio.create_task(self.queue(pp, since)))
        end, n, firing = time.monotonic() + seconds, 0, []
        while time.monotonic() < end:
            await self.room.acquire()
            firing.append(asyncio.create_task(self.store.txn(*fire_writes(self.mix, n))))
            n += self.mix.per_fire
        await asyncio.gather(*firing, return_exceptions=True)
        for stage in stages:
            stage.cancel()
        return self.finished


class WorkerDriver:
    def __init__(self, store: EtcdStore, mix: Mix, lease: int) -> None:
        self.store, self.mix, self.lease = store, mix, lease
        self.lanes = asyncio.Semaphore(IN_FLIGHT_TXNS)

    async def claim_and_close(self, rids: list[str]) -> None:
        async with self.lanes:
            await self.store.txn(*claim_writes(rids, self.lease))
        for batch in _chunks(rids, self.mix.per_close):
            closing = close_writes(self.mix, batch)
            async with self.lanes:
                await self.store.txn(*closing)

    async def run(self, seconds: float) -> None:
        tasks = []
        since = await _revision(self.store)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds + 5):
                async for rids in _put_rids(self.store, f"{P}assign/w1/", since):
                    for batch in _chunks(rids, self.mix.per_claim):
                        tasks.append(asyncio.create_task(self.claim_and_close(batch)))
        await asyncio.gather(*tasks, return_exceptions=True)


def _run_scheduler(endpoint: str, seconds: float, mix: Mix, out: Any) -> None:
    async def go() -> None:
        store = await _connect(endpoint)
        out.put(await SchedulerDriver(store, mix).run(seconds))
        await store.close()

    asyncio.run(go())


def _run_worker(endpoint: str, seconds: float, mix: Mix) -> None:
    async def go() -> None:
        store = await _connect(endpoint)
        lease, _ = await store.grant(60)
        await WorkerDriver(store, mix, lease).run(seconds)
        await store.close()

    asyncio.run(go())


async def _put64(endpoint: str) -> float:
    store = await _connect(endpoint)
    try:
        return (await measure_puts(store, Keys("/raw/"), b"x" * 256, 64, 1, 10))["puts_per_s"]
    finally:
        await store.close()


def main(seconds: float, mix: Mix) -> None:
    spawn = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory() as work,
        EtcdCluster(Path(work), 1, tuning=EtcdTuning(unsafe_no_fsync=True)) as etcd,
    ):
        endpoint, etcd_pid = etcd.endpoints[0], etcd.member(0).pid or 0
        put64 = asyncio.run(_put64(endpoint))
        out = spawn.Queue()
        worker = spawn.Process(target=_run_worker, args=(endpoint, seconds, mix))
        scheduler = spawn.Process(target=_run_scheduler, args=(endpoint, seconds, mix, out))
        worker.start()
        time.sleep(2)
        scheduler.start()
        time.sleep(3)  # warm-up: imports, connections, the window filling
        pids = {"etcd": etcd_pid, "scheduler": scheduler.pid or 0, "worker": worker.pid or 0}
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        window = (time.monotonic(), time.monotonic() + seconds - 6)
        time.sleep(seconds - 6)
        used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
        finished: list[float] = out.get(timeout=60)
        scheduler.join(30)
        worker.join(30)
    # the drivers' monotonic clocks are the host's: comparable across processes
    count = sum(1 for t in finished if window[0] <= t < window[1])
    rate = count / (window[1] - window[0])
    label = f"etcdsched's write mix, {mix.parts} partitions" if mix.staged else "least a run needs"
    if mix.direct:
        label = f"ADR 0016's write mix (fired onto the worker), {mix.parts} partitions"
    print(f"raw 64-in-flight puts/s: {put64:,.0f}")
    print(f"bare drivers, {label}: {rate:,.0f} runs finished/s = {rate / put64:.3f}x put64")
    for name, seconds_used in used.items():
        print(f"  {name:9s} CPU per run: {seconds_used / max(count, 1) * 1000:.3f} ms")


if __name__ == "__main__":
    numbers = [a for a in sys.argv[1:] if not a.startswith("--")]
    parts = int(numbers[1]) if len(numbers) > 1 else 1
    staged, direct = "--staged" in sys.argv, "--direct" in sys.argv
    main(float(numbers[0]) if numbers else 30.0, Mix(staged, parts, staged and direct))
