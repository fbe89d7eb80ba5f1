"""Per-tenant limits, checked before a submission is written.

Costs, paid only by tenants that have the limit set:

* ``submissions_per_second``: an in-process token bucket (no etcd request).
* ``max_jobs``: jobs are keyed by id, not tenant, so the check reads every
  job record (paged). O(all jobs) per job creation of a limited tenant, and
  per batch (``admit_jobs`` counts the batch's new jobs at once).
* ``max_active_runs``: the tenant's job ids (as above) plus a keys-only
  range of each partition's active index. O(jobs + active runs).

Both counts are read before the write without a compare, so concurrent
submissions can overshoot a limit by the number racing; they are soft
limits. An exact ``max_jobs`` would need a per-tenant counter key updated in
the job-creation transaction.
"""

from __future__ import annotations

import asyncio

from etcdsched.api.auth import Authenticator, RateLimiter, TenantLimits
from etcdsched.api.services import ApiServices
from etcdsched.model.errors import QuotaExceeded
from etcdsched.model.records import JobRecord
from etcdsched.store.cache import list_all
from etcdsched.store.kv import prefix_end

# A full tenant frees capacity only when something finishes or is deleted;
# tell clients to come back after this many seconds.
FULL_RETRY_AFTER = 30.0


class Quotas:
    def __init__(self, services: ApiServices, auth: Authenticator, limiter: RateLimiter) -> None:
        self._services = services
        self._auth = auth
        self._limiter = limiter

    async def _limits(self, tenant: str) -> TenantLimits:
        record = await self._auth.tenant(tenant)
        return record.limits if record else TenantLimits()

    async def admit_job(self, tenant: str) -> None:
        """Raise :class:`QuotaExceeded` if ``tenant`` may not create a job now."""
        await self.admit_jobs(tenant, 1)

    async def admit_jobs(self, tenant: str, count: int) -> None:
        """Raise :class:`QuotaExceeded` if ``tenant`` may not create ``count``
        jobs now: a batch is admitted whole or not at all, reading the
        tenant's jobs once (not once per job)."""
        limits = await self._limits(tenant)
        if limits.max_jobs is not None:
            jobs = await self._tenant_job_ids(tenant)
            if len(jobs) + count > limits.max_jobs:
                adding = f", adding {count}" if count > 1 else ""
                raise QuotaExceeded(
                    f"tenant {tenant} has {len(jobs)} jobs{adding} (max_jobs {limits.max_jobs})",
                    retry_after=FULL_RETRY_AFTER,
                )
        self._take(tenant, limits, count)

    async def admit_runs(self, tenant: str, count: int) -> None:
        """Raise :class:`QuotaExceeded` if ``tenant`` may not start ``count`` runs now."""
        limits = await self._limits(tenant)
        if limits.max_active_runs is not None:
            active = await self._active_runs(tenant)
            if active + count > limits.max_active_runs:
                raise QuotaExceeded(
                    f"tenant {tenant} has {active} active runs "
                    f"(max_active_runs {limits.max_active_runs})",
                    retry_after=FULL_RETRY_AFTER,
                )
        self._take(tenant, limits)

    def _take(self, tenant: str, limits: TenantLimits, count: int = 1) -> None:
        if limits.submissions_per_second is not None:
            self._limiter.take(tenant, limits.submissions_per_second, cost=count)

    async def _tenant_job_ids(self, tenant: str) -> set[str]:
        keys = self._services.keys
        prefix = keys.jobs_prefix()
        items, _ = await list_all(self._services.store, prefix, prefix_end(prefix))
        ids: set[str] = set()
        for kv in items.values():
            job = kv.decode(JobRecord).value
            if job.spec.tenant == tenant:
                ids.add(job.id)
        return ids

    async def _active_runs(self, tenant: str) -> int:
        jobs = await self._tenant_job_ids(tenant)
        if not jobs:
            return 0
        keys, store = self._services.keys, self._services.store
        partitions = {self._services.jobs.partition(job) for job in jobs}

        async def count(pp: int) -> int:
            prefix = keys.active_prefix(pp)
            page = await list_all(store, prefix, prefix_end(prefix))
            return sum(1 for key in page[0] if keys.parse_active(key)[1].job_id in jobs)

        return sum(await asyncio.gather(*(count(pp) for pp in sorted(partitions))))
