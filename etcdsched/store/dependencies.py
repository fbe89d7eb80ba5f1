"""``depends_on`` as a job is created or replaced: it names jobs of the same
tenant that exist, and no cycle (a job waiting on itself, however far
round, would never run). Names become full ids (``<tenant>:<name>``)."""

from __future__ import annotations

import asyncio

from etcdsched.model.errors import InvalidInput
from etcdsched.model.records import JobRecord
from etcdsched.model.spec import JobSpec
from etcdsched.store.keys import KeyError_, Keys, full_job_id
from etcdsched.store.kv import Store

MAX_WALK = 1000
"""Upstream jobs read at most while looking for a cycle."""


async def checked_dependencies(store: Store, keys: Keys, job_id: str, spec: JobSpec) -> JobSpec:
    """``spec`` with full upstream ids, or a 422 naming the entry at fault."""
    upstream: list[str] = []
    for index, name in enumerate(spec.depends_on):
        try:
            upstream.append(full_job_id(spec.tenant, name))
        except KeyError_ as exc:
            raise InvalidInput(str(exc), field=f"spec.depends_on[{index}]") from None
    if job_id in upstream:
        raise InvalidInput(f"job {job_id} cannot depend on itself", field="spec.depends_on")
    records = await _records(store, keys, upstream)
    for index, (dep, record) in enumerate(zip(upstream, records, strict=True)):
        if record is None:
            raise InvalidInput(
                f"depends_on names {dep}, which does not exist", field=f"spec.depends_on[{index}]"
            )
    await _refuse_cycle(store, keys, job_id, [r for r in records if r is not None])
    return spec.model_copy(update={"depends_on": list(dict.fromkeys(upstream))})


async def _records(store: Store, keys: Keys, job_ids: list[str]) -> list[JobRecord | None]:
    kvs = await asyncio.gather(*(store.get(keys.job(job_id)) for job_id in job_ids))
    return [kv.decode(JobRecord).value if kv is not None else None for kv in kvs]


async def _refuse_cycle(store: Store, keys: Keys, job_id: str, direct: list[JobRecord]) -> None:
    """Walk upstream from the direct dependencies; reaching ``job_id`` is a cycle."""
    seen = {record.id for record in direct}
    frontier = direct
    while frontier and len(seen) <= MAX_WALK:
        ahead = [up for record in frontier for up in record.spec.depends_on]
        if job_id in ahead:
            raise InvalidInput(
                f"depends_on would make a cycle: {job_id} is upstream of its own upstream",
                field="spec.depends_on",
            )
        fresh = [up for up in dict.fromkeys(ahead) if up not in seen]
        seen.update(fresh)
        frontier = [r for r in await _records(store, keys, fresh) if r is not None]
