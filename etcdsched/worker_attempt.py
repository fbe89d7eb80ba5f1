"""One attempt on a worker: claim, start, supervise, report.

Transactions and their compares:

* claim — *the run is unchanged since we read it as assigned to us* (its
  ``mod_revision``) and *nobody holds a claim on it* (claim key absent):
  puts the claim under our lease, the run as running, and its active
  pointer with the hung-detection deadline;
* report — *our claim is still there, byte for byte* (same worker, attempt,
  lease): a lost or hung attempt's claim was deleted, so its report fails;
* hand back (shutdown before start) — *the run is unchanged*.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from etcdsched.codec import encode
from etcdsched.errors import EtcdschedError, StoreUnavailable
from etcdsched.executor import ExitStatus, Process
from etcdsched.models import ActivePointer, Claim, RunRecord, finish_attempt, start_attempt
from etcdsched.session import Session
from etcdsched.statemachine import RunState, transition
from etcdsched.store import Cmp, Compare, Op, Ops, TxnResult, Versioned

if TYPE_CHECKING:
    from etcdsched.worker import Running, WorkerService

log = logging.getLogger(__name__)
HUNG_SLACK_MS = 5000


class AttemptRunner:
    def __init__(self, worker: WorkerService, item: Running, session: Session) -> None:
        self.w = worker
        self.item = item
        self.session = session
        self.assignment = item.assignment
        self.rid = item.assignment.run_id
        self.claim_bytes = b""
        self.claim_key = ""

    async def execute(self) -> None:
        # read the run now, not at its instant: the claim at not-before is
        # then one round trip (a run changed meanwhile fails the claim's
        # compare and is read again)
        early = await self._assigned_run()
        if early is None:
            return
        await self._until_not_before()
        claimed = await self._settle_start(early)
        if claimed is None:
            return
        outcome, exit_code, reason = await self._supervise(claimed)
        if outcome is None or self.session.lost:
            return  # revoked or fenced: someone else decides this attempt
        await self._report(outcome, exit_code, reason)

    async def _settle_start(self, early: Versioned[RunRecord]) -> RunRecord | None:
        """Claim the attempt, or end it unstarted (cancel, shutdown). A failed
        compare means the run changed under us (e.g. a cancel landed): re-read
        and decide again rather than walk away from an assigned run: nobody
        else would ever end it (recovery leaves a live worker's runs alone).
        Only the loss of our session (``_read_run`` raises) stops trying."""
        tries = 0
        while True:
            if tries:
                await self.w.clock.sleep(min(2.0, 0.05 * 2 ** min(tries, 6)))
            tries += 1
            if self.item.revoked.is_set():
                return None
            current = early if tries == 1 else await self._assigned_run()
            if current is None:
                return None  # no longer assigned to us for this attempt
            if self.item.shutdown.is_set():
                if await self._hand_back(current):
                    return None
                continue
            if self.item.cancel.is_set() or current.value.cancel_requested:
                if await self._report_unstarted(current):
                    return None
                continue
            claimed = await self._claim(current)
            if claimed is not None:
                return claimed

    async def _until_not_before(self) -> None:
        waits = [
            asyncio.create_task(self.w.clock.sleep_until_ms(self.assignment.not_before_ms)),
            asyncio.create_task(self.item.revoked.wait()),
            asyncio.create_task(self.item.shutdown.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when="FIRST_COMPLETED")
        finally:
            for task in waits:
                task.cancel()

    async def _read_run(self) -> Versioned[RunRecord]:
        """Read the run, retrying while etcd is unavailable and our session
        holds: giving up would strand an assigned or running run on a live
        worker, where recovery never looks."""
        delay = 0.1
        while True:
            self.session.check()
            try:
                return await self.w.runs.load(self.w.store, self.rid)
            except StoreUnavailable:
                await self.w.clock.sleep(delay)
                delay = min(2.0, delay * 2)

    async def _assigned_run(self) -> Versioned[RunRecord] | None:
        current = await self._read_run()
        run = current.value
        if (
            run.state is not RunState.ASSIGNED
            or run.worker != self.w.member_id
            or run.attempt != self.assignment.attempt
        ):
            return None
        return current

    async def _claim(self, current: Versioned[RunRecord]) -> RunRecord | None:
        self.session.check()
        run = current.value
        now = self.w.clock.now_ms()
        started = start_attempt(run, now, pid=None)
        claim = Claim(
            run_id=run.id, worker=self.w.member_id, attempt=run.attempt, lease=self.session.lease_id
        )
        self.claim_key = self.w.keys.claim(run.partition, run.id)
        self.claim_bytes = encode(claim)
        deadline = None
        if run.spec.timeout is not None:
            budget = (run.spec.timeout + run.spec.kill_grace).total_seconds() * 1000
            deadline = now + int(budget) + HUNG_SLACK_MS
        pointer = ActivePointer(
            run_id=run.id, worker=self.w.member_id, attempt=run.attempt, deadline_ms=deadline
        )
        ops = [
            Ops.put(self.claim_key, self.claim_bytes, lease=self.session.lease_id),
            Ops.put(current.key, started),
            Ops.put(self.w.keys.active(run.partition, run.id), pointer),
        ]
        try:
            result = await self.w.store.txn(
                [Cmp.mod(current.key, current.mod_revision), Cmp.absent(self.claim_key)], ops
            )
            ok = result.succeeded
        except StoreUnavailable:  # outcome unknown: did our claim land?
            ok = await self._claim_landed()
        if not ok:
            return None
        self.w.observe_start(now - self.assignment.not_before_ms)
        return started

    async def _claim_landed(self) -> bool:
        delay = 0.1
        while True:
            self.session.check()
            try:
                kv = await self.w.store.get(self.claim_key)
                return kv is not None and kv.value == self.claim_bytes
            except StoreUnavailable:
                await self.w.clock.sleep(delay)
                delay = min(2.0, delay * 2)

    async def _supervise(self, run: RunRecord) -> tuple[str | None, int | None, str]:
        """Start the process and wait for whichever comes first: exit,
        timeout, cancel, revoke, shutdown. ``None`` outcome = do not report."""
        writer = self.w.logs.open_writer(run.id, run.attempt)
        try:
            process = await self.w.executor.start(
                run, run.attempt, self.w.member_id, writer, guard=self.w.watchdog.add
            )
            self.item.process = process
            try:
                return await self._wait_outcome(run, process)
            finally:
                if process.pgid is not None:
                    self.w.watchdog.remove(process.pgid)
        finally:
            writer.close()

    async def _wait_outcome(
        self, run: RunRecord, proc: Process
    ) -> tuple[str | None, int | None, str]:
        timeout = run.spec.timeout.total_seconds() if run.spec.timeout else None
        grace = run.spec.kill_grace.total_seconds()
        exit_task = asyncio.create_task(proc.wait())
        signals = {
            "cancelled": asyncio.create_task(self.item.cancel.wait()),
            "revoked": asyncio.create_task(self.item.revoked.wait()),
            "shutdown": asyncio.create_task(self.item.shutdown.wait()),
        }
        try:
            done, _ = await asyncio.wait(
                [exit_task, *signals.values()], timeout=timeout, return_when="FIRST_COMPLETED"
            )
            if exit_task in done:
                return _exit_outcome(exit_task.result())
            fired = next((name for name, t in signals.items() if t in done), "timed_out")
            await proc.stop(0 if fired == "revoked" else grace)
            return _interrupt_outcome(fired, timeout)
        finally:
            for task in [exit_task, *signals.values()]:
                task.cancel()
            await asyncio.gather(exit_task, *signals.values(), return_exceptions=True)

    async def _report(self, outcome: str, exit_code: int | None, reason: str) -> None:
        """Write the outcome while our claim stands; retry if only the run
        changed (e.g. a cancel flag) or etcd is unavailable (as long as our
        session holds: when it is lost, so is the claim), give up if the
        claim is gone."""
        conflicts = 0
        while True:
            if conflicts:
                await self.w.clock.sleep(min(2.0, 0.05 * 2 ** min(conflicts, 6)))
            current = await self._read_run()
            run = current.value
            if run.state is not RunState.RUNNING or run.attempt != self.assignment.attempt:
                return
            try:
                result = await self._write_report(current, outcome, exit_code, reason)
            except StoreUnavailable:
                await self.w.clock.sleep(0.2)
                continue  # re-read: either it applied (run no longer running) or we retry
            if result.succeeded:
                return
            claim_now = result.responses[0] if result.responses else []
            if not claim_now or claim_now[0].value != self.claim_bytes:
                log.warning("run %s: report refused, the claim is gone", self.rid)
                return
            conflicts += 1

    async def _write_report(
        self, current: Versioned[RunRecord], outcome: str, exit_code: int | None, reason: str
    ) -> TxnResult:
        """Compares: our claim, byte for byte; the run unchanged. Deleting
        the assignment in the same transaction frees the worker's capacity."""
        run = current.value
        next_slot = await self.w.runs.next_slot(self.w.store, run)
        now = self.w.clock.now_ms()
        ended = finish_attempt(
            run, outcome, now, exit_code=exit_code, reason=reason, next_slot_ms=next_slot
        )
        ops = [
            Ops.delete(self.claim_key),
            *self.w.runs.finish_ops(ended, self.w.member_id, run.partition),
        ]
        compares = [
            Cmp.value(self.claim_key, self.claim_bytes),
            Cmp.mod(current.key, current.mod_revision),
        ]
        return await self.w.store.txn(compares, ops, [Ops.get(self.claim_key)])

    async def _report_unstarted(self, current: Versioned[RunRecord]) -> bool:
        """Cancelled before it started: the attempt and the run end
        ``cancelled`` (compare: run unchanged)."""
        now = self.w.clock.now_ms()
        run = finish_attempt(current.value, "cancelled", now, reason="cancelled before start")
        ops = [Ops.delete(self.w.keys.assign(self.w.member_id, run.id)), *self.w.runs.settle(run)]
        return await self._try([Cmp.mod(current.key, current.mod_revision)], ops)

    async def _hand_back(self, current: Versioned[RunRecord]) -> bool:
        """Shutting down before the start: assigned -> pending, back in the queue."""
        now = self.w.clock.now_ms()
        run = transition(current.value, RunState.PENDING, now, reason="handed back at shutdown")
        undo = {"attempt": run.attempt - 1, "attempts": run.attempts[:-1], "worker": None}
        run = run.model_copy(update=undo)
        _, requeue = self.w.runs.requeue(run)
        ops = [Ops.delete(self.w.keys.assign(self.w.member_id, run.id)), *requeue]
        return await self._try([Cmp.mod(current.key, current.mod_revision)], ops)

    async def _try(self, compares: list[Compare], ops: list[Op]) -> bool:
        try:
            return (await self.w.store.txn(compares, ops)).succeeded
        except EtcdschedError:
            return False


def _exit_outcome(status: ExitStatus) -> tuple[str, int | None, str]:
    if status.exit_code == 0:
        return "succeeded", 0, ""
    if status.exit_code is not None:
        return "failed", status.exit_code, f"exit code {status.exit_code}"
    return "failed", None, f"killed by signal {status.signal}"


def _interrupt_outcome(fired: str, timeout: float | None) -> tuple[str | None, int | None, str]:
    if fired == "revoked":
        return None, None, ""
    if fired == "shutdown":
        return "lost", None, "worker shut down before the attempt finished"
    if fired == "cancelled":
        return "cancelled", None, "cancelled by request"
    return "timed_out", None, f"ran past its timeout of {timeout:g}s"
