"""Claiming an attempt on its worker: the claim half of
:class:`etcdsched.worker.attempt.AttemptRunner` (its transactions and their
compares are listed in that module's docstring), and reading the run while
the session holds."""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from etcdsched.model.codec import encode
from etcdsched.model.errors import StoreUnavailable
from etcdsched.model.records import HUNG_SLACK_MS, ActivePointer, Claim, RunRecord, hang_budget_ms
from etcdsched.model.states import RunState
from etcdsched.store.kv import Cmp, Compare, Op, Ops, TxnResult, Versioned
from etcdsched.store.session import Session
from etcdsched.worker.report import AttemptEnding
from etcdsched.worker.running import Running

log = logging.getLogger("etcdsched.worker.attempt")
T = TypeVar("T")


class AttemptClaim(AttemptEnding):
    """The claiming half of the attempt runner (the ending half below it)."""

    item: Running
    session: Session
    marked_before_gate: bool

    @abstractmethod
    async def _settle(
        self, current: Versioned[RunRecord], claimed: bool
    ) -> Versioned[RunRecord] | None:
        """Go on with the attempt, or end it unstarted (see the runner)."""

    async def _claim_read(self) -> Versioned[RunRecord] | None:
        """Read the run, then claim it (or end it unstarted): the path of an
        assignment without a claim hint, or whose unread claim was refused."""
        current = await self._assigned_run()
        if current is None:
            return None
        return await self._settle(current, claimed=False)

    async def _claim_unread(self) -> Versioned[RunRecord] | None:
        """Claim on arrival without reading the run first (ADR 0017), and
        read it in the same transaction. Compares: *the run's mod_revision
        is the assignment's* (every writer of an assignment writes its run
        in the same transaction, so the run is still as it was assigned to
        us) and *no claim on it*. ``None``: not tried (no hint, or the
        attempt was interrupted already) or refused; the caller reads and
        decides as before."""
        hint = self.assignment.claim_hint
        if hint is None or self.item.interrupted():
            return None
        run_key = self.w.keys.run(self.rid)
        result = await self._send_claim(
            Cmp.mod(run_key, self.item.assigned_revision),
            hint.partition,
            hint.hang_budget_ms,
            also=[Ops.get(run_key)],
        )
        if result is None:  # outcome unknown: if our claim landed, the run is ours
            return await self._read_run() if await self._claim_landed() else None
        if not result.succeeded:
            self.claim_key = ""
            return None
        held = result.responses[-1][0].decode(RunRecord)  # it exists: its revision matched
        if not self._assigned_to_us(held.value):  # cannot happen, by the compare
            log.error("run %s: claimed unread, but not assigned to us: %s", self.rid, held.value)
            await self._try([self._our_claim_stands()], [Ops.delete(self.claim_key)])
            self.claim_key = ""
            return None
        return held

    async def _read_run(self) -> Versioned[RunRecord]:
        """Read the run; see :meth:`_while_session_holds`."""
        return await self._while_session_holds(lambda: self.w.runs.load(self.w.store, self.rid))

    async def _while_session_holds(self, read: Callable[[], Awaitable[T]]) -> T:
        """``read()``, retried while etcd is unavailable and our session
        holds: giving up would strand an assigned or running run on a live
        worker, where recovery never looks."""
        delay = 0.1
        while True:
            self.session.check()
            try:
                return await read()
            except StoreUnavailable:
                await self.w.clock.sleep(delay)
                delay = min(2.0, delay * 2)

    async def _assigned_run(self) -> Versioned[RunRecord] | None:
        current = await self._read_run()
        return current if self._assigned_to_us(current.value) else None

    def _assigned_to_us(self, run: RunRecord) -> bool:
        """Ours and not started: ``assigned``, or ``running`` as marked
        before a gate that has not opened."""
        waiting = (
            (RunState.ASSIGNED, RunState.RUNNING)
            if self.marked_before_gate
            else (RunState.ASSIGNED,)
        )
        return (
            run.state in waiting
            and run.worker == self.w.member_id
            and run.attempt == self.assignment.attempt
        )

    async def _claim(self, current: Versioned[RunRecord]) -> bool:
        """Take the attempt: claim key under our lease (compares: run
        unchanged, no claim on it). The run itself is not written: it stays
        ``assigned`` until the process has started. The active pointer is
        rewritten only to add the hang deadline of a job with a timeout:
        every other write of a pointer also writes its run, so a run
        unchanged since it was placed on us still has the placement's
        pointer, which already names this worker and attempt (one put and
        one watch event per run fewer)."""
        run = current.value
        result = await self._send_claim(
            Cmp.mod(current.key, current.mod_revision), run.partition, hang_budget_ms(run.spec)
        )
        if result is None:  # outcome unknown: did our claim land?
            return await self._claim_landed()
        # Refused: an earlier claim of ours whose outcome was unknown may have
        # landed after we looked; the claim there is ours, and so is the attempt.
        return result.succeeded or self._claim_is_ours(result)

    async def _send_claim(
        self,
        run_unchanged: Compare,
        partition: int,
        budget_ms: int | None,
        also: Sequence[Op] = (),
    ) -> TxnResult | None:
        """The claim transaction. Compares: ``run_unchanged`` and *no claim
        on the run*. Ops: the claim under our lease, the active pointer with
        its hang deadline if the run has a timeout (``budget_ms``), then
        ``also``; refused, it reads the claim key back. Sets ``claim_key``
        and ``claim_bytes``. ``None``: etcd was unavailable, the outcome is
        unknown."""
        self.session.check()
        lease, attempt = self.session.lease_id, self.assignment.attempt
        claim = Claim(run_id=self.rid, worker=self.w.member_id, attempt=attempt, lease=lease)
        self.claim_key = self.w.keys.claim(partition, self.rid)
        self.claim_bytes = encode(claim)
        ops = [Ops.put(self.claim_key, self.claim_bytes, lease=lease)]
        if budget_ms is not None:
            begins = max(self.w.clock.now_ms(), self.assignment.not_before_ms)
            deadline_ms = begins + budget_ms + HUNG_SLACK_MS
            self.item.hang_deadline_ms = deadline_ms
            pointer = ActivePointer(
                run_id=self.rid, worker=self.w.member_id, attempt=attempt, deadline_ms=deadline_ms
            )
            ops.append(Ops.put(self.w.keys.active(partition, self.rid), pointer))
        compares = [run_unchanged, Cmp.absent(self.claim_key)]
        try:
            return await self.w.store.txn(compares, [*ops, *also], [Ops.get(self.claim_key)])
        except StoreUnavailable:
            return None

    async def _claim_landed(self) -> bool:
        return self._is_our_claim(
            await self._while_session_holds(lambda: self.w.store.get(self.claim_key))
        )
