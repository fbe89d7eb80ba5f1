"""Runs: list a job's runs and skips, read one run (with why it waits),
cancel it, read or follow its log."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from etcdsched.api.logs import LOG_HEADERS, RESPONSE_HEADERS, follow_log, read_log
from etcdsched.api.paging import after_cursor, filtered_range
from etcdsched.api.routing import Call, Route, json_model
from etcdsched.api.schemas import (
    CancelBody,
    Explain,
    LogQuery,
    PageQuery,
    RunListQuery,
    RunPage,
    RunView,
    SkipPage,
    to_ms,
)
from etcdsched.api.services import ApiServices
from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.errors import (
    Conflict,
    InvalidInput,
    InvalidTransition,
    NotFound,
    OutcomeUnknown,
)
from etcdsched.model.records import RunRecord, SkipRecord
from etcdsched.model.states import EXECUTING, RunState
from etcdsched.store.keys import JOB_ID_PATTERN, KeyError_, run_id
from etcdsched.store.kv import KV, Cmp, Op, Ops, Versioned, prefix_end

CANCEL_TRIES = 5
NEARBY_SKIPS = 2


async def load_run(services: ApiServices, rid: str) -> Versioned[RunRecord]:
    try:
        return await services.jobs.runs.load(services.store, rid)
    except KeyError_:
        raise NotFound(f"run {rid} not found", field="run_id") from None


async def visible_run(call: Call, rid: str) -> Versioned[RunRecord]:
    """The run, or 404 if it does not exist or belongs to another tenant."""
    run = await load_run(call.services, rid)
    if not call.who.sees(run.value.tenant):
        raise NotFound(f"run {rid} not found", field="run_id")
    return run


# -- cancelling ------------------------------------------------------------
def _cancel_ops(
    services: ApiServices, run: RunRecord, reason: str
) -> tuple[RunRecord, list[Op]] | None:
    """The cancelled run and the ops that store it; ``None`` if nothing to do."""
    now = services.clock.now_ms()
    ops = services.jobs.runs
    if run.state is RunState.CANCELLED:
        return None
    if run.state.terminal:
        raise InvalidTransition(f"run {run.id} already ended ({run.state})", field="run_id")
    if run.state in EXECUTING:
        if run.cancel_requested:
            return None
        updated = run.model_copy(update={"cancel_requested": True, "updated_ms": now})
        return updated, [Ops.put(services.keys.run(run.id), updated), ops.cancel_assignment_op(run)]
    cancelled = ops.cancel_pending(run, now, reason)
    return cancelled, ops.settle(cancelled)


async def cancel_run(
    services: ApiServices, rid: str, reason: str, sees: Callable[[str], bool]
) -> RunRecord:
    """Cancel a run. Pending and retry_wait runs become ``cancelled`` at once;
    assigned and running ones get ``cancel_requested`` and their worker's
    assignment is rewritten with ``cancel=True`` (the worker stops the process
    and reports). Compare: the run's ``mod_revision`` is the one we read; on
    a lost race or an unknown outcome, re-read and decide again."""
    for _ in range(CANCEL_TRIES):
        current = await load_run(services, rid)
        if not sees(current.value.tenant):
            raise NotFound(f"run {rid} not found", field="run_id")
        plan = _cancel_ops(services, current.value, reason)
        if plan is None:
            return current.value
        updated, ops = plan
        try:
            result = await services.store.txn([Cmp.mod(current.key, current.mod_revision)], ops)
        except OutcomeUnknown:
            continue
        if result.succeeded:
            return updated
    raise Conflict(f"run {rid} kept changing while being cancelled; retry", field="run_id")


async def cancel(call: Call) -> web.StreamResponse:
    body = call.body_as(CancelBody)
    reason = body.reason or f"cancelled by {call.who.name}"
    run = await cancel_run(call.services, call.run_id(), reason, call.who.sees)
    return json_model(run)


# -- reading ---------------------------------------------------------------
async def _job_visibility(call: Call, job_id: str) -> bool:
    """Whether the job exists (404 if it exists for another tenant). A deleted
    job's runs stay readable, filtered by the tenant on each run."""
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise NotFound(f"job {job_id} not found", field="job_id")
    try:
        job = await call.services.jobs.get(job_id)
    except NotFound:
        return False
    if not call.who.sees(job.spec.tenant):
        raise NotFound(f"job {job_id} not found", field="job_id")
    return True


def _cursor_key(call: Call, job_id: str, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    try:
        return call.services.keys.run(run_id(job_id, cursor))
    except KeyError_:
        raise InvalidInput("not a cursor of this listing", field="cursor") from None


async def list_runs(call: Call) -> web.StreamResponse:
    return json_model(await run_page(call, call.job_id(), call.query_as(RunListQuery)))


async def run_page(call: Call, job_id: str, query: RunListQuery) -> RunPage:
    """One page of a job's runs the caller may see (the JSON listing and
    the dashboard read through here)."""
    exists = await _job_visibility(call, job_id)
    prefix = call.services.keys.runs_prefix(job_id)
    start = prefix + f"{to_ms(query.since):014d}" if query.since else prefix
    end = prefix + f"{to_ms(query.until) + 1:014d}" if query.until else prefix_end(prefix)
    descending = query.order == "desc"
    cursor_key = _cursor_key(call, job_id, query.cursor)
    start, end = after_cursor(start, end, cursor_key, descending)
    states = set(query.state)

    def accept(kv: KV) -> RunRecord | None:
        run = kv.decode(RunRecord).value
        if not call.who.sees(run.tenant) or (states and run.state not in states):
            return None
        return run

    items, last = await filtered_range(
        call.services.store, start, end, limit=query.limit, accept=accept, descending=descending
    )
    if not exists and not items and last is None and query.cursor is None:
        raise NotFound(f"job {job_id} not found", field="job_id")
    cursor = call.services.keys.parse_run(last).seq if last else None
    return RunPage(items=items, next_cursor=cursor)


async def list_skips(call: Call) -> web.StreamResponse:
    job_id = call.job_id()
    query = call.query_as(PageQuery)
    if not await _job_visibility(call, job_id):
        raise NotFound(f"job {job_id} not found", field="job_id")
    keys = call.services.keys
    prefix = keys.skips_prefix(job_id)
    cursor_key = None
    if query.cursor is not None:
        cursor_key = keys.skip(job_id, int(query.cursor))
    start, end = after_cursor(prefix, prefix_end(prefix), cursor_key, False)
    items, last = await filtered_range(
        call.services.store,
        start,
        end,
        limit=query.limit,
        accept=lambda kv: kv.decode(SkipRecord).value,
    )
    cursor = f"{keys.parse_skip(last)[1]:014d}" if last else None
    return json_model(SkipPage(items=items, next_cursor=cursor))


async def get_run(call: Call) -> web.StreamResponse:
    run = (await visible_run(call, call.run_id())).value
    explain = Explain(
        pending_reason=await pending_reason(call.services, run),
        skips=await nearby_skips(call.services, run),
    )
    view = RunView.model_validate({**run.model_dump(), "explain": explain})
    return json_model(view)


async def nearby_skips(services: ApiServices, run: RunRecord) -> list[SkipRecord]:
    """The skip records just before and just after the run's slot: they say
    what happened to the slots around this one."""
    keys, store = services.keys, services.store
    prefix = keys.skips_prefix(run.job_id)
    pivot = keys.skip(run.job_id, run.slot_ms + 1)
    before = await store.range(prefix, pivot, limit=NEARBY_SKIPS, descending=True)
    after = await store.range(pivot, prefix_end(prefix), limit=NEARBY_SKIPS)
    kvs = [*reversed(before.kvs), *after.kvs]
    return [kv.decode(SkipRecord).value for kv in kvs]


async def pending_reason(services: ApiServices, run: RunRecord) -> str | None:
    """A human explanation of why a run is not executing yet."""
    now = services.clock.now_ms()
    if run.state is RunState.RETRY_WAIT:
        last = run.current.state if run.current else "ended"
        return f"attempt {run.attempt} {last}; next attempt at {_iso(run.retry_at_ms)}"
    if run.state is RunState.ASSIGNED:
        return f"assigned to worker {run.worker}, which has not started it yet"
    if run.state is not RunState.PENDING:
        return None
    if run.not_before_ms > now:
        return f"waiting for its not-before time {_iso(run.not_before_ms)}"
    workers = await services.store.range(services.keys.members_prefix("workers"), count_only=True)
    if workers.count == 0:
        return "no live worker: waiting for one to join"
    if run.spec.selector:
        return f"queued for placement on a worker with labels {run.spec.selector}"
    return "queued for placement: waiting for a scheduler and free worker capacity"


def _iso(ms: int | None) -> str:
    return "unknown" if ms is None else ms_to_utc(ms).isoformat().replace("+00:00", "Z")


# -- logs ------------------------------------------------------------------
async def run_log(call: Call) -> web.StreamResponse:
    query = call.query_as(LogQuery)
    run = (await visible_run(call, call.run_id())).value
    if query.follow:
        return await follow_log(call, run, query)
    chunk = await read_log(call.services, run, query.attempt, query.offset, query.limit)
    headers = {
        LOG_HEADERS.next_offset: str(chunk.next_offset),
        LOG_HEADERS.complete: "true" if chunk.complete else "false",
        LOG_HEADERS.attempt: str(chunk.attempt),
    }
    return web.Response(body=chunk.data, content_type="text/plain", headers=headers)


ROUTES = [
    Route(
        "GET",
        "/v1/jobs/{job_id}/runs",
        list_runs,
        "List a job's runs (newest first by default)",
        "runs",
        query=RunListQuery,
        response=RunPage,
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}/skips",
        list_skips,
        "List a job's skipped-slot records",
        "runs",
        query=PageQuery,
        response=SkipPage,
    ),
    Route(
        "GET",
        "/v1/runs/{run_id}",
        get_run,
        "A run with its attempts and an explanation",
        "runs",
        response=RunView,
    ),
    Route(
        "POST",
        "/v1/runs/{run_id}/cancel",
        cancel,
        "Cancel a run",
        "runs",
        body=CancelBody,
        response=RunRecord,
    ),
    Route(
        "GET",
        "/v1/runs/{run_id}/log",
        run_log,
        "Read a run's log, or follow it while the attempt executes",
        "runs",
        query=LogQuery,
        media_type="text/plain",
        response_headers=RESPONSE_HEADERS,
        errors=(429,),
    ),
]
