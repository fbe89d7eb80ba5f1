"""The jobs page: the caller's jobs with their schedule in words, next
slot, last outcome and a sparkline of their last runs; pause, resume and
trigger for editors.

The listing is the JSON API's own (:func:`~etcdsched.api.routes_jobs.job_page`),
so the filters and what a tenant sees are the API's. Per row it adds two
reads, sent together: one transaction for every row's due pointer, and one
short descending range per job for its last runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from urllib.parse import urlencode

from aiohttp import web
from pydantic import ValidationError

from etcdsched.api import routes_jobs
from etcdsched.api.errors import validation_detail
from etcdsched.api.schemas import JobListQuery, ResumeBody, TriggerBody
from etcdsched.api.services import ApiServices
from etcdsched.api.ui.session import View, action, dashboard_path, page, see_other
from etcdsched.model.describe import describe_schedule
from etcdsched.model.errors import InvalidInput
from etcdsched.model.records import DueEntry, JobRecord, RunRecord
from etcdsched.store.kv import Ops, prefix_end

PAGE_SIZE = 50
SPARK_RUNS = 20
_FILTERS = ("tenant", "state", "label", "cursor")


@dataclass
class JobRow:
    job: JobRecord
    schedule: str
    next_ms: int | None
    runs: list[RunRecord] = field(default_factory=list)
    """Newest last, at most :data:`SPARK_RUNS`."""

    @property
    def next_note(self) -> str:
        """Why there is no next slot to show."""
        if self.job.state == "paused":
            return "paused"
        if self.job.spec.trigger.kind == "after":
            return "when its upstream runs end"
        return "none: the trigger has ended"

    @property
    def last_outcome(self) -> RunRecord | None:
        """The newest run that has ended."""
        return next((run for run in reversed(self.runs) if run.state.terminal), None)

    @property
    def spark_summary(self) -> str:
        counts: dict[str, int] = {}
        for run in self.runs:
            counts[run.state] = counts.get(run.state, 0) + 1
        shown = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        return f"last {len(self.runs)} runs: {shown}" if self.runs else "no runs yet"


def list_query(view: View) -> JobListQuery:
    """The filters of the page's form as the API's query (empty fields unset)."""
    query = view.request.query
    data: dict[str, object] = {"limit": PAGE_SIZE}
    for name in _FILTERS:
        values = [part for value in query.getall(name, []) for part in value.split()]
        if values:
            data[name] = values if name == "label" else values[-1]
    try:
        return JobListQuery.model_validate(data)
    except ValidationError as exc:
        message, field_name = validation_detail(exc)
        raise InvalidInput(message, field=field_name) from None


async def job_rows(services: ApiServices, jobs: list[JobRecord]) -> list[JobRow]:
    """Each job with its next slot and its last runs."""
    if not jobs:
        return []
    store, keys = services.store, services.keys
    dues = store.txn([], [Ops.get(keys.due_pointer(job.id)) for job in jobs])
    ranges = asyncio.gather(
        *(
            store.range(
                keys.runs_prefix(job.id),
                prefix_end(keys.runs_prefix(job.id)),
                limit=SPARK_RUNS,
                descending=True,
            )
            for job in jobs
        )
    )
    due_result, run_pages = await asyncio.gather(dues, ranges)
    rows = []
    for job, due_kvs, runs in zip(jobs, due_result.responses, run_pages, strict=True):
        due = due_kvs[0].decode(DueEntry).value if due_kvs else None
        next_ms = due.due_ms if due is not None and job.state == "active" else None
        decoded = [kv.decode(RunRecord).value for kv in reversed(runs.kvs)]
        rows.append(JobRow(job, describe_schedule(job.spec.trigger), next_ms, decoded))
    return rows


@page
async def jobs_page(view: View) -> web.StreamResponse:
    view.require(routes_jobs.list_jobs)
    query = list_query(view)
    listing = await routes_jobs.job_page(view.call(query=query), query)
    rows = await job_rows(view.ctx.services, listing.items)
    return view.page(
        "jobs.html",
        rows=rows,
        query=query,
        labels=" ".join(query.label),
        next_href=_next_href(view, listing.next_cursor),
        can_edit=view.who_may(routes_jobs.pause_job),
        here=view.request.path_qs,
    )


def _next_href(view: View, cursor: str | None) -> str:
    if cursor is None:
        return ""
    kept = [(k, v) for k, v in view.request.query.items() if k != "cursor"]
    return "/ui/jobs?" + urlencode([*kept, ("cursor", cursor)])


async def _after_action(view: View) -> web.StreamResponse:
    form = await view.request.post()
    job_page = f"/ui/jobs/{view.call().job_id()}"
    return see_other(dashboard_path(str(form.get("next", "")), job_page))


@action
async def pause(view: View) -> web.StreamResponse:
    view.require(routes_jobs.pause_job)
    await routes_jobs.pause_job(view.call())
    return await _after_action(view)


@action
async def resume(view: View) -> web.StreamResponse:
    view.require(routes_jobs.resume_job)
    form = await view.request.post()
    catch_up = "run_once" if form.get("catch_up") == "run_once" else "skip"
    await routes_jobs.resume_job(view.call(body=ResumeBody(catch_up=catch_up)))
    return await _after_action(view)


@action
async def trigger(view: View) -> web.StreamResponse:
    view.require(routes_jobs.trigger_job)
    await routes_jobs.trigger_job(view.call(body=TriggerBody()))
    return await _after_action(view)
