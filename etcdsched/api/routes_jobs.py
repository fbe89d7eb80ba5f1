"""Jobs: create, list, read, replace, delete, pause, resume, trigger, backfill.

Visibility: a tenant token sees only its tenant's jobs; another tenant's job
is reported as not found (404), exactly like a missing one.
"""

from __future__ import annotations

import hashlib
import re

from aiohttp import web

from etcdsched.api.auth import Principal, TenantLimits
from etcdsched.api.paging import after_cursor, filtered_range, open_cursor, seal_cursor
from etcdsched.api.routes_runs import cancel_run
from etcdsched.api.routing import Call, Header, Route, json_model
from etcdsched.api.schemas import (
    BackfillBody,
    BackfillResult,
    CreateJobBody,
    DeleteQuery,
    DeleteResult,
    JobListQuery,
    JobPage,
    JobView,
    ReplaceJobBody,
    ResumeBody,
    TriggerBody,
    VersionQuery,
    to_ms,
)
from etcdsched.model.errors import (
    Conflict,
    EtcdschedError,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PreconditionRequired,
)
from etcdsched.model.records import JobRecord, RunRecord
from etcdsched.model.spec import JobSpec, loader_variables
from etcdsched.model.triggers import count_slots_between
from etcdsched.store.dependencies import named_in_full
from etcdsched.store.job_create import MAX_IDEMPOTENCY_KEY
from etcdsched.store.jobs import JobState
from etcdsched.store.keys import JOB_ID_PATTERN, KeyError_, full_job_id
from etcdsched.store.kv import KV, prefix_end

IDEMPOTENCY = Header(
    "Idempotency-Key",
    "Repeat a create safely: same key, same job.",
    {"type": "string", "maxLength": MAX_IDEMPOTENCY_KEY},
)
IF_MATCH = Header(
    "If-Match",
    "Job version (its ETag) the change is based on. Required unless ?version= or"
    " ?force=true says otherwise (428).",
    {"type": "string", "pattern": r'^(W/)?("[0-9]{1,18}"|[0-9]{1,18})$'},
)
_VERSION_TAG = re.compile(r'^\s*(?:W/)?("?)([0-9]{1,18})\1\s*$')
ETAG = Header(
    "ETag", 'The job\'s version, quoted: "3".', {"type": "string", "pattern": '^"[0-9]+"$'}, True
)
LOCATION = Header("Location", "The new job's path: /v1/jobs/<full id>.", required=True)
MAX_SPEC_BYTES = 384 * 1024
"""A spec's stored JSON, at most. Creating or replacing a job writes it
three times in one etcd transaction (the job record, its due entry and the
due pointer, which holds the entry again), and firing it as many (the next
due entry, its pointer, the run's snapshot); etcd refuses a request over
1.5 MiB (``--max-request-bytes``) whole. Three copies of this much, with
their keys and records, fit with a quarter to spare."""
_SPEC_DEFAULTS_SLACK = 16 * 1024
"""What a spec's stored JSON can have that its request did not: the fields
left at their defaults (about 1.3 KB). Decoding never lengthens anything
else (an escape is never shorter than what it stands for), so a body
shorter than ``MAX_SPEC_BYTES`` by this much holds no spec over it."""


def spec_fits(spec: JobSpec, body_bytes: int) -> JobSpec:
    """``spec``, or 413 (field ``spec``) if it is too large to be stored:
    refused here, not as an etcd error after the request was sent."""
    if body_bytes + _SPEC_DEFAULTS_SLACK <= MAX_SPEC_BYTES:
        return spec
    size = len(spec.model_dump_json())
    if size > MAX_SPEC_BYTES:
        raise PayloadTooLarge(
            f"the spec is {size} bytes as stored, over the {MAX_SPEC_BYTES}-byte limit"
            " (three copies of it must fit one etcd request)",
            field="spec",
        )
    return spec


def own_spec(who: Principal, spec: JobSpec, default_tenant: str | None = None) -> JobSpec:
    """Fill in the tenant when the body left it out; refuse writing into a
    tenant the token does not belong to."""
    if "tenant" not in spec.model_fields_set:
        tenant = default_tenant or (who.tenant if not who.is_admin else spec.tenant)
        spec = spec.model_copy(update={"tenant": tenant})
    if not who.sees(spec.tenant):
        raise Forbidden(
            f"a token of tenant {who.tenant} cannot write jobs of tenant {spec.tenant}",
            field="spec.tenant",
        )
    return spec


async def visible_job(call: Call, job_id: str) -> JobState:
    """The job, or 404 if it does not exist or belongs to another tenant."""
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise NotFound(f"job {job_id} not found", field="job_id")
    state = await call.services.jobs.load(job_id)
    if not call.who.sees(state.job.value.spec.tenant):
        raise NotFound(f"job {job_id} not found", field="job_id")
    return state


def _etag(job: JobRecord) -> dict[str, str]:
    return {"ETag": f'"{job.version}"'}


async def _replayed(call: Call, tenant: str, key: str | None) -> bool:
    """Whether a create with this Idempotency-Key already succeeded (a replay
    must not be refused by a quota the original passed)."""
    if not key:
        return False
    digest = hashlib.sha256(key.encode()).hexdigest()
    services = call.services
    return await services.store.get(services.keys.idempotency(tenant, digest)) is not None


def same_request(job: JobRecord, spec: JobSpec, job_id: str | None) -> bool:
    """Whether ``job``, which an idempotency key led to, is what a create of
    ``spec`` (named ``job_id``, if given) makes: a key reused for another
    request is a conflict. Names compare as the full ids they stand for,
    as the create stored them (``depends_on`` and ``after`` jobs included)."""
    try:
        wanted = full_job_id(spec.tenant, job_id) if job_id is not None else job.id
        as_stored = named_in_full(spec)
    except KeyError_:
        return False  # such a create is refused: never the stored job
    return job.id == wanted and job.spec == as_stored


async def tenant_allows(call: Call, spec: JobSpec) -> JobSpec:
    """What an admin allows the tenant (its limits): loader and interpreter
    variables, which change what runs before the job's own code, and the
    worker labels its selector may ask for."""
    tenant = await call.ctx.auth.tenant(spec.tenant)
    limits = tenant.limits if tenant is not None else TenantLimits()
    names = loader_variables(spec.execution.env)
    if names and not limits.loader_env:
        raise InvalidInput(
            f"tenant {spec.tenant} may not set {', '.join(names)} (an admin can allow it:"
            " loader_env in the tenant's limits)",
            field="spec.execution.env",
        )
    allowed = limits.selectors if limits.selectors is not None else {}
    for label, value in spec.selector.items() if limits.selectors is not None else ():
        if value not in allowed.get(label, []):
            raise InvalidInput(
                f"tenant {spec.tenant} may not select workers by {label}={value}",
                field="spec.selector",
            )
    return spec


async def create_job(call: Call) -> web.StreamResponse:
    body = call.body_as(CreateJobBody)
    spec = spec_fits(body.spec, call.body_bytes)
    spec = await tenant_allows(call, own_spec(call.who, spec))
    key = call.request.headers.get(IDEMPOTENCY.name)
    if not await _replayed(call, spec.tenant, key):
        await call.ctx.quotas.admit_job(spec.tenant)
    job = await call.services.jobs.create(spec, body.id, key)
    if key and not same_request(job, spec, body.id):
        raise Conflict(
            f"Idempotency-Key was already used for a different request (job {job.id})",
            field=IDEMPOTENCY.name,
        )
    headers = {"Location": f"/v1/jobs/{job.id}", **_etag(job)}
    return json_model(job, 201, headers)


def _job_filter(call: Call, query: JobListQuery) -> tuple[str | None, dict[str, str]]:
    tenant = query.tenant if call.who.is_admin else call.who.tenant
    return tenant, query.label_pairs()


async def list_jobs(call: Call) -> web.StreamResponse:
    return json_model(await job_page(call, call.query_as(JobListQuery)))


async def job_page(call: Call, query: JobListQuery) -> JobPage:
    """One page of the jobs the caller may see (the JSON listing and the
    dashboard's jobs page both read through here)."""
    keys = call.services.keys
    tenant, labels = _job_filter(call, query)
    if not call.who.is_admin and query.tenant not in (None, call.who.tenant):
        return JobPage(items=[])

    def accept(kv: KV) -> JobRecord | None:
        job = kv.decode(JobRecord).value
        if tenant is not None and job.spec.tenant != tenant:
            return None
        if query.state is not None and job.state != query.state:
            return None
        if any(job.spec.labels.get(k) != v for k, v in labels.items()):
            return None
        return job

    prefix = keys.tenant_jobs_prefix(tenant) if tenant is not None else keys.jobs_prefix()
    cursor_key = open_cursor(query.cursor, prefix) if query.cursor else None
    start, end = after_cursor(prefix, prefix_end(prefix), cursor_key, False)
    items, last = await filtered_range(
        call.services.store, start, end, limit=query.limit, accept=accept
    )
    cursor = seal_cursor(last, prefix) if last else None
    return JobPage(items=items, next_cursor=cursor)


async def get_job(call: Call) -> web.StreamResponse:
    state = await visible_job(call, call.job_id())
    job = state.job.value
    due = state.due.value.due_ms if state.due and job.state == "active" else None
    view = JobView.model_validate({**job.model_dump(), "next_slot_ms": due})
    return json_model(view, headers=_etag(job))


def _if_version(call: Call) -> int | None:
    """The version a replace is based on (If-Match, else ``?version=``), or
    None with ``?force=true``; 428 when none says. A client that read a job,
    changed it and wrote it back must not undo a change made meanwhile
    without noticing: an unconditional replace is asked for by name."""
    header = call.request.headers.get(IF_MATCH.name)
    query = call.query_as(VersionQuery)
    if header is None:
        if query.version is None and not query.force:
            raise PreconditionRequired(
                "a replace needs If-Match (the job's ETag), ?version=, or ?force=true",
                field=IF_MATCH.name,
            )
        return query.version
    match = _VERSION_TAG.match(header)
    if match is None:
        raise InvalidInput('If-Match must be a job version such as "3"', field=IF_MATCH.name)
    return int(match.group(2))


async def replace_job(call: Call) -> web.StreamResponse:
    job_id = call.job_id()
    if_version = _if_version(call)
    spec = spec_fits(call.body_as(ReplaceJobBody).spec, call.body_bytes)
    state = await visible_job(call, job_id)
    spec = own_spec(call.who, spec, state.job.value.spec.tenant)
    spec = await tenant_allows(call, spec)
    job = await call.services.jobs.replace(job_id, spec, if_version=if_version)
    return json_model(job, headers=_etag(job))


async def delete_job(call: Call) -> web.StreamResponse:
    job_id = call.job_id()
    query = call.query_as(DeleteQuery)
    await visible_job(call, job_id)
    active = await call.services.jobs.delete(job_id)
    cancelled: list[str] = []
    if query.cancel_active:
        reason = f"job deleted by {call.who.name}"
        for rid in active:
            try:
                await cancel_run(call.services, rid, reason, call.who.sees)
            except EtcdschedError:
                continue  # ended meanwhile, or out of reach: report what we did
            cancelled.append(rid)
    return json_model(DeleteResult(id=job_id, active_runs=active, cancelled=cancelled))


async def pause_job(call: Call) -> web.StreamResponse:
    job_id = call.job_id()
    await visible_job(call, job_id)
    return json_model(await call.services.jobs.pause(job_id))


async def resume_job(call: Call) -> web.StreamResponse:
    job_id = call.job_id()
    await visible_job(call, job_id)
    body = call.body_as(ResumeBody)
    return json_model(await call.services.jobs.resume(job_id, catch_up=body.catch_up))


async def trigger_job(call: Call) -> web.StreamResponse:
    job_id = call.job_id()
    job = (await visible_job(call, job_id)).job.value
    await call.ctx.quotas.admit_runs(job.spec.tenant, 1)
    run = await call.services.jobs.trigger(job_id, force=call.body_as(TriggerBody).force)
    return json_model(run, 201)


async def backfill_job(call: Call) -> web.StreamResponse:
    job_id = call.job_id()
    body = call.body_as(BackfillBody)
    job = (await visible_job(call, job_id)).job.value
    start, end = to_ms(body.start), to_ms(body.end)
    if end < start:
        raise InvalidInput("end must not be before start", field="end")
    slots = count_slots_between(job.spec.trigger, start - 1, end, job.anchor_ms, body.limit + 1)
    await call.ctx.quotas.admit_runs(job.spec.tenant, min(slots, body.limit))
    created = await call.services.jobs.backfill(job_id, start, end, limit=body.limit)
    return json_model(BackfillResult(created=created), 201)


ROUTES = [
    Route(
        "POST",
        "/v1/jobs",
        create_job,
        "Create a job",
        "jobs",
        body=CreateJobBody,
        response=JobRecord,
        status=201,
        headers=(IDEMPOTENCY,),
        response_headers=(LOCATION, ETAG),
        errors=(409, 413, 429),
    ),
    Route("GET", "/v1/jobs", list_jobs, "List jobs", "jobs", query=JobListQuery, response=JobPage),
    Route(
        "GET",
        "/v1/jobs/{job_id}",
        get_job,
        "Read a job",
        "jobs",
        response=JobView,
        response_headers=(ETAG,),
    ),
    Route(
        "PUT",
        "/v1/jobs/{job_id}",
        replace_job,
        "Replace a job's spec (future slots only)",
        "jobs",
        body=ReplaceJobBody,
        query=VersionQuery,
        response=JobRecord,
        headers=(IF_MATCH,),
        response_headers=(ETAG,),
        errors=(409, 413, 428),
    ),
    Route(
        "DELETE",
        "/v1/jobs/{job_id}",
        delete_job,
        "Delete a job (history stays until retention)",
        "jobs",
        query=DeleteQuery,
        response=DeleteResult,
    ),
    Route("POST", "/v1/jobs/{job_id}/pause", pause_job, "Pause a job", "jobs", response=JobRecord),
    Route(
        "POST",
        "/v1/jobs/{job_id}/resume",
        resume_job,
        "Resume a paused job",
        "jobs",
        body=ResumeBody,
        response=JobRecord,
    ),
    Route(
        "POST",
        "/v1/jobs/{job_id}/trigger",
        trigger_job,
        "Run a job now",
        "jobs",
        body=TriggerBody,
        response=RunRecord,
        status=201,
        errors=(409, 429),
    ),
    Route(
        "POST",
        "/v1/jobs/{job_id}/backfill",
        backfill_job,
        "Create runs for past slots without one",
        "jobs",
        body=BackfillBody,
        response=BackfillResult,
        status=201,
        errors=(429,),
    ),
]
