"""Putting jobs into etcd fast: the keys a created job has (``jobs/<job>``,
its due entry and the due pointer, exactly what ``JobService.create``
writes), but many jobs per transaction and several transactions in flight.

Jobs that share a spec and a first slot are encoded once and the job id is
substituted in the JSON, so a million jobs cost seconds of Python, not
minutes of pydantic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from etcdsched.bench.progress import Progress
from etcdsched.model.codec import encode
from etcdsched.model.errors import OutcomeUnknown, StoreUnavailable
from etcdsched.model.records import JobRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.triggers import next_slot
from etcdsched.store.jobs import due_entry
from etcdsched.store.keys import Keys, partition_of
from etcdsched.store.kv import Op, Ops, Store

JOBS_PER_TXN = 40  # 3 puts each: 120 ops, under etcd's default --max-txn-ops 128
IN_FLIGHT = 16
_PLACEHOLDER = "BENCHJOBPLACEHOLDER"


@dataclass(frozen=True)
class JobRows:
    """One job's three keys, encoded."""

    job_id: str
    job: bytes
    due_key: str
    due: bytes


def make_spec(trigger: dict[str, Any], argv: tuple[str, ...] = ("true",), **extra: Any) -> JobSpec:
    return JobSpec.model_validate({"trigger": trigger, "execution": {"argv": list(argv)}, **extra})


def job_rows(keys: Keys, partitions: int, job_id: str, spec: JobSpec, anchor_ms: int) -> JobRows:
    """The rows ``JobService.create`` would write for a job created at ``anchor_ms``."""
    record = JobRecord(
        id=job_id, spec=spec, created_ms=anchor_ms, updated_ms=anchor_ms, anchor_ms=anchor_ms
    )
    slot = next_slot(spec.trigger, anchor_ms - 1, anchor_ms)
    if slot is None:
        raise ValueError(f"job {job_id} has no slot after {anchor_ms}")
    entry = due_entry(record, 1, slot, None)  # a new job key has etcd version 1
    due_key = keys.due(partition_of(job_id, partitions), slot, job_id)
    return JobRows(job_id, encode(record), due_key, encode(entry))


def templated_rows(
    keys: Keys, partitions: int, ids: Iterable[str], spec: JobSpec, anchor_ms: int
) -> Iterator[JobRows]:
    """Rows of many jobs with one spec and anchor, encoded once."""
    template = job_rows(keys, partitions, _PLACEHOLDER, spec, anchor_ms)
    slot = keys.parse_due(template.due_key).slot_ms
    job_json, due_json = template.job.decode(), template.due.decode()
    for job_id in ids:
        yield JobRows(
            job_id,
            job_json.replace(_PLACEHOLDER, job_id).encode(),
            keys.due(partition_of(job_id, partitions), slot, job_id),
            due_json.replace(_PLACEHOLDER, job_id).encode(),
        )


def _chunks(rows: Iterable[JobRows], keys: Keys) -> Iterator[tuple[int, list[Op]]]:
    ops: list[Op] = []
    count = 0
    for row in rows:
        ops += [
            Ops.put(keys.job(row.job_id), row.job),
            Ops.put(row.due_key, row.due),
            Ops.put(keys.due_pointer(row.job_id), row.due),
        ]
        count += 1
        if count == JOBS_PER_TXN:
            yield count, ops
            ops, count = [], 0
    if ops:
        yield count, ops


async def write_jobs(
    store: Store, keys: Keys, rows: Iterable[JobRows], total: int, label: str
) -> float:
    """Write every job; returns the seconds it took. Puts are idempotent, so
    a transaction whose outcome is unknown is simply sent again."""
    progress = Progress(label, total, " jobs")
    chunks = _chunks(rows, keys)
    written = 0

    async def writer() -> None:
        nonlocal written
        for count, ops in chunks:  # the shared iterator hands each chunk out once
            await _put_all(store, ops)
            written += count
            progress.update(written)

    await asyncio.gather(*(writer() for _ in range(IN_FLIGHT)))
    progress.done(f"({written:,} jobs)")
    return progress.elapsed


async def _put_all(store: Store, ops: list[Op]) -> None:
    for attempt in range(5):
        try:
            await store.txn([], ops)
            return
        except (OutcomeUnknown, StoreUnavailable):
            if attempt == 4:
                raise
            await asyncio.sleep(0.5 * (attempt + 1))
