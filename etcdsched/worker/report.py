"""How an attempt ends on its worker: the report of its outcome, or, when
it never started, a cancel or a hand-back. Transactions and their compares
are listed in :mod:`etcdsched.worker.attempt`'s docstring."""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod

from etcdsched.model.errors import EtcdschedError, StoreUnavailable
from etcdsched.model.records import Assignment, RunRecord
from etcdsched.model.statemachine import finish_attempt, hand_back, start_attempt
from etcdsched.model.states import RunState
from etcdsched.store.kv import KV, Cmp, Compare, Op, Ops, TxnResult, Versioned
from etcdsched.worker.host import WorkerHost

log = logging.getLogger("etcdsched.worker.attempt")


class AttemptEnding(ABC):
    """The ending half of :class:`etcdsched.worker.attempt.AttemptRunner`."""

    w: WorkerHost
    rid: str
    assignment: Assignment
    claim_key: str
    claim_bytes: bytes
    known: Versioned[RunRecord] | None
    unwritten_start: tuple[int, int | None] | None

    @abstractmethod
    async def _read_run(self) -> Versioned[RunRecord]:
        """The run as stored now (see the runner)."""

    async def _report(self, outcome: str, exit_code: int | None, reason: str) -> None:
        """Write the outcome while our claim stands; retry if only the run
        changed (e.g. a cancel flag) or etcd is unavailable (as long as our
        session holds: when it is lost, so is the claim), give up if the
        claim is gone. A report the worker can afford to hold back waits
        for the report window first, to share a transaction (ADR 0012);
        the attempt's end time is taken before that wait."""
        ended_ms = self.w.clock.now_ms()
        if self.w.report_may_wait(self.assignment.resources):
            await self.w.report_window.wait()
        conflicts = 0
        while True:
            if conflicts:
                await self.w.clock.sleep(min(2.0, 0.05 * 2 ** min(conflicts, 6)))
            current, self.known = self._as_started(self.known or await self._read_run()), None
            run = current.value
            if run.state is not RunState.RUNNING or run.attempt != self.assignment.attempt:
                return
            try:
                result = await self._write_report(current, ended_ms, outcome, exit_code, reason)
            except StoreUnavailable:
                await self.w.clock.sleep(0.2)
                continue  # re-read: either it applied (run no longer running) or we retry
            if result.succeeded:
                return
            if not self._claim_is_ours(result):
                log.warning("run %s: report refused, the claim is gone", self.rid)
                return
            conflicts += 1

    def _our_claim_stands(self) -> Compare:
        """The compare of every write of an attempt after its claim: our
        claim is still there, byte for byte (same run, worker, attempt and
        lease)."""
        return Cmp.value(self.claim_key, self.claim_bytes)

    def _is_our_claim(self, kv: KV | None) -> bool:
        """The claim key, as read: ours, byte for byte."""
        return kv is not None and kv.value == self.claim_bytes

    def _claim_is_ours(self, refused: TxnResult) -> bool:
        """From a refused write whose failure branch reads the claim key
        first: whether our claim is there."""
        kvs = refused.responses[0] if refused.responses else []
        return self._is_our_claim(kvs[0] if kvs else None)

    def _as_started(self, current: Versioned[RunRecord]) -> Versioned[RunRecord]:
        """``current``, made running in memory with the instant its gate
        opened (see ``unwritten_start``): its start was never written, or
        was written, as planned, before the gate opened. The report
        compares the stored revision."""
        run = current.value
        if self.unwritten_start is None or run.state not in (RunState.ASSIGNED, RunState.RUNNING):
            return current
        if run.worker != self.w.member_id or run.attempt != self.assignment.attempt:
            return current
        started_ms, pid = self.unwritten_start
        return dataclasses.replace(current, value=start_attempt(run, started_ms, pid=pid))

    async def _write_report(
        self,
        current: Versioned[RunRecord],
        ended_ms: int,
        outcome: str,
        exit_code: int | None,
        reason: str,
    ) -> TxnResult:
        """Compares: our claim, byte for byte; the run unchanged. Deleting
        the assignment in the same transaction frees the worker's capacity."""
        run = current.value
        if outcome == "cancelled" and run.cancel_requested and run.reason:
            reason = run.reason  # who cancelled and why (e.g. superseded by a newer slot)
        next_slot = await self.w.runs.next_slot(self.w.store, run)
        ended = finish_attempt(
            run, outcome, ended_ms, exit_code=exit_code, reason=reason, next_slot_ms=next_slot
        )
        ops = [
            Ops.delete(self.claim_key),
            *self.w.runs.finish_ops(ended, self.w.member_id, run.partition),
        ]
        compares = [self._our_claim_stands(), Cmp.mod(current.key, current.mod_revision)]
        return await self.w.store.txn(compares, ops, [Ops.get(self.claim_key)])

    async def _report_unstarted(self, current: Versioned[RunRecord]) -> bool:
        """Cancelled before it started: the attempt and the run end
        ``cancelled`` (compare: run unchanged)."""
        now = self.w.clock.now_ms()
        why = current.value.reason if current.value.cancel_requested else ""
        reason = f"cancelled before start: {why}" if why else "cancelled before start"
        run = finish_attempt(current.value, "cancelled", now, reason=reason)
        if run.current is not None:  # marked running before its gate: it still never started
            unstarted = run.current.model_copy(update={"started_ms": None, "pid": None})
            run = run.model_copy(update={"attempts": [*run.attempts[:-1], unstarted]})
        ops = [*self._release(), *self.w.runs.settle(run)]
        return await self._try([Cmp.mod(current.key, current.mod_revision)], ops)

    async def _hand_back(self, current: Versioned[RunRecord]) -> bool:
        """Shutting down before the start: back in the queue, no attempt used
        (from ``running`` too when it was marked before a gate that never opened)."""
        run = hand_back(current.value, self.w.clock.now_ms(), reason="handed back at shutdown")
        _, requeue = self.w.runs.requeue(run)
        ops = [*self._release(), *requeue]
        return await self._try([Cmp.mod(current.key, current.mod_revision)], ops)

    def _release(self) -> list[Op]:
        """Drop the assignment (frees our capacity) and our claim, if taken."""
        ops = [Ops.delete(self.w.keys.assign(self.w.member_id, self.rid))]
        if self.claim_key:
            ops.append(Ops.delete(self.claim_key))
        return ops

    async def _try(self, compares: list[Compare], ops: list[Op]) -> bool:
        try:
            return (await self.w.store.txn(compares, ops)).succeeded
        except EtcdschedError:
            return False
