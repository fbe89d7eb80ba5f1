"""``POST /v1/jobs:batch``: many job creates in one request, each with the
result ``POST /v1/jobs`` would have given it alone.

The request fails as a whole only when it is not a batch at all (not JSON,
no ``items``, more than ``MAX_BATCH``) or the caller may not create jobs.
Everything about one item (its input, its tenant, its quota, its id, its
idempotency key) is that item's result, so one bad job never costs the
caller the other 999. The writing is ``etcdsched.store.job_batch``'s.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from etcdsched.api.errors import validation_detail
from etcdsched.api.routes_jobs import (
    IDEMPOTENCY,
    own_spec,
    same_request,
    spec_fits,
    tenant_allows,
)
from etcdsched.api.routing import Call, Header, Route, json_model
from etcdsched.api.schemas import (
    ErrorDetail,
    JobBatchBody,
    JobBatchItem,
    JobBatchResult,
    JobBatchResults,
)
from etcdsched.model.errors import Conflict, EtcdschedError, InvalidInput, QuotaExceeded
from etcdsched.runtime.quoting import quoted
from etcdsched.store.job_batch import CreateOutcome, CreateRequest, create_many, find_replays

log = logging.getLogger(__name__)
MINIMAL = "return=minimal"
PREFER = Header("Prefer", "return=minimal: each result without its job record (its id is there).")
PREFERENCE_APPLIED = Header("Preference-Applied", "return=minimal, when it was.")
ITEM_FIELDS = {IDEMPOTENCY.name: "idempotency_key"}
"""Fields a create alone names that an item spells differently."""


async def create_job_batch(call: Call) -> web.StreamResponse:
    items = call.body_as(JobBatchBody).items
    with_jobs = not _prefers_minimal(call)
    results: dict[int, JobBatchResult] = {}
    requests = await _admissible_items(call, items, results)
    replays = await find_replays(call.services.jobs, requests)
    for index, outcome in replays.items():
        results[index] = _result(index, requests.pop(index), outcome, with_jobs)
    await _admit_by_tenant(call, requests, results)
    order = list(requests)
    created = await create_many(call.services.jobs, [requests[i] for i in order])
    for index, outcome in zip(order, created, strict=True):
        results[index] = _result(index, requests[index], outcome, with_jobs)
    answer = JobBatchResults(results=[results[i] for i in range(len(items))])
    return json_model(answer, headers=None if with_jobs else {"Preference-Applied": MINIMAL})


def _prefers_minimal(call: Call) -> bool:
    """``Prefer: return=minimal`` (RFC 7240): the ids are enough. A
    thousand job records are most of the work of answering, and of reading
    the answer, for a client that only wants to know what was created."""
    header = call.request.headers.get(PREFER.name, "")
    return any(part.strip().lower() == MINIMAL for part in header.split(","))


async def _admissible_items(
    call: Call, items: list[Any], results: dict[int, JobBatchResult]
) -> dict[int, CreateRequest]:
    """Each item as a create request, checked as ``POST /v1/jobs`` checks
    its body and tenant; an item that fails gets its result now."""
    requests: dict[int, CreateRequest] = {}
    for index, raw in enumerate(items):
        try:
            item = raw if isinstance(raw, JobBatchItem) else _item(index, raw)
            spec = spec_fits(item.spec, call.body_bytes)
            spec = await tenant_allows(call, own_spec(call.who, spec))
        except EtcdschedError as exc:
            results[index] = _failed(index, exc)
            continue
        requests[index] = CreateRequest(spec, item.id, item.idempotency_key)
    return requests


def _item(index: int, raw: object) -> JobBatchItem:
    """An item the request's validation let through as it came: validated
    again alone (from JSON, as it arrived) for the error naming its field."""
    try:
        return JobBatchItem.model_validate_json(json.dumps(raw))
    except ValidationError as exc:
        message, field = validation_detail(exc, (f"items[{index}]",))
        raise InvalidInput(message, field=field) from None


async def _admit_by_tenant(
    call: Call, requests: dict[int, CreateRequest], results: dict[int, JobBatchResult]
) -> None:
    """Quotas, once per tenant for all its new jobs in the batch: a tenant
    over its limit gets every one of its new items refused (they leave
    ``requests``), the other tenants' items go on."""
    by_tenant: dict[str, list[int]] = {}
    for index, request in requests.items():
        by_tenant.setdefault(request.spec.tenant, []).append(index)
    for tenant, indexes in by_tenant.items():
        try:
            await call.ctx.quotas.admit_jobs(tenant, len(indexes))
        except QuotaExceeded as exc:
            for index in indexes:
                del requests[index]
                results[index] = _failed(index, exc)


def _result(
    index: int, request: CreateRequest, outcome: CreateOutcome, with_job: bool
) -> JobBatchResult:
    if outcome.error is not None:
        return _failed(index, outcome.error)
    job = outcome.job
    assert job is not None, "an outcome holds a job or an error"
    if not outcome.created and not same_request(job, request.spec, request.job_id):
        reused = Conflict(
            f"idempotency_key was already used for a different request (job {job.id})",
            field=IDEMPOTENCY.name,
        )
        return _failed(index, reused)
    status = 201 if outcome.created else 200
    return JobBatchResult(index=index, status=status, id=job.id, job=job if with_job else None)


def _failed(index: int, exc: EtcdschedError) -> JobBatchResult:
    """The error body a create alone would have answered, its field named
    within the batch (``items[3].spec.tenant``)."""
    if exc.http_status >= 500:
        log.warning("batch item %d failed: %s: %s", index, exc.code, quoted(exc.message))
    field = exc.field
    if field is not None and not field.startswith("items["):
        field = f"items[{index}].{ITEM_FIELDS.get(field, field)}"
    detail = ErrorDetail(code=exc.code, message=exc.message, field=field)
    return JobBatchResult(index=index, status=exc.http_status, error=detail)


ROUTES = [
    Route(
        "POST",
        "/v1/jobs:batch",
        create_job_batch,
        "Create up to 1000 jobs, each with its own result",
        "jobs",
        body=JobBatchBody,
        response=JobBatchResults,
        headers=(PREFER,),
        response_headers=(PREFERENCE_APPLIED,),
    ),
]
