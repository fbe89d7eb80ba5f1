"""Random faults, one every 1-3 s, drawn from one ``random.Random(seed)``.

* ``kill9_scheduler`` / ``kill9_worker`` — kill -9, restart under a new name
  after 0-1 s;
* ``sigstop_scheduler`` / ``sigstop_worker`` — SIGSTOP, SIGCONT after 0.5-1.8 s
  (shorter than the 2 s lease TTL) or 2.5-5 s (longer);
* ``kill9_etcd_leader`` / ``kill9_etcd_follower`` — kill -9 one etcd member,
  restart it after 2-5 s; at most one member is down at a time, so quorum
  is never broken on purpose;
* ``cancel_storm`` — cancel 1-4 random active runs (``cancel_run``);
* ``update_storm`` — replace 1-3 recurring jobs with a new argv and timeout.

Each fault is its own task (a pause lasts longer than the gap between two
faults); an agent or etcd member is the target of at most one fault at a time.
:meth:`Injector.finish` waits for the ones in flight, so their SIGCONTs and
restarts happen before the harness heals and quiesces.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from etcdsched.model.errors import EtcdschedError
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Store
from etcdsched.store.runs import cancel_run
from tests.faults.fleet import AgentSlot, Fleet
from tests.faults.workload import JobPlan, Workload

log = logging.getLogger(__name__)
Action = Callable[[], Coroutine[Any, Any, None]]
TTL_S = 2.0
WEIGHTS = {
    "kill9_scheduler": 3,
    "kill9_worker": 3,
    "sigstop_scheduler": 3,
    "sigstop_worker": 3,
    "kill9_etcd": 2,
    "cancel_storm": 2,
    "update_storm": 2,
}


@dataclass
class Fault:
    at_s: float
    """Seconds since injection started (``Injector.started``, monotonic)."""
    kind: str
    target: str
    detail: str = ""
    error: str = ""
    wall_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)


class Injector:
    def __init__(
        self,
        fleet: Fleet,
        store: Store,
        keys: Keys,
        jobs: JobService,
        workload: Workload,
        recurring: list[JobPlan],
        rng: random.Random,
    ) -> None:
        self.fleet = fleet
        self.store = store
        self.keys = keys
        self.jobs = jobs
        self.workload = workload
        self.recurring = recurring
        self.rng = rng
        self.faults: list[Fault] = []
        self.exits: list[Fault] = []
        """Agents that exited on their own (not a fault we injected)."""
        self.gap_s = (1.0, 3.0)
        self.started = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        self.clock = SystemClock()
        self._etcd_busy = False

    async def run(self, seconds: float) -> None:
        """Inject faults for ``seconds``; then :meth:`finish` must be awaited."""
        self.started = time.monotonic()
        deadline = self.started + seconds
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, self.rng.uniform(*self.gap_s)))
            self.note_exits()
            if time.monotonic() < deadline:
                self._inject_one()

    def note_exits(self) -> None:
        for name, why in self.fleet.restart_exited():
            exit_ = Fault(round(time.monotonic() - self.started, 2), "agent_exited", name, why)
            self.exits.append(exit_)
            log.warning("agent %s exited on its own: %s", name, why)

    async def finish(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _inject_one(self) -> None:
        kinds = list(WEIGHTS)
        for _ in range(5):
            kind = self.rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
            action = self._plan(kind)
            if action is not None:
                self._spawn(action)
                return

    def _plan(self, kind: str) -> Action | None:
        if kind == "kill9_etcd":
            if self._etcd_busy or self.fleet.etcd_down is not None:
                return None
            self._etcd_busy = True
            return self._kill_etcd
        if kind == "cancel_storm":
            return self._cancel_storm
        if kind == "update_storm":
            return self._update_storm
        action, role = kind.split("_")
        idle = [s for s in self.fleet.by_role(role) if not s.busy and s.alive]
        if not idle:
            return None
        slot = self.rng.choice(idle)
        slot.busy = True
        if action == "kill9":
            return lambda: self._kill_agent(slot, kind)
        return lambda: self._pause_agent(slot, kind)

    def _spawn(self, action: Action) -> None:
        task = asyncio.create_task(action())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _record(self, kind: str, target: str, detail: str = "") -> Fault:
        fault = Fault(round(time.monotonic() - self.started, 2), kind, target, detail)
        self.faults.append(fault)
        log.info("fault %.2fs %s %s %s", fault.at_s, kind, target, detail)
        return fault

    # -- agents ------------------------------------------------------------------
    async def _kill_agent(self, slot: AgentSlot, kind: str) -> None:
        old = slot.name
        fault = self._record(kind, old)
        try:
            self.fleet.kill9(slot)
            await asyncio.sleep(self.rng.uniform(0.0, 1.0))
            fault.detail = f"restarted as {self.fleet.spawn(slot).name}"
        finally:
            slot.busy = False

    async def _pause_agent(self, slot: AgentSlot, kind: str) -> None:
        short = self.rng.random() < 0.5
        seconds = self.rng.uniform(0.5, 1.8) if short else self.rng.uniform(2.5, 5.0)
        relation = "< TTL" if seconds < TTL_S else "> TTL"
        self._record(kind, slot.name, f"{seconds:.2f}s ({relation})")
        try:
            self.fleet.pause(slot)
            await asyncio.sleep(seconds)
        finally:
            self.fleet.resume(slot)
            slot.busy = False

    # -- etcd --------------------------------------------------------------------
    async def _kill_etcd(self) -> None:
        leader = await asyncio.to_thread(self.fleet.cluster.leader_index)
        members = list(range(len(self.fleet.cluster.members)))
        if self.rng.random() < 0.5 and leader is not None:
            index, kind = leader, "kill9_etcd_leader"
        else:
            index = self.rng.choice([i for i in members if i != leader])
            kind = "kill9_etcd_follower"
        down_s = self.rng.uniform(2.0, 5.0)
        fault = self._record(kind, self.fleet.etcd_member(index).name, f"down {down_s:.1f}s")
        self.fleet.kill_etcd(index)
        await asyncio.sleep(down_s)
        try:
            await asyncio.to_thread(self.fleet.restart_etcd, index)
        except Exception as exc:
            fault.error = f"restart failed: {exc}"  # the harness heals it before quiesce
            raise
        self._etcd_busy = False

    # -- client-side storms ------------------------------------------------------
    async def _cancel_storm(self) -> None:
        fault = self._record("cancel_storm", "active runs")
        try:
            page = await self.store.range(f"{self.keys.prefix}active/", keys_only=True)
            rids = sorted({self.keys.parse_active(kv.key)[1].run_id for kv in page.kvs})
            chosen = self.rng.sample(rids, min(len(rids), self.rng.randint(1, 4)))
            fault.detail = f"{len(chosen)} of {len(rids)} active"
            for rid in chosen:
                await cancel_run(self.store, self.keys, rid, self.clock.now_ms(), "cancel storm")
        except EtcdschedError as exc:
            fault.error = f"{type(exc).__name__}: {exc}"

    async def _update_storm(self) -> None:
        chosen = self.rng.sample(self.recurring, self.rng.randint(1, 3))
        fault = self._record("update_storm", ",".join(p.job_id for p in chosen))
        errors = []
        for plan in chosen:
            try:
                current = await self.jobs.get(plan.job_id)
                await self.jobs.replace(plan.job_id, self.workload.updated(plan, current.spec))
            except EtcdschedError as exc:
                errors.append(f"{plan.job_id}: {type(exc).__name__}")
        fault.error = "; ".join(errors)
