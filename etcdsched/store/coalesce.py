"""A store that sends concurrent requests as one etcd transaction.

A worker runs hundreds of attempts at once, and each makes the same few
small requests: read the run, claim it, read it again, report. Sent one by
one, the per-request cost (a gRPC call, a raft entry) is most of the
worker's CPU and caps how many runs a second it can start. This wrapper
gathers what is asked while a request is in flight and sends it together:

* reads of single keys travel as one read-only transaction;
* transactions travel as one transaction whose compares are all of theirs
  and whose operations are all of theirs. It commits only if *every*
  compare holds; then each transaction sees exactly what it would have seen
  alone, because batched transactions never touch a common key (a
  transaction that shares a key with one already in the batch, or uses a
  key range, waits for the next batch or goes alone). When the combined
  transaction fails, each one is sent again alone, so each gets its own
  verdict and its own failure reads. An unknown outcome is every member's
  unknown outcome.

Batches stay under etcd's default ``--max-txn-ops`` (128) per branch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from etcdsched.model.errors import StoreRejected
from etcdsched.store.kv import (
    KV,
    MAX_TXN_OPS,
    Compare,
    Op,
    Ops,
    RangeResult,
    Store,
    StoreStats,
    TxnResult,
    WatchBatch,
)

T = TypeVar("T")
IN_FLIGHT = 2
"""Combined transactions out at once: a claim due now does not wait a
whole round trip behind a batch of reports."""


@dataclass
class _Txn:
    compares: Sequence[Compare]
    success: Sequence[Op]
    failure: Sequence[Op]
    done: asyncio.Future[TxnResult]
    keys: frozenset[str] = field(default_factory=frozenset)
    ranged: bool = False
    """Uses a key range (it then goes alone): computed once, at arrival."""


class CoalescingStore:
    """Wraps a :class:`~etcdsched.store.kv.Store`; see the module docstring."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.stats: StoreStats = inner.stats
        self._reads: dict[str, list[asyncio.Future[KV | None]]] = {}
        self._txns: list[_Txn] = []
        self._reader: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._busy: set[str] = set()
        """Keys of the transactions in flight."""
        self._kick_soon: asyncio.Handle | None = None
        self._closed = False

    # -- reads ---------------------------------------------------------------
    async def get(self, key: str) -> KV | None:
        future: asyncio.Future[KV | None] = asyncio.get_running_loop().create_future()
        self._reads.setdefault(key, []).append(future)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_loop())
        return await future

    async def _read_loop(self) -> None:
        while self._reads:
            keys = list(self._reads)[:MAX_TXN_OPS]
            waiting = {k: self._reads.pop(k) for k in keys}
            try:
                result = await self.inner.txn([], [Ops.get(k) for k in keys])
            except Exception as exc:  # every reader gets the store's error
                for futures in waiting.values():
                    _fail(futures, exc)
                continue
            for key, kvs in zip(keys, result.responses, strict=True):
                for future in waiting[key]:
                    if not future.done():
                        future.set_result(kvs[0] if kvs else None)

    # -- transactions --------------------------------------------------------
    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        keys = frozenset([*(c.key for c in compares), *(o.key for o in success)])
        future: asyncio.Future[TxnResult] = asyncio.get_running_loop().create_future()
        ranged = any(c.range_end is not None for c in compares) or any(
            o.range_end is not None for o in success
        )
        self._txns.append(_Txn(compares, success, failure, future, keys, ranged))
        if self._kick_soon is None:
            self._kick_soon = asyncio.get_running_loop().call_soon(self._kick_at_turn_end)
        return await future

    def _kick_at_turn_end(self) -> None:
        """Everything asked in the turn that scheduled this (e.g. the
        reports a gathering window released together, ``etcdsched.worker.gather``)
        is queued by now: send it together rather than the first two alone."""
        self._kick_soon = None
        self._kick()

    def _kick(self) -> None:
        """Send batches while fewer than ``IN_FLIGHT`` are out: at the end
        of a turn that asked for one, and when a batch in flight returns."""
        while self._txns and len(self._sending) < IN_FLIGHT and not self._closed:
            batch = self._take()
            if not batch:
                return  # what is left waits for keys in flight
            task = asyncio.create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._kick()

    async def _send(self, batch: list[_Txn]) -> None:
        try:
            if len(batch) == 1:
                await self._alone(batch[0])
            else:
                await self._together(batch)
        finally:
            for item in batch:
                self._busy -= item.keys

    def _take(self) -> list[_Txn]:
        """The next batch: in arrival order, no key shared with another
        member or with a batch in flight (a request waits behind every
        earlier one on its keys), within etcd's limits. A key-range request
        goes alone, and only when nothing else is in flight."""
        batch: list[_Txn] = []
        used = set(self._busy)
        compares = ops = 0
        rest: list[_Txn] = []
        queued = self._txns
        for index, item in enumerate(queued):
            if item.done.done():
                continue  # its caller was cancelled: do not send it
            if self._joins(item, batch, used, compares, ops):
                batch.append(item)
                compares += len(item.compares)
                ops += len(item.success)
            else:
                rest.append(item)
                if batch and not item.ranged and not item.keys & used:
                    rest.extend(queued[index + 1 :])  # full: the rest keep their order
                    break
            used |= item.keys
        self._txns = rest
        for item in batch:
            self._busy |= item.keys
        return batch

    def _joins(
        self, item: _Txn, batch: list[_Txn], used: set[str], compares: int, ops: int
    ) -> bool:
        if item.keys & used:
            return False
        if item.ranged or (batch and batch[0].ranged):
            return not batch and not self._sending
        return (
            compares + len(item.compares) <= MAX_TXN_OPS and ops + len(item.success) <= MAX_TXN_OPS
        )

    async def _alone(self, item: _Txn) -> None:
        try:
            result = await self.inner.txn(item.compares, item.success, item.failure)
        except Exception as exc:
            _fail([item.done], exc)
            return
        if not item.done.done():
            item.done.set_result(result)

    async def _together(self, batch: list[_Txn]) -> None:
        compares = [c for item in batch for c in item.compares]
        success = [o for item in batch for o in item.success]
        try:
            result = await self.inner.txn(compares, success)
        except StoreRejected:
            result = None  # e.g. a limit we did not know of: send each alone
        except Exception as exc:
            for item in batch:
                _fail([item.done], exc)
            return
        if result is None or not result.succeeded:
            await asyncio.gather(*(self._alone(item) for item in batch))
            return
        start = 0
        for item in batch:
            end = start + len(item.success)
            mine = TxnResult(True, result.revision, result.responses[start:end])
            start = end
            if not item.done.done():
                item.done.set_result(mine)

    # -- everything else goes straight through -------------------------------
    async def range(
        self,
        start: str,
        end: str | None = None,
        *,
        limit: int = 0,
        keys_only: bool = False,
        count_only: bool = False,
        revision: int = 0,
        descending: bool = False,
    ) -> RangeResult:
        return await self.inner.range(
            start,
            end,
            limit=limit,
            keys_only=keys_only,
            count_only=count_only,
            revision=revision,
            descending=descending,
        )

    def watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchBatch]:
        return self.inner.watch(prefix, start_revision)

    async def grant(self, ttl: int) -> tuple[int, int]:
        return await self.inner.grant(ttl)

    async def keepalive_once(self, lease_id: int, timeout: float) -> int:
        return await self.inner.keepalive_once(lease_id, timeout)

    async def revoke(self, lease_id: int) -> None:
        await self.inner.revoke(lease_id)

    async def server_version(self) -> str:
        return await self.inner.server_version()

    async def close(self) -> None:
        self._closed = True
        if self._kick_soon is not None:
            self._kick_soon.cancel()
        for task in (self._reader, *self._sending):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.inner.close()


def _fail(futures: Sequence[asyncio.Future[T]], exc: Exception) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)
