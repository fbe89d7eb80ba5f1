"""Partition ownership: which scheduler fires which partition.

Placement of partitions is *bounded-load rendezvous hashing* over the live
schedulers: every scheduler computes the same map from the same member list,
each member gets at most ceil(P / n) partitions, and a join or leave moves
only the partitions it must. Ownership itself is an owner key bound to the
owner's session lease; its ``create_revision`` is the fencing token that
every write for the partition compares (:meth:`Ownership.guard`). A stalled
former owner's writes fail because the key was recreated by the new owner.
"""

from __future__ import annotations

import hashlib
import math

from etcdsched.model.errors import OwnershipLost
from etcdsched.model.records import OwnerRecord
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Cmp, Compare, Ops, Store
from etcdsched.store.session import Session


def _score(member: str, partition: int) -> int:
    digest = hashlib.blake2b(f"{member}/{partition}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def desired_owners(members: list[str], partitions: int) -> dict[int, str]:
    """Partition -> member, evenly spread (no member above ceil(P/n))."""
    if not members:
        return {}
    cap = math.ceil(partitions / len(members))
    load = dict.fromkeys(members, 0)
    owners: dict[int, str] = {}
    for partition in range(partitions):
        ranked = sorted(members, key=lambda m: _score(m, partition), reverse=True)
        chosen = next(m for m in ranked if load[m] < cap)
        owners[partition] = chosen
        load[chosen] += 1
    return owners


class Ownership:
    """The partitions this scheduler holds, with their fencing tokens."""

    def __init__(self, store: Store, keys: Keys, member_id: str) -> None:
        self.store = store
        self.keys = keys
        self.member_id = member_id
        self.tokens: dict[int, int] = {}
        self.signature = member_id

    def bind(self, session: Session) -> None:
        """A new session: records written from now on name it (``member/lease``)."""
        self.tokens.clear()
        self.signature = f"{self.member_id}/{session.lease_id:x}"

    def guard(self, partition: int) -> Compare:
        """The compare that fences a write for ``partition``: our owner key
        still exists with the create_revision we acquired it at."""
        token = self.tokens.get(partition)
        if token is None:
            raise OwnershipLost(f"partition {partition} is not owned")
        return Cmp.created(self.keys.owner(partition), token)

    async def acquire(self, partition: int, session: Session, now_ms: int) -> bool:
        """Take the partition if nobody owns it. Compare: owner key absent."""
        session.check()
        key = self.keys.owner(partition)
        record = OwnerRecord(scheduler=self.member_id, since_ms=now_ms)
        result = await self.store.txn(
            [Cmp.absent(key)], [Ops.put(key, record, lease=session.lease_id)], [Ops.get(key)]
        )
        if result.succeeded:
            self.tokens[partition] = result.revision
            return True
        current = result.responses[0]
        if current and current[0].lease == session.lease_id:
            self.tokens[partition] = current[0].create_revision  # ours from an unknown outcome
            return True
        return False

    async def release(self, partition: int) -> None:
        """Give the partition up. Compare: it is still our owner key."""
        token = self.tokens.pop(partition, None)
        if token is not None:
            key = self.keys.owner(partition)
            await self.store.txn([Cmp.created(key, token)], [Ops.delete(key)])

    def forget_all(self) -> list[int]:
        """After the session is lost: every partition is gone at once."""
        lost = list(self.tokens)
        self.tokens.clear()
        return lost
