"""One attempt on a worker: claim on arrival, start on its own timer,
supervise, report.

The claim is taken when the assignment arrives, ahead of the not-before
instant (ADR 0007); half a second before the instant the job is prepared,
forked behind its gate, and at the instant the worker's starter opens the
gate (``etcdsched.worker.start``, ADR 0008). etcd is off the critical
path: a burst of runs due at one instant costs a gate opening each, not a
round trip each. The run says ``running`` right after the start.

Transactions and their compares:

* claim (on arrival) — *the run is unchanged since we read it as assigned
  to us* (its ``mod_revision``) and *nobody holds a claim on it* (claim key
  absent): puts the claim under our lease and the run's active pointer with
  the hung-detection deadline. From here only our lease's expiry (which
  self-fencing outruns) or a hung verdict can take the attempt from us.
  An assignment with a claim hint is claimed *unread* first (ADR 0017):
  the same puts, compared against the assignment's own ``mod_revision``
  (the transaction that assigned the run wrote both), reading the run in
  the same transaction; if refused, the run is read and claimed as above;
* started (after the start) — *our claim is still there, byte for byte*
  and *the run is unchanged*: the run becomes ``running`` with its start
  time and pid. A refused write with our claim gone means the attempt was
  taken back: the process is killed;
* report — *our claim is still there, byte for byte* (same worker, attempt,
  lease): a lost or hung attempt's claim was deleted, so its report fails;
* hand back, cancelled before start — *the run is unchanged*; both delete
  our claim with the assignment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from etcdsched.logs.store import LogWriter
from etcdsched.model.errors import StoreUnavailable
from etcdsched.model.records import (
    RunRecord,
)
from etcdsched.model.statemachine import start_attempt
from etcdsched.model.states import RunState
from etcdsched.store.kv import Cmp, Ops, Versioned
from etcdsched.store.session import Session
from etcdsched.worker.admission import Turn
from etcdsched.worker.claim import AttemptClaim
from etcdsched.worker.host import WorkerHost
from etcdsched.worker.interrupts import wait_or_interrupt
from etcdsched.worker.process_group import ExitStatus, Process
from etcdsched.worker.running import Running
from etcdsched.worker.start import PRESTART_MS, InstantStart, until

log = logging.getLogger(__name__)

Outcome = tuple[str | None, int | None, str]
"""(outcome, exit code, reason); outcome ``None`` = do not report."""


class AttemptRunner(AttemptClaim):
    def __init__(self, worker: WorkerHost, item: Running, session: Session) -> None:
        self.w = worker
        self.item = item
        self.session = session
        self.assignment = item.assignment
        self.rid = item.assignment.run_id
        self.claim_bytes = b""
        self.claim_key = ""
        self.known: Versioned[RunRecord] | None = None
        """The run as we last wrote it, so the report need not read it first."""
        self.unwritten_start: tuple[int, int | None] | None = None
        """(started_ms, pid) the report writes: of a job that had ended by
        the time ``running`` would have been written (start and end in one
        transaction: a no-op, or a job quicker than a write under load), or
        of one marked running before its gate opened (when it opened)."""
        self.turn: Turn | None = None
        """This attempt's turn through the start path, while it holds one."""
        self.marked_before_gate = False
        """``running`` was written before the gate opened (a job with a process)."""

    async def execute(self) -> None:
        """Claim when it is this attempt's turn (``etcdsched.worker.admission``),
        start, report. A job with a process takes its turn shortly before
        its instant; one without (the noop executor) claims on arrival and
        gives its turn back at once: it has nothing to prepare."""
        holds_processes = self.w.executor.holds_processes
        if holds_processes:
            await until(self.w, self.item, self.assignment.not_before_ms - PRESTART_MS)
        turn = self.turn = self.w.admission.turn(
            self.assignment.not_before_ms, self.assignment.priority
        )
        try:
            await turn.take(*self.item.interrupts())
            held = await self._claim_unread() or await self._claim_read()
            if not holds_processes:
                turn.give_back()
            if held is None:
                return
            ending = await self._claimed(held)
        finally:
            turn.give_back()
        if ending is not None:
            await self._report(*ending)

    async def _claimed(self, held: Versioned[RunRecord]) -> tuple[str, int | None, str] | None:
        """From the claim to how the attempt ended; ``None``: nothing to
        report (revoked, fenced, ended unstarted, or reported already)."""
        # lazy (ADR 0019): the file is made at the job's first output, so a
        # silent job costs no disk work, and none is done at the instant
        try:
            writer = self.w.logs.open_writer(self.rid, self.assignment.attempt, lazy=True)
        except OSError as exc:  # a store that cannot even begin a log: the attempt fails, says why
            log.exception("run %s: cannot open its log", self.rid)
            if await self._mark_running(held, self.w.clock.now_ms(), None):
                return "failed", None, f"could not open its log: {exc}"
            return None
        try:
            settled = await self._settle(held, claimed=True)
            if settled is None:
                return None
            outcome, exit_code, reason = await self._run_attempt(settled, writer)
        finally:
            writer.close()
        # an object store uploads in the background: the log is whole before
        # the report makes the run terminal, where a follower stops reading
        await writer.aclose()
        if outcome is None or self.session.lost:
            return None  # revoked or fenced: someone else decides this attempt
        return outcome, exit_code, reason

    async def _settle(
        self, current: Versioned[RunRecord], claimed: bool
    ) -> Versioned[RunRecord] | None:
        """Go on with the attempt (claiming it first unless ``claimed``), or
        end it unstarted (revoked, cancel, shutdown); ``None`` = ended. A
        failed compare means the run changed under us (e.g. a cancel
        landed): re-read and decide again rather than walk away from an
        assigned run: nobody else would ever end it (recovery leaves a live
        worker's runs alone). Only the loss of our session (``_read_run``
        raises) stops trying."""
        tries = 0
        while True:
            if tries:
                await self.w.clock.sleep(min(2.0, 0.05 * 2 ** min(tries, 6)))
                reread = await self._assigned_run()
                if reread is None:
                    return None  # no longer assigned to us for this attempt
                current = reread
            tries += 1
            if self.item.revoked.is_set():
                return None
            if self.item.shutdown.is_set():
                if await self._hand_back(current):
                    return None
                continue
            if self.item.cancel.is_set() or current.value.cancel_requested:
                if await self._report_unstarted(current):
                    return None
                continue
            if claimed or await self._claim(current):
                return current

    async def _run_attempt(self, held: Versioned[RunRecord], writer: LogWriter) -> Outcome:
        """Prepare the process, have it started at the instant, say so, and
        wait for whichever comes first: exit, timeout, cancel, revoke, halt."""
        run = held.value
        starting = InstantStart(self.w, self.item, self.session)
        await starting.make_room()  # raises, room left, if the session is lost
        try:
            prepared = await starting.prepare(run, writer)
        except Exception as exc:  # e.g. fork failed
            return await self._start_failed(held, exc)
        process = self.item.process = prepared.process
        try:
            if prepared.holds_process:
                marked = await self._mark_before_gate(held, process)
                if marked is None:
                    starting.abandon(prepared)
                    await process.stop(0)  # the attempt was taken back
                    return None, None, ""
                held = marked
            try:
                started_ms = await starting.started_ms(prepared)
            except OSError as exc:  # the gate died shut (the watchdog killed it)
                return await self._start_failed(held, exc)
            if started_ms is None:
                return await self._not_started(held, process)
            return await self._started(held, process, started_ms)
        finally:
            if process.pgid is not None:
                self.w.watchdog.remove(process.pgid)

    async def _mark_before_gate(
        self, held: Versioned[RunRecord], process: Process
    ) -> Versioned[RunRecord] | None:
        """Write ``running`` (started as planned: the instant, or now if
        later) before the gate may open: a run still ``assigned`` when its
        worker is lost then provably never started, and recovery hands it
        back without using an attempt. The report writes when the gate
        really opened. ``None``: the attempt was taken back."""
        planned_ms = max(self.w.clock.now_ms(), self.assignment.not_before_ms)
        if not await self._mark_running(held, planned_ms, process.pid):
            return None
        self.marked_before_gate = True
        return self.known

    async def _started(
        self, held: Versioned[RunRecord], process: Process, started_ms: int
    ) -> Outcome:
        """The gate opened at ``started_ms``: say so (or leave it to the
        report), then wait for how the attempt ends."""
        self.item.started = True
        if self.turn is not None:
            self.turn.give_back()  # the next due attempt may claim now
        self.w.observe_start(started_ms - self.assignment.not_before_ms)
        await asyncio.sleep(0)  # every run due at this instant starts before any says so
        status = process.ended()
        if status is not None or self.marked_before_gate:  # the report says when it started
            self.unwritten_start = (started_ms, process.pid)
            self.known = self.known or held
            if status is not None:
                return _exit_outcome(status)
        elif not await self._mark_running(held, started_ms, process.pid):
            await process.stop(0)  # the attempt was taken back
            return None, None, ""
        return await self._wait_outcome(held.value, process)

    async def _start_failed(self, held: Versioned[RunRecord], exc: Exception) -> Outcome:
        """The job could not be started: the attempt failed, and says why."""
        log.error("run %s: could not start: %s", self.rid, exc, exc_info=exc)
        if not await self._mark_running(held, self.w.clock.now_ms(), None):
            return None, None, ""
        return "failed", None, f"could not start: {exc}"

    async def _not_started(self, held: Versioned[RunRecord], process: Process) -> Outcome:
        """The job was aborted at its gate: end the attempt as if it had
        never been prepared (revoked: leave it; shutdown: hand back; cancel:
        report it cancelled), or, the session being lost, raise."""
        await process.wait()  # the gate exits at once, the job never ran
        self.session.check()  # a fenced worker writes nothing
        if await self._settle(self.known or held, claimed=True) is not None:
            self.session.check()
        return None, None, ""

    async def _mark_running(
        self, held: Versioned[RunRecord], started_ms: int, pid: int | None
    ) -> bool:
        """assigned -> running (compares: our claim, byte for byte; the run
        unchanged). False when the claim is gone or the run is no longer
        ours to start (e.g. recovery ended it)."""
        current = held
        while True:
            running = start_attempt(current.value, started_ms, pid=pid)
            try:
                result = await self.w.store.txn(
                    [self._our_claim_stands(), Cmp.mod(current.key, current.mod_revision)],
                    [Ops.put(current.key, running)],
                    [Ops.get(self.claim_key)],
                )
            except StoreUnavailable:
                result = None  # outcome unknown: the re-read below tells
            if result is not None:
                if result.succeeded:
                    self.known = dataclasses.replace(
                        current, value=running, mod_revision=result.revision
                    )
                    return True
                if not self._claim_is_ours(result):
                    return False
            await self.w.clock.sleep(0.05 if result is not None else 0.2)
            current = await self._read_run()
            run = current.value
            if run.worker != self.w.member_id or run.attempt != self.assignment.attempt:
                return False
            if run.state is RunState.RUNNING:
                self.known = current
                return True  # our write landed after all
            if run.state is not RunState.ASSIGNED:
                return False
            if run.cancel_requested:
                self.item.cancel.set()  # stop it at once, report cancelled

    async def _wait_outcome(self, run: RunRecord, proc: Process) -> Outcome:
        timeout = run.spec.timeout.total_seconds() if run.spec.timeout else None
        grace = run.spec.kill_grace.total_seconds()
        exit_task = asyncio.create_task(proc.wait())
        signals = {
            "cancelled": self.item.cancel,
            "revoked": self.item.revoked,
            "interrupted": self.item.halt,
        }
        try:
            await wait_or_interrupt(exit_task, *signals.values(), timeout=timeout)
            if exit_task.done():
                return _exit_outcome(exit_task.result())
            fired = next((name for name, flag in signals.items() if flag.is_set()), "timed_out")
            await proc.stop(_stop_grace(fired, grace))
            return _interrupt_outcome(fired, timeout)
        finally:
            exit_task.cancel()
            await asyncio.gather(exit_task, return_exceptions=True)


def _exit_outcome(status: ExitStatus) -> tuple[str, int | None, str]:
    if status.exit_code == 0:
        return "succeeded", 0, ""
    if status.exit_code is not None:
        return "failed", status.exit_code, f"exit code {status.exit_code}"
    return "failed", None, f"killed by signal {status.signal}"


SHUTDOWN_KILL_GRACE_S = 5.0
"""At most this long between SIGTERM and SIGKILL of a job stopped because
its worker is stopping: whoever stops the worker waited its shutdown grace
already, or asked a second time to stop now."""
INTERRUPTED_BY_SHUTDOWN = "interrupted by shutdown"


def _stop_grace(fired: str, kill_grace: float) -> float:
    """Seconds between SIGTERM and SIGKILL: none for a revoked attempt
    (another may run it already), the job's ``kill_grace`` otherwise,
    bounded for a worker that is stopping."""
    if fired == "revoked":
        return 0
    if fired == "interrupted":
        return min(kill_grace, SHUTDOWN_KILL_GRACE_S)
    return kill_grace


def _interrupt_outcome(fired: str, timeout: float | None) -> Outcome:
    if fired == "revoked":
        return None, None, ""
    if fired == "interrupted":
        return "interrupted", None, INTERRUPTED_BY_SHUTDOWN
    if fired == "cancelled":
        return "cancelled", None, "cancelled by request"
    return "timed_out", None, f"ran past its timeout of {timeout:g}s"
