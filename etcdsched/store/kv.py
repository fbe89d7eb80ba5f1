"""The store interface: what etcdsched needs from etcd, and nothing more.

Callers build :class:`Compare` and :class:`Op` values with the helpers below
and get :class:`KV` / :class:`Versioned` results back; only
``etcdsched.store.etcd`` talks to the etcd client library. Revisions are
etcd's: ``create_revision`` (0 = absent) is a fencing token for leased keys,
``mod_revision`` is what every compare-and-swap compares.

Writes that time out raise :class:`~etcdsched.model.errors.OutcomeUnknown`: the
caller must re-read and decide, never assume.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, NamedTuple, Protocol, TypeVar

from pydantic import BaseModel

from etcdsched.model.codec import decode, encode

M = TypeVar("M", bound=BaseModel)
MAX_TXN_OPS = 120
"""Ops (or compares) etcdsched puts in one branch of a transaction: under
etcd's default ``--max-txn-ops`` of 128, which refuses the whole txn."""
Target = Literal["version", "create", "mod", "value", "lease"]
Operator = Literal["==", "!=", "<", ">"]


class KV(NamedTuple):
    """A key as etcd returned it. ``KV``, ``Compare``, ``Op`` and ``Event``
    are named tuples, immutable like frozen dataclasses but made five times
    faster: a run costs a scheduler a few dozen of them."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0

    def decode(self, model: type[M]) -> Versioned[M]:
        return Versioned(
            self.key,
            decode(self.value, model, self.key),
            self.create_revision,
            self.mod_revision,
            self.version,
            self.lease,
        )


@dataclass(frozen=True)
class Versioned(Generic[M]):
    """A decoded record with the revisions a later compare needs."""

    key: str
    value: M
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


class Compare(NamedTuple):
    """One txn predicate: ``target(key) operator operand``. With
    ``range_end`` it must hold for every key in ``[key, range_end)``; an
    empty range compares as an absent key (version 0)."""

    key: str
    target: Target
    operator: Operator
    operand: int | bytes
    range_end: str | None = None


class Op(NamedTuple):
    kind: Literal["put", "delete", "get"]
    key: str
    value: bytes = b""
    lease: int = 0
    range_end: str | None = None
    ignore_lease: bool = False
    """A put that keeps the key's current lease (etcd's ``ignore_lease``)."""


def prefix_end(prefix: str) -> str:
    """Exclusive end of the key range that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def holds(compare: Compare, kvs: list[KV]) -> bool:
    """Whether the single-key ``compare`` holds for its key as read back:
    ``kvs`` answers a get of that key (empty: absent, so every revision and
    the version are 0 and the value is empty). A failure branch that reads
    back what its compares looked at asks this, instead of restating each
    compare by hand."""
    if compare.range_end is not None:
        raise ValueError(f"a range compare is not read back: {compare.key}")
    kv = kvs[0] if kvs else None
    actual: int | bytes
    if compare.target == "value":
        actual = kv.value if kv else b""
    else:
        field = {"create": "create_revision", "mod": "mod_revision"}.get(compare.target)
        actual = getattr(kv, field or compare.target) if kv else 0
    operand = compare.operand
    if compare.operator == "==":
        return actual == operand
    if compare.operator == "!=":
        return actual != operand
    if isinstance(actual, bytes) or isinstance(operand, bytes):
        raise ValueError(f"values compare only for equality: {compare.key}")
    return actual < operand if compare.operator == "<" else actual > operand


class Cmp:
    """Builders for the compares etcdsched uses."""

    @staticmethod
    def absent(key: str) -> Compare:
        return Compare(key, "create", "==", 0)

    @staticmethod
    def exists(key: str) -> Compare:
        return Compare(key, "create", ">", 0)

    @staticmethod
    def created(key: str, create_revision: int) -> Compare:
        return Compare(key, "create", "==", create_revision)

    @staticmethod
    def mod(key: str, mod_revision: int) -> Compare:
        return Compare(key, "mod", "==", mod_revision)

    @staticmethod
    def unwritten_since(key: str, revision: int) -> Compare:
        """``key`` was last written at or before ``revision``."""
        return Compare(key, "mod", "<", revision + 1)

    @staticmethod
    def value(key: str, value: bytes) -> Compare:
        return Compare(key, "value", "==", value)

    @staticmethod
    def prefix_empty(prefix: str) -> Compare:
        return Compare(prefix, "version", "==", 0, range_end=prefix_end(prefix))


class Ops:
    """Builders for txn operations; records are encoded here, at the edge."""

    @staticmethod
    def put(key: str, value: BaseModel | bytes, lease: int = 0) -> Op:
        data = value if isinstance(value, bytes) else encode(value)
        return Op("put", key, data, lease)

    @staticmethod
    def touch(key: str) -> Op:
        """Raise ``key``'s mod revision, keeping its lease; the key must exist.

        An empty value with etcd's ``ignore_lease``: the txn fails if the key
        is absent, so pair it with a compare that it exists.
        """
        return Op("put", key, b"", ignore_lease=True)

    @staticmethod
    def delete(key: str) -> Op:
        return Op("delete", key)

    @staticmethod
    def delete_prefix(prefix: str) -> Op:
        return Op("delete", prefix, range_end=prefix_end(prefix))

    @staticmethod
    def get(key: str) -> Op:
        return Op("get", key)

    @staticmethod
    def get_prefix(prefix: str) -> Op:
        return Op("get", prefix, range_end=prefix_end(prefix))


@dataclass(frozen=True)
class RangeResult:
    kvs: list[KV]
    revision: int
    more: bool
    count: int


@dataclass(frozen=True)
class TxnResult:
    """``responses[i]`` is the list of KVs for a get op, else ``[]``."""

    succeeded: bool
    revision: int
    responses: list[list[KV]] = field(default_factory=list)


class Event(NamedTuple):
    kind: Literal["put", "delete"]
    kv: KV
    """For a delete, only the key and the revision of the delete are set."""


@dataclass(frozen=True)
class WatchBatch:
    events: list[Event]
    revision: int


class Compacted(Exception):
    """The revision a watch starts from, or a paged read is pinned to, was
    compacted away: re-list, then resume from the revision of the listing.
    ``compact_revision`` is 0 when etcd did not say (a read)."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted up to {compact_revision}")
        self.compact_revision = compact_revision


@dataclass
class StoreStats:
    """Counters for tests and benchmarks (e.g. keys read per scheduling pass)."""

    keys_read: int = 0
    requests: int = 0
    txns: int = 0


class Store(Protocol):
    """What etcdsched needs from etcd. All methods are coroutines that raise
    ``StoreUnavailable`` (reads) or ``OutcomeUnknown`` (writes) on transport
    failure."""

    stats: StoreStats

    async def get(self, key: str) -> KV | None:
        """Linearizable read of one key."""

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
        """Keys in ``[start, end)`` in key order (``end=None``: the prefix ``start``)."""

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Atomically: if every compare holds run ``success``, else ``failure``."""

    def watch(self, prefix: str, start_revision: int) -> AsyncIterator[WatchBatch]:
        """Every change under ``prefix`` from ``start_revision`` on, in order.
        Raises :class:`Compacted` if that revision is gone."""

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: ``(lease_id, granted_ttl)``."""

    async def keepalive_once(self, lease_id: int, timeout: float) -> int:
        """Renew once; the remaining TTL, or ``<= 0`` if the lease is gone."""

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease, deleting every key bound to it."""

    async def server_version(self) -> str:
        """The etcd server version (from the maintenance API)."""

    async def close(self) -> None: ...
