"""The worker role: run what is assigned to this worker, truthfully.

Per incarnation the worker opens a session (lease), registers under it, and
watches only ``assign/<me>/``. For each assignment it *claims* the
attempt, starts the process at the not-before instant, enforces the
timeout, obeys cancel, and reports the outcome with a transaction whose
compare is *my claim is still there, byte for byte* (same worker, attempt
and lease) — so an attempt that was declared lost or hung can never write.

Self-fencing: a separate watchdog process is fed, from a thread, the
session's safe deadline: if the agent freezes or loses its lease, the
watchdog kills every job process group before the lease can expire on the
server. A job with a timeout is also handed to it with its own hang
deadline, so a stalled event loop (which cannot enforce timeouts) still
has it killed before recovery's hung verdict. A loop that is merely slow
(forking a herd of jobs) kills nothing; one that has not run for
``LOOP_WEDGE_LIMIT`` makes the session stop renewing, so the worker gives
its runs up to recovery instead of holding them behind a live renewal
thread. On session loss the agent also kills its children itself and
never reports for them; the next incarnation registers under a new
member id.

With ``renew_store`` the lease is renewed on a thread of its own (ADR
0007): a burst of runs that keeps the loop busy for a while no longer
costs the worker its session and every run it holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time

from etcdsched.config import Config
from etcdsched.logs.store import LogStore
from etcdsched.model.errors import EtcdschedError
from etcdsched.model.placement import fits, plus
from etcdsched.model.records import Assignment, WorkerMember
from etcdsched.model.spec import Capacity, Resources
from etcdsched.runtime.clock import Clock
from etcdsched.runtime.metrics import START_LAG
from etcdsched.store.cache import PrefixCache
from etcdsched.store.coalesce import CoalescingStore
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Event, Ops, Store
from etcdsched.store.outbox import Outbox
from etcdsched.store.runs import RunOps
from etcdsched.store.session import RenewerFactory, Session
from etcdsched.store.webhooks import TenantWebhooks
from etcdsched.worker.admission import StartAdmission
from etcdsched.worker.attempt import AttemptRunner
from etcdsched.worker.executor import Executor
from etcdsched.worker.gather import GatherWindow
from etcdsched.worker.running import Running, RunningAttempts
from etcdsched.worker.starter import LoopStarter, Starter
from etcdsched.worker.watchdog import Watchdog

log = logging.getLogger(__name__)
LOOP_WEDGE_LIMIT = 30.0
"""Seconds the event loop may go without a heartbeat before the worker
lets its lease go (its jobs are then killed by the watchdog and rerun
elsewhere). Jobs with a timeout do not depend on it (their hang deadline
is the watchdog's); it is what ends a worker that is alive but wedged for
good. Far longer than a herd of forks keeps a loop busy."""
FEED_EVERY = 0.25
REPORT_GATHER_S = 0.05
"""How long a finished attempt's report may wait for others to share its
transaction (ADR 0012); its end time is taken before the wait."""


class WorkerService:
    def __init__(
        self,
        config: Config,
        store: Store,
        keys: Keys,
        clock: Clock,
        executor: Executor,
        logs: LogStore,
        watchdog: Watchdog | None = None,
        renew_store: RenewerFactory | None = None,
        starter: Starter | None = None,
    ) -> None:
        self.config = config
        self.renew_store = renew_store
        self.store: Store = CoalescingStore(store)
        """Attempts' reads and writes travel together (``etcdsched.store.coalesce``)."""
        self.keys = keys
        self.clock = clock
        self.executor = executor
        self.logs = logs
        self.watchdog = watchdog or Watchdog()
        self.starter: Starter = starter or LoopStarter(clock)
        """Opens prepared jobs' gates at their instant (ADR 0008)."""
        self.capacity = Capacity(
            slots=config.worker_slots,
            cpu=config.worker_cpu,
            memory_mb=config.worker_memory_mb,
            gpu=config.worker_gpu,
        )
        self.report_window = GatherWindow(clock, REPORT_GATHER_S)
        """Reports that may wait are sent together (ADR 0012)."""
        self.gated = 0
        """Jobs prepared ahead of their instant whose gate is not open yet."""
        self.admission = StartAdmission(config.worker_start_window)
        """Turns through the start path: claims follow the start rate."""
        self.base_id = config.member_id
        self.member_id = config.member_id
        self.incarnation = 0
        self.running = RunningAttempts()
        self.session: Session | None = None
        self.webhooks = TenantWebhooks(store, clock, keys)
        """Tenants' webhooks: reports write the deliveries they match (docs/webhooks.md)."""
        self.runs = RunOps(keys, Outbox(keys, self.webhooks.of))
        self.draining = False
        self.finished = 0
        self.loop_beat = time.monotonic()
        """When this worker's event loop last showed it runs (monotonic)."""

    # -- lifecycle -------------------------------------------------------------
    async def run(self) -> None:
        self.watchdog.start()
        webhooks = asyncio.create_task(self.webhooks.run(), name="webhooks")
        try:
            while not self.draining:
                await self._incarnation()
        finally:
            webhooks.cancel()
            if self.session is not None:
                await self.session.close()
            self.starter.close()
            self.watchdog.close()

    async def _incarnation(self) -> None:
        if self.incarnation:
            self.member_id = f"{self.base_id}.{self.incarnation}"
        self.incarnation += 1
        tasks: list[asyncio.Task[None]] = []
        try:
            self.loop_beat = time.monotonic()
            self.session = await Session.open(
                self.store,
                self.clock,
                self.config.lease_ttl,
                renew_store=self.renew_store,
                alive=self._loop_alive,
            )
            self.session.on_lost(self._fence)
            await self.webhooks.ready.wait()  # no run ends before its tenant's webhooks are known
            await self._register(self.session)
            assignments = PrefixCache(
                self.store,
                self.clock,
                self.keys.assign_prefix(self.member_id),
                relist_every=10,
                on_event=self._on_assignment,
            )
            tasks = [
                asyncio.create_task(self._feed_watchdog(self.session), name="watchdog-feed"),
                asyncio.create_task(assignments.run(), name="assignments"),
            ]
            await assignments.ready.wait()
            for kv in assignments.items.values():
                self._on_assignment(Event("put", kv))
            await self.session.wait_lost()
        except EtcdschedError as exc:
            log.warning("worker %s: %s; starting a new session", self.member_id, exc)
            await self.clock.sleep(0.5)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._abandon_all()
            if self.session is not None and self.session.lost:
                await self.session.orphan()

    async def _register(self, session: Session) -> None:
        cfg = self.config
        member = WorkerMember(
            id=self.member_id,
            capacity=self.capacity,
            labels=cfg.worker_labels,
            reserved=cfg.worker_reserved,
            tenants=cfg.worker_tenants or [],
            host=socket.gethostname(),
            pid=os.getpid(),
            started_ms=self.clock.now_ms(),
            draining=self.draining,
        )
        lease = session.lease_id
        await self.store.txn(
            [],
            [
                Ops.put(self.keys.member("workers", self.member_id), member, lease=lease),
                Ops.put(self.keys.assign_epoch(self.member_id), b"", lease=lease),
            ],
        )

    async def _feed_watchdog(self, session: Session) -> None:
        """Tell the watchdog how long the jobs may live: until the lease
        surely holds. A thread sends it, so a busy loop does not starve the
        feed; the loop only beats (``loop_beat``), for ``_loop_alive``."""
        stop = threading.Event()

        def feed() -> None:
            while not stop.wait(FEED_EVERY) and not session.lost:
                self.watchdog.feed(session.safe_until)

        feeder = threading.Thread(target=feed, name="watchdog-feed", daemon=True)
        self.watchdog.feed(session.safe_until)
        feeder.start()
        try:
            while not session.lost:
                self.loop_beat = time.monotonic()
                await asyncio.sleep(FEED_EVERY)  # real time: this loop's liveness
        finally:
            stop.set()

    def _loop_alive(self) -> bool:
        """Whether the event loop ran within ``LOOP_WEDGE_LIMIT`` (any thread)."""
        return time.monotonic() - self.loop_beat < LOOP_WEDGE_LIMIT

    def _fence(self) -> None:
        """Session lost: kill every job now. Never report for them: recovery
        records each attempt ``lost``, reason ``fenced`` (or hands a
        never-started run back). Said at WARNING even when nothing was left
        to kill (the watchdog may have killed the jobs while the agent was
        frozen): the operator reading this agent's log learns it was fenced."""
        killed = self._kill_jobs()
        log.warning(
            "worker %s fenced: it could not prove its lease; killed %d job(s)%s",
            self.member_id,
            len(killed),
            (": " + ", ".join(killed[:10])) if killed else "",
        )

    def _kill_jobs(self) -> list[str]:
        """SIGKILL every job process this worker holds; their run ids."""
        killed = [item for item in self.running.values() if item.process is not None]
        for item in killed:
            assert item.process is not None
            item.process.kill_now()
        return sorted(item.assignment.run_id for item in killed)

    async def _abandon_all(self) -> None:
        killed = self._kill_jobs()
        if killed and not (self.session is not None and self.session.lost):  # else said: fenced
            log.warning(
                "worker %s: stopping; killed %d job(s): %s",
                self.member_id,
                len(killed),
                ", ".join(killed[:10]),
            )
        for item in list(self.running.values()):
            item.task.cancel()
        await asyncio.gather(*(i.task for i in self.running.values()), return_exceptions=True)
        self.running.clear()

    # -- assignments -----------------------------------------------------------
    def _on_assignment(self, event: Event) -> None:
        _, rid = self.keys.parse_assign(event.kv.key)
        item = self.running.get(rid)
        if event.kind == "delete":
            if item is not None:
                item.revoked.set()  # recovery took it back (hung or lost): kill, no report
            return
        assignment = event.kv.decode(Assignment).value
        if item is not None and item.assignment.attempt == assignment.attempt:
            if assignment.cancel:
                item.cancel.set()
            return
        if self.session is None or not self.session.holds():
            return
        task = asyncio.create_task(self._handle(assignment), name=f"run {rid}")
        self.running[rid] = Running(assignment, task, event.kv.mod_revision)
        if assignment.cancel:
            self.running[rid].cancel.set()
        if self.draining:  # placed before the scheduler saw us draining: straight back
            self.running[rid].shutdown.set()

    async def _handle(self, assignment: Assignment) -> None:
        item = self.running[assignment.run_id]
        try:
            assert self.session is not None
            runner = AttemptRunner(self, item, self.session)
            await runner.execute()
        except EtcdschedError as exc:
            log.warning("run %s: %s", assignment.run_id, exc)
        except Exception:  # a bug: say so loudly; recovery ends the run with our session
            log.exception("run %s: attempt failed unexpectedly", assignment.run_id)
        finally:
            if self.running.get(assignment.run_id) is item:
                del self.running[assignment.run_id]
            self.finished += 1

    def report_may_wait(self, need: Resources) -> bool:
        """Whether a finished attempt's report may wait for the report
        window: only while this worker has room for another run like it
        anyway, so a run queued for its capacity never waits on it."""
        return fits(need, plus(self.capacity, self.running.used, sign=-1), self.capacity)

    def observe_start(self, lag_ms: int) -> None:
        START_LAG.observe(max(0, lag_ms) / 1000)

    # -- graceful shutdown -----------------------------------------------------
    def started_jobs(self) -> int:
        """Jobs whose process has started here: what a graceful stop waits for."""
        return sum(1 for item in self.running.values() if item.started)

    async def drain(self, stop_now: asyncio.Event | None = None) -> None:
        """Stop gracefully (the agent's first SIGTERM/SIGINT). Take nothing
        new: the member record says ``draining``, so placement passes this
        worker by, and what arrives anyway is handed back. Hand back every
        attempt whose job has not started (``pending`` again, no attempt
        used). Let started jobs finish within ``shutdown_grace``, or until
        ``stop_now`` is set (a second signal); then stop the rest, which
        report ``interrupted`` while our claims still stand, so their runs
        are retried at once. Only then revoke the lease: member, epoch and
        claims go together, and recovery finds nothing left to judge."""
        self.draining = True
        if self.session is not None and self.session.holds():
            await self._register(self.session)
        for item in self.running.values():
            item.shutdown.set()
        if not await self._jobs_finished(stop_now or asyncio.Event()):
            stopping = sorted(rid for rid, item in self.running.items() if item.started)
            log.warning(
                "worker %s: stopping %d running job(s) now: %s",
                self.member_id,
                len(stopping),
                ", ".join(stopping[:10]),
            )
        for item in list(self.running.values()):
            item.halt.set()
        await asyncio.gather(*(i.task for i in self.running.values()), return_exceptions=True)
        if self.session is not None:
            await self.session.close()

    async def _jobs_finished(self, stop_now: asyncio.Event) -> bool:
        """Wait until no attempt is left, the grace is over, or ``stop_now``
        is set; whether none was left. Attempts that arrive meanwhile (and
        are handed back) are waited for too."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_grace
        now = asyncio.create_task(stop_now.wait())
        try:
            while self.running and not now.done():
                left = deadline - loop.time()
                if left <= 0:
                    break
                tasks = [item.task for item in self.running.values()]
                await asyncio.wait([*tasks, now], timeout=left, return_when="FIRST_COMPLETED")
        finally:
            now.cancel()
        return not self.running
