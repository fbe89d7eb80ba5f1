"""Creating many jobs at once (``POST /v1/jobs:batch``).

One create alone is one etcd transaction, and most of its cost is per
transaction, not per key: a gRPC round trip, a raft entry, a share of an
fsync. So the batch builds every job's create exactly as a create alone
does (:meth:`~etcdsched.store.job_create.JobCreator.creation_of`: the same
compares, the same keys) and packs many of them into one transaction, the
way ``etcdsched.store.coalesce`` packs concurrent transactions:

* a pack stays within ``MAX_TXN_OPS`` compares and as many operations, and
  within ``MAX_PACK_BYTES`` (etcd refuses requests over 1.5 MiB);
* a few packs are in flight at once, so etcd commits one while the next
  is built and sent;
* a pack commits only if *every* member's compares hold. When it fails,
  each member is sent again alone and gets its own verdict (an existing
  id is a conflict for that job only). When its outcome is unknown, each
  member's is, and each is resolved by re-reading, as a create alone is:
  never reported as made or refused before it is known to be. Refused
  because the idempotency lease is gone, each member is sent alone too,
  and gets a new lease (``JobCreator.commit_creation``).

Two members of one pack never write the same key (etcd refuses a
transaction that does): a job id twice in one batch is a conflict for the
later item, and a later item reusing an idempotency key goes alone after
the packs (it is then a replay of the earlier one, or a conflict). Items
with ``depends_on`` go alone too, in order, after the packs: checking their
upstream jobs reads etcd, and so may name a job created earlier in the
same batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from etcdsched.model.errors import (
    Conflict,
    EtcdschedError,
    NotFound,
    StoreRejected,
    StoreUnavailable,
)
from etcdsched.model.records import JobRecord
from etcdsched.model.spec import JobSpec
from etcdsched.store.job_create import JobCreation, JobCreator, new_job_name
from etcdsched.store.kv import KV, MAX_TXN_OPS, Ops, Store

MAX_PACK_BYTES = 1 << 20
"""Keys and values in one pack's transaction: well under etcd's default
request limit (``--max-request-bytes``, 1.5 MiB), which refuses the whole
transaction."""
PACKS_IN_FLIGHT = 4
"""Pack transactions sent at once: enough for etcd to commit one while the
next arrives (its commits share an fsync), few enough not to queue up."""

Numbered = tuple[int, JobCreation]
"""A creation with the position of its item in the batch."""


@dataclass(frozen=True)
class CreateRequest:
    """One item of a batch: what ``JobCreator.create`` takes."""

    spec: JobSpec
    job_id: str | None = None
    """A name or a full id of the spec's tenant; None: a generated name."""
    idempotency_key: str | None = None


@dataclass(frozen=True)
class CreateOutcome:
    """What became of one item: a job, or the error it would have raised alone."""

    job: JobRecord | None = None
    created: bool = False
    """True when this request made ``job``; False when an earlier request
    with the same idempotency key did (a replay)."""
    error: EtcdschedError | None = None


async def create_many(
    creator: JobCreator, requests: Sequence[CreateRequest]
) -> list[CreateOutcome]:
    """Create the jobs of ``requests``, each all or nothing, in packed
    transactions; one outcome per request, in order."""
    outcomes: dict[int, CreateOutcome] = {}
    later: list[tuple[int, str]] = []
    keyed = any(request.idempotency_key for request in requests)
    lease = await creator.idempotency_lease() if keyed else 0  # one for the whole batch
    packable = _packable(creator, requests, outcomes, later, lease)
    await _commit_packs(creator, packs(packable), outcomes)
    for index, job_id in later:
        outcomes[index] = await _alone(creator, job_id, requests[index])
    return [outcomes[index] for index in range(len(requests))]


def _packable(
    creator: JobCreator,
    requests: Sequence[CreateRequest],
    outcomes: dict[int, CreateOutcome],
    later: list[tuple[int, str]],
    lease: int,
) -> Iterator[Numbered]:
    """The creations that may share a transaction, built as they are taken
    (so the first pack is sent while the rest are built). An item refused
    before any write gets its outcome now; one that must go alone goes to
    ``later``. Idempotency records go under ``lease``."""
    ids: set[str] = set()
    idem_keys: set[str] = set()
    for index, request in enumerate(requests):
        try:
            job_id = _new_id(creator, request, ids)
            if request.spec.depends_on:
                later.append((index, job_id))
                continue
            key = request.idempotency_key
            creation = creator.creation_of(job_id, request.spec, key, lease if key else 0)
        except EtcdschedError as exc:
            outcomes[index] = CreateOutcome(error=exc)
            continue
        if creation.idem_key in idem_keys:
            later.append((index, job_id))
            continue
        if creation.idem_key:
            idem_keys.add(creation.idem_key)
        yield index, creation


def _new_id(creator: JobCreator, request: CreateRequest, taken: set[str]) -> str:
    """The item's full job id, once per batch (etcd refuses one key twice in
    a transaction, and the second create of an id would fail anyway)."""
    job_id = creator.checked_id(request.spec.tenant, request.job_id or new_job_name())
    if job_id in taken:
        raise Conflict(f"job {job_id} is created by an earlier item of this batch", field="id")
    taken.add(job_id)
    return job_id


async def _alone(creator: JobCreator, job_id: str, request: CreateRequest) -> CreateOutcome:
    """Create one item as ``POST /v1/jobs`` does (its dependencies checked)."""
    try:
        creation = await creator.checked_creation(request.spec, job_id, request.idempotency_key)
        return _made_or_found(creation, await creator.commit_creation(creation))
    except EtcdschedError as exc:
        return CreateOutcome(error=exc)


def _made_or_found(creation: JobCreation, record: JobRecord) -> CreateOutcome:
    return CreateOutcome(job=record, created=creation.made(record))


def packs(creations: Iterable[Numbered]) -> Iterator[list[Numbered]]:
    """``creations`` in order, cut into transactions within etcd's limits
    (a creation larger than the byte budget alone is a pack of its own)."""
    pack: list[Numbered] = []
    compares = ops = size = 0
    for item in creations:
        creation = item[1]
        weight = _bytes(creation)
        if pack and (
            compares + len(creation.compares) > MAX_TXN_OPS
            or ops + len(creation.ops) > MAX_TXN_OPS
            or size + weight > MAX_PACK_BYTES
        ):
            yield pack
            pack, compares, ops, size = [], 0, 0, 0
        pack.append(item)
        compares += len(creation.compares)
        ops += len(creation.ops)
        size += weight
    if pack:
        yield pack


def _bytes(creation: JobCreation) -> int:
    keys = sum(len(c.key) + len(c.range_end or "") for c in creation.compares)
    return keys + sum(len(op.key) + len(op.value) for op in creation.ops)


async def _commit_packs(
    creator: JobCreator, all_packs: Iterable[list[Numbered]], outcomes: dict[int, CreateOutcome]
) -> None:
    """Send each pack as soon as it is built, at most ``PACKS_IN_FLIGHT`` at
    once: etcd writes the first packs while the next are built."""
    gate = asyncio.Semaphore(PACKS_IN_FLIGHT)

    async def send(pack: list[Numbered]) -> None:
        try:
            outcomes.update(await _commit_pack(creator, pack))
        finally:
            gate.release()

    async with asyncio.TaskGroup() as group:
        for pack in all_packs:
            await gate.acquire()
            group.create_task(send(pack))
            await asyncio.sleep(0)  # it goes out now, not after the last pack is built


async def _commit_pack(
    creator: JobCreator, pack: list[Numbered]
) -> list[tuple[int, CreateOutcome]]:
    """One transaction for the whole pack; see the module docstring for
    what happens when it does not commit."""
    if len(pack) == 1:
        return await _each(pack, creator.commit_creation)
    compares = [c for _, creation in pack for c in creation.compares]
    ops = [op for _, creation in pack for op in creation.ops]
    try:
        result = await creator.store.txn(compares, ops)
    except StoreRejected:
        return await _each(pack, creator.commit_creation)  # a limit we did not know of
    except StoreUnavailable:  # OutcomeUnknown included: it may have been applied

        async def resolve(creation: JobCreation) -> JobRecord:
            return await creator.resolve_creation(creation, maybe_ours=True)

        return await _each(pack, resolve)
    if not result.succeeded:
        return await _each(pack, creator.commit_creation)
    return [(index, CreateOutcome(job=creation.job, created=True)) for index, creation in pack]


async def _each(
    pack: list[Numbered], settle: Callable[[JobCreation], Awaitable[JobRecord]]
) -> list[tuple[int, CreateOutcome]]:
    """``settle`` every member of ``pack`` on its own, concurrently."""

    async def one(creation: JobCreation) -> CreateOutcome:
        try:
            return _made_or_found(creation, await settle(creation))
        except EtcdschedError as exc:
            return CreateOutcome(error=exc)

    outcomes = await asyncio.gather(*(one(creation) for _, creation in pack))
    return [(index, outcome) for (index, _), outcome in zip(pack, outcomes, strict=True)]


async def find_replays(
    creator: JobCreator, requests: Mapping[int, CreateRequest]
) -> dict[int, CreateOutcome]:
    """The requests whose idempotency key an earlier create already used,
    with that create's job: they are answered without writing (and do not
    count against a quota, as a replay of ``POST /v1/jobs`` does not). A
    key too long is left for the create to refuse."""
    keyed: dict[int, str] = {}
    for index, request in requests.items():
        try:
            key = creator.idempotency_key(request.spec.tenant, request.idempotency_key)
        except EtcdschedError:
            continue
        if key:
            keyed[index] = key
    used = await read_many(creator.store, list(keyed.values()))
    job_ids = {i: used[key].value.decode() for i, key in keyed.items() if key in used}
    records = await read_many(creator.store, [creator.keys.job(j) for j in job_ids.values()])
    found: dict[int, CreateOutcome] = {}
    for index, job_id in job_ids.items():
        kv = records.get(creator.keys.job(job_id))
        if kv is None:
            found[index] = CreateOutcome(error=NotFound(f"job {job_id} not found", field="id"))
        else:
            found[index] = CreateOutcome(job=kv.decode(JobRecord).value, created=False)
    return found


async def read_many(store: Store, keys: Sequence[str]) -> dict[str, KV]:
    """The keys of ``keys`` that exist, read in a few read-only transactions."""
    keys = list(dict.fromkeys(keys))  # two items may name one key
    chunks = [keys[at : at + MAX_TXN_OPS] for at in range(0, len(keys), MAX_TXN_OPS)]
    results = await asyncio.gather(
        *(store.txn([], [Ops.get(key) for key in chunk]) for chunk in chunks)
    )
    return {kvs[0].key: kvs[0] for result in results for kvs in result.responses if kvs}
