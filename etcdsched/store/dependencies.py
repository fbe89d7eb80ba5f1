"""A job's upstream jobs as it is created or replaced: ``depends_on`` and an
``after`` trigger's ``jobs`` name jobs of the same tenant that exist, and no
cycle (a job waiting on itself, however far round, would never run; two
``after`` jobs triggering each other would run forever). Names become full
ids (``<tenant>:<name>``). See docs/dependencies.md."""

from __future__ import annotations

import asyncio

from etcdsched.model.errors import InvalidInput
from etcdsched.model.records import JobRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.triggers import AfterTrigger
from etcdsched.store.keys import KeyError_, Keys, full_job_id
from etcdsched.store.kv import Store

MAX_WALK = 1000
"""Upstream jobs read at most while looking for a cycle."""


def upstream_of(spec: JobSpec) -> list[str]:
    """Every job ``spec`` waits for or is triggered by (as stored: full ids)."""
    after = spec.trigger.jobs if isinstance(spec.trigger, AfterTrigger) else []
    return list(dict.fromkeys([*spec.depends_on, *after]))


def named_in_full(spec: JobSpec) -> JobSpec:
    """``spec`` with its upstream names as full ids, as a create stores it
    (raises ``KeyError_`` for a name that is no job id)."""

    def full(names: list[str]) -> list[str]:
        return list(dict.fromkeys(full_job_id(spec.tenant, name) for name in names))

    update: dict[str, object] = {"depends_on": full(spec.depends_on)}
    if isinstance(spec.trigger, AfterTrigger):
        update["trigger"] = spec.trigger.model_copy(update={"jobs": full(spec.trigger.jobs)})
    return spec.model_copy(update=update)


async def checked_dependencies(store: Store, keys: Keys, job_id: str, spec: JobSpec) -> JobSpec:
    """``spec`` with full upstream ids, or a 422 naming the entry at fault."""
    depends_on = await _checked(store, keys, job_id, spec.tenant, spec.depends_on, "depends_on")
    update: dict[str, object] = {"depends_on": depends_on}
    if isinstance(spec.trigger, AfterTrigger):
        jobs = await _checked(store, keys, job_id, spec.tenant, spec.trigger.jobs, "trigger.jobs")
        update["trigger"] = spec.trigger.model_copy(update={"jobs": jobs})
    checked = spec.model_copy(update=update)
    records = await _records(store, keys, upstream_of(checked))
    await _refuse_cycle(store, keys, job_id, [r for r in records if r is not None])
    return checked


async def _checked(
    store: Store, keys: Keys, job_id: str, tenant: str, names: list[str], field: str
) -> list[str]:
    """``names`` as full ids of existing jobs of ``tenant``, not ``job_id``."""
    upstream: list[str] = []
    for index, name in enumerate(names):
        try:
            upstream.append(full_job_id(tenant, name))
        except KeyError_ as exc:
            raise InvalidInput(str(exc), field=f"spec.{field}[{index}]") from None
    if job_id in upstream:
        raise InvalidInput(f"job {job_id} cannot depend on itself", field=f"spec.{field}")
    records = await _records(store, keys, upstream)
    for index, (dep, record) in enumerate(zip(upstream, records, strict=True)):
        if record is None:
            raise InvalidInput(
                f"{field} names {dep}, which does not exist", field=f"spec.{field}[{index}]"
            )
    return list(dict.fromkeys(upstream))


async def _records(store: Store, keys: Keys, job_ids: list[str]) -> list[JobRecord | None]:
    kvs = await asyncio.gather(*(store.get(keys.job(job_id)) for job_id in job_ids))
    return [kv.decode(JobRecord).value if kv is not None else None for kv in kvs]


async def _refuse_cycle(store: Store, keys: Keys, job_id: str, direct: list[JobRecord]) -> None:
    """Walk upstream from the direct upstream jobs; reaching ``job_id`` is a cycle."""
    seen = {record.id for record in direct}
    frontier = direct
    while frontier and len(seen) <= MAX_WALK:
        ahead = [up for record in frontier for up in upstream_of(record.spec)]
        if job_id in ahead:
            raise InvalidInput(
                f"the upstream jobs would make a cycle: {job_id} is upstream of its own upstream",
                field="spec.depends_on",
            )
        fresh = [up for up in dict.fromkeys(ahead) if up not in seen]
        seen.update(fresh)
        frontier = [r for r in await _records(store, keys, fresh) if r is not None]
