"""The job page: the slot ledger, the next slots as the trigger code
computes them (with their DST marks), the spec as YAML, and its edit with
a version check.

Reads go through the JSON routes' functions (``visible_job``,
``run_page``) so a job of another tenant is a 404 here as there; the edit
is the API's replace, with the version the page was rendered from as its
precondition, so a change made meanwhile is refused, not overwritten.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web
from pydantic import ValidationError

from etcdsched.api import routes_jobs, routes_runs
from etcdsched.api.errors import validation_detail
from etcdsched.api.schemas import ReplaceJobBody, RunListQuery, VersionQuery
from etcdsched.api.ui.ledger import LedgerCell, ledger
from etcdsched.api.ui.session import View, action, page, see_other
from etcdsched.model.describe import UpcomingSlot, describe_schedule, upcoming_slots
from etcdsched.model.errors import Conflict, EtcdschedError, InvalidInput
from etcdsched.model.records import JobRecord, SkipRecord
from etcdsched.store.jobs import JobState
from etcdsched.store.kv import prefix_end

LEDGER_RUNS = 60
LEDGER_SKIPS = 60
UPCOMING = 10
MAX_YAML_CHARS = 400_000


@dataclass
class EditState:
    """The edit form: what it shows, and why the last try was refused."""

    text: str
    version: int
    error: str = ""


@dataclass
class JobPageData:
    job: JobRecord
    schedule: str
    next_ms: int | None
    cells: list[LedgerCell]
    upcoming: list[UpcomingSlot]
    upcoming_note: str
    spec_yaml: str
    edit: EditState
    counts: dict[str, int] = field(default_factory=dict)


def spec_yaml(job: JobRecord) -> str:
    """The spec as a user would write it: without the fields at their defaults."""
    data = job.spec.model_dump(mode="json", exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _upcoming(state: JobState, now_ms: int) -> tuple[list[UpcomingSlot], str]:
    """The next slots from the due entry on (the next unfired slot), or why none."""
    job, due = state.job.value, state.due.value if state.due else None
    trigger = job.spec.trigger
    if due is None:
        return [], "no further slot: the trigger has ended"
    if due.due_ms is None:
        return [], describe_schedule(trigger) + ": runs come when the upstream runs end"
    count = UPCOMING
    if trigger.max_runs is not None:
        count = max(0, min(count, trigger.max_runs - due.fired))
    after = due.slot_ms - 1 if job.state == "active" else now_ms
    slots = upcoming_slots(trigger, after, job.anchor_ms, count)
    note = "paused: these slots would come after a resume" if job.state == "paused" else ""
    return slots, note


async def _recent_skips(view: View, job_id: str) -> list[SkipRecord]:
    """The newest skip records (the job is already known visible)."""
    keys, store = view.ctx.services.keys, view.ctx.services.store
    prefix = keys.skips_prefix(job_id)
    page = await store.range(prefix, prefix_end(prefix), limit=LEDGER_SKIPS, descending=True)
    return [kv.decode(SkipRecord).value for kv in reversed(page.kvs)]


async def load_job_page(view: View, job_id: str, edit: EditState | None = None) -> JobPageData:
    state = await routes_jobs.visible_job(view.call(), job_id)
    job = state.job.value
    query = RunListQuery(limit=LEDGER_RUNS)
    runs = await routes_runs.run_page(view.call(query=query), job_id, query)
    skips = await _recent_skips(view, job_id)
    items = list(reversed(runs.items))
    cells = ledger(items, skips, complete=runs.next_cursor is None)
    upcoming, note = _upcoming(state, view.ctx.services.clock.now_ms())
    counts: dict[str, int] = {}
    for cell in cells:
        counts[cell.state] = counts.get(cell.state, 0) + 1
    text = spec_yaml(job)
    return JobPageData(
        job=job,
        schedule=describe_schedule(job.spec.trigger),
        next_ms=state.due.value.due_ms if state.due and job.state == "active" else None,
        cells=cells,
        upcoming=upcoming,
        upcoming_note=note,
        spec_yaml=text,
        edit=edit or EditState(text, job.version),
        counts=counts,
    )


def _render(view: View, data: JobPageData, status: int = 200) -> web.Response:
    return view.page(
        "job.html",
        status,
        data=data,
        job=data.job,
        can_edit=view.who_may(routes_jobs.replace_job),
        here=view.request.path,
    )


@page
async def job_page(view: View) -> web.StreamResponse:
    view.require(routes_jobs.get_job)
    job_id = view.call().job_id()
    return _render(view, await load_job_page(view, job_id))


def _parse_spec(text: str) -> ReplaceJobBody:
    """The edited YAML as the API's replace body, or a 422 naming the field."""
    if len(text) > MAX_YAML_CHARS:
        raise InvalidInput(f"the spec is over {MAX_YAML_CHARS} characters", field="spec")
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"not valid YAML: {exc}", field="spec") from None
    if not isinstance(data, dict):
        raise InvalidInput("the spec must be a YAML mapping", field="spec")
    try:
        return ReplaceJobBody.model_validate({"spec": data})
    except ValidationError as exc:
        message, field_name = validation_detail(exc)
        raise InvalidInput(message, field=field_name) from None


@action
async def edit_job(view: View) -> web.StreamResponse:
    """Replace the spec if the job is still at the version the form was
    rendered from; refused, the page comes back with the text as sent."""
    view.require(routes_jobs.replace_job)
    job_id = view.call().job_id()
    form = await view.request.post()
    text = str(form.get("spec", ""))
    version_text = str(form.get("version", ""))
    version = int(version_text) if version_text.isdigit() and len(version_text) < 18 else 0
    try:
        body = _parse_spec(text)
        size = len(json.dumps(body.model_dump(mode="json")))
        call = view.call(body=body, query=VersionQuery(version=version), size=size)
        await routes_jobs.replace_job(call)
    except (InvalidInput, Conflict) as exc:
        edit = EditState(text, version, _refusal(exc))
        return _render(view, await load_job_page(view, job_id, edit), exc.http_status)
    return see_other(f"/ui/jobs/{job_id}")


def _refusal(exc: EtcdschedError) -> str:
    if isinstance(exc, Conflict):
        return f"{exc.message} (reload the page to edit the current version)"
    return f"{exc.field}: {exc.message}" if exc.field else exc.message
