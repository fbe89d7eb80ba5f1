"""What every scenario gets: the options, the etcd it runs against, an admin
connection, a fresh key prefix per scenario, agent fleets, and waits."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from etcdsched.bench.env import Fleet
from etcdsched.bench.measure import count_keys
from etcdsched.bench.options import BenchOptions
from etcdsched.bench.progress import Progress
from etcdsched.bench.results import ScenarioResult
from etcdsched.model.errors import StoreUnavailable
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Ops

SHUTDOWN_GRACE = 2


class BenchError(RuntimeError):
    """A scenario could not be carried out (agents did not come up, ...)."""


@dataclass
class StoredJobs:
    """The far-future jobs shared by ``scan`` and ``memory`` (loaded once)."""

    keys: Keys
    count: int = 0


@dataclass
class BenchContext:
    options: BenchOptions
    endpoints: list[str]
    store: EtcdStore
    work_dir: Path
    etcd_pid: int
    results: dict[str, ScenarioResult] = field(default_factory=dict)
    stored: StoredJobs | None = None
    _prefixes: int = 0

    def new_keys(self, name: str) -> Keys:
        """A prefix no earlier scenario used."""
        self._prefixes += 1
        return Keys(f"/bench/{self._prefixes:02d}-{name}/")

    async def connect(self) -> EtcdStore:
        """A separate connection (its own stats counters)."""
        return await EtcdStore.connect(EtcdOptions(endpoints=tuple(self.endpoints)))

    async def init_cluster(self, keys: Keys) -> int:
        meta = await ensure_cluster(
            self.store, keys, self.options.partitions, int(time.time() * 1000)
        )
        return meta.partitions

    def fleet(
        self,
        keys: Keys,
        name: str,
        lease_ttl: int | None = None,
        lookahead_ms: int | None = None,
        worker_slots: int | None = None,
    ) -> Fleet:
        """Agents of one scenario; the arguments override the options."""
        opts = self.options
        log_dir = self.work_dir / "agents" / name
        lookahead = opts.lookahead_ms if lookahead_ms is None else lookahead_ms
        env = {
            "ETCDSCHED_ETCD": ",".join(self.endpoints),
            "ETCDSCHED_PREFIX": keys.prefix,
            "ETCDSCHED_PARTITIONS": str(opts.partitions),
            "ETCDSCHED_LEASE_TTL": str(lease_ttl or opts.lease_ttl),
            "ETCDSCHED_LOOKAHEAD_MS": str(lookahead),
            "ETCDSCHED_HORIZON_MS": str(max(60_000, lookahead + 10_000)),
            "ETCDSCHED_WORKER_SLOTS": str(worker_slots or opts.worker_slots),
            "ETCDSCHED_SHUTDOWN_GRACE": str(SHUTDOWN_GRACE),
            "ETCDSCHED_LOG_DIR": str(log_dir / "runlogs"),
            "ETCDSCHED_WORKER_TENANTS": '["*"]',
        }
        return Fleet(env, log_dir)

    async def wait_ready(
        self, keys: Keys, fleet: Fleet, partitions: int, workers: int, timeout: float = 60
    ) -> None:
        """Until every partition has an owner and ``workers`` workers are registered."""
        deadline = time.monotonic() + timeout
        while True:
            owned = await count_keys(self.store, keys.owners_prefix())
            registered = await count_keys(self.store, keys.members_prefix("workers"))
            if owned >= partitions and registered >= workers:
                return
            if fleet.crashed() or time.monotonic() > deadline:
                tails = "\n".join(f"--- {a.name}\n{a.log_tail()}" for a in fleet.agents.values())
                raise BenchError(
                    f"agents not ready: {owned}/{partitions} partitions owned, "
                    f"{registered}/{workers} workers; crashed: {fleet.crashed()}\n{tails}"
                )
            await asyncio.sleep(0.2)

    async def wait_drained(self, keys: Keys, expected: int, label: str) -> bool:
        """Until ``expected`` runs exist and none is active (or the drain
        timeout passes: returns False). Counting is a range over every key
        (half a second of etcd's time at 100,000 runs), so it is paced by
        :func:`_pace` and the run count stops once it is reached."""
        progress = Progress(label, expected, " runs")
        deadline = time.monotonic() + self.options.drain_timeout
        created = 0
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                if created < expected:
                    created = await count_keys(self.store, keys.runs_prefix())
                active = await count_keys(self.store, f"{keys.prefix}active/")
            except StoreUnavailable:  # an overloaded etcd: ask again, the drain goes on
                await asyncio.sleep(1.0)
                continue
            progress.update(created, f"active {active:,}")
            if created >= expected and active == 0:
                progress.done(f"({created:,} runs)")
                return True
            await asyncio.sleep(_pace(time.monotonic() - began, 0.5))
        progress.done("(drain timeout)")
        return False

    async def workers_kept_lease(self, keys: Keys, workers: int) -> bool:
        """Whether every worker still runs its first session: a worker that
        lost its lease registers again as ``<id>.<incarnation>``."""
        members = await self.store.range(keys.members_prefix("workers"), keys_only=True)
        names = [kv.key.rsplit("/", 1)[-1] for kv in members.kvs]
        return len(names) == workers and not any("." in name for name in names)

    async def cleanup(self, keys: Keys) -> None:
        """Delete a finished scenario's keys, so later ones run on a small database."""
        await self.store.txn([], [Ops.delete_prefix(keys.prefix)])

    async def sleep_with_progress(self, seconds: float, label: str, keys: Keys) -> None:
        """Sleep, counting the runs now and then (paced by :func:`_pace`),
        and not at all in the last ``QUIET_BEFORE_S``: the instant at the
        end is what is measured."""
        progress = Progress(label, seconds, "s")
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if left <= QUIET_BEFORE_S:
                await asyncio.sleep(left)
                break
            began = time.monotonic()
            try:
                created = f"{await count_keys(self.store, keys.runs_prefix()):,}"
            except StoreUnavailable:  # progress only: never fail the scenario for it
                created = "?"
            progress.update(seconds - left, f"runs {created}")
            pause = _pace(time.monotonic() - began, 1.0)
            await asyncio.sleep(max(0.0, min(pause, left - QUIET_BEFORE_S)))
        progress.done()


QUIET_BEFORE_S = 5.0
"""The bench reads nothing from etcd this long before a measured instant."""


def _pace(took_s: float, at_least_s: float) -> float:
    """Seconds to wait before counting again: at least ``at_least_s``, and
    ten times what the last count took, so the bench's own counting stays
    under a tenth of etcd's time (a count over 100,000 keys took 0.5-0.7 s
    of etcd's time in a burst, and was asked for every 0.5 s)."""
    return max(at_least_s, 10 * took_s)
