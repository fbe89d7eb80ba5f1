"""Request and response bodies and query strings of the HTTP API.

Requests forbid unknown fields (a typo is a 422 naming it, never silently
ignored); responses reuse the stored records and ignore unknown fields, so
an older client keeps working against a newer server.

Instants in queries and request bodies are RFC 3339 strings with an offset;
stored records keep epoch milliseconds (fields ending in ``_ms``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from etcdsched.api.auth import Role, TenantLimits
from etcdsched.model.records import (
    JobRecord,
    OwnerRecord,
    RunRecord,
    SchedulerMember,
    SkipRecord,
    WorkerMember,
)
from etcdsched.model.spec import TENANT_PATTERN, JobSpec, PosDuration
from etcdsched.model.states import RunState
from etcdsched.store.job_create import MAX_IDEMPOTENCY_KEY

MAX_PAGE = 1000
MAX_BATCH = 1000
"""Items in one ``POST /v1/jobs:batch``."""


def to_ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Output(BaseModel):
    model_config = ConfigDict(extra="ignore")


# -- request bodies --------------------------------------------------------
class CreateJobBody(_Input):
    """``POST /v1/jobs``. Without ``id`` the server picks one; without
    ``spec.tenant`` a tenant token's own tenant is used."""

    id: str | None = Field(None, description="Job id: 1-128 of letters, digits, '_', '.', '-'.")
    spec: JobSpec


class JobBatchItem(_Input):
    """One job of ``POST /v1/jobs:batch``: a create body plus its own
    idempotency key (the ``Idempotency-Key`` header of a single create)."""

    id: str | None = Field(None, description="Job id: 1-128 of letters, digits, '_', '.', '-'.")
    spec: JobSpec
    idempotency_key: str | None = Field(
        None, min_length=1, max_length=MAX_IDEMPOTENCY_KEY, description="Repeat it safely."
    )


class JobBatchBody(_Input):
    """``POST /v1/jobs:batch``. An item that is not a valid JobBatchItem
    does not fail the request: it is taken as it came (the ``{}`` branch)
    and gets its own 422 result naming the field."""

    items: list[Annotated[JobBatchItem | Any, Field(union_mode="left_to_right")]] = Field(
        min_length=1, max_length=MAX_BATCH, description=f"1 to {MAX_BATCH} jobs to create."
    )


class ReplaceJobBody(_Input):
    """``PUT /v1/jobs/{job_id}``: the new spec, for future slots."""

    spec: JobSpec


class ResumeBody(_Input):
    catch_up: Literal["skip", "run_once"] = Field(
        "skip", description="Slots missed while paused: skip them, or run the latest once."
    )


class TriggerBody(_Input):
    force: bool = Field(False, description="Run even if the overlap policy is 'skip'.")


class BackfillBody(_Input):
    start: AwareDatetime
    end: AwareDatetime
    limit: int = Field(1000, ge=1, le=MAX_PAGE, description="Refuse ranges with more slots.")


class CancelBody(_Input):
    reason: str = Field("", max_length=512)


class TokenBody(_Input):
    tenant: str | None = Field(
        None, pattern=TENANT_PATTERN, description="Default: the caller's own tenant."
    )
    role: Role = "editor"
    name: str = Field(min_length=1, max_length=128, description="Who or what holds it.")
    expires_in: PosDuration | None = Field(None, description="e.g. 30d; default: never.")


# -- query strings ---------------------------------------------------------
class PageQuery(_Input):
    cursor: str | None = Field(None, description="next_cursor of the previous page.")
    limit: int = Field(100, ge=1, le=MAX_PAGE)


class JobListQuery(PageQuery):
    tenant: str | None = None
    state: Literal["active", "paused"] | None = None
    label: list[str] = Field(default_factory=list, description="k=v; repeat to AND them.")

    @field_validator("label")
    @classmethod
    def _pairs(cls, labels: list[str]) -> list[str]:
        for label in labels:
            if "=" not in label:
                raise ValueError(f"label filter {label!r} must be key=value")
        return labels

    def label_pairs(self) -> dict[str, str]:
        return dict(label.split("=", 1) for label in self.label)


class RunListQuery(PageQuery):
    state: list[RunState] = Field(default_factory=list, description="Repeat to OR them.")
    since: AwareDatetime | None = Field(None, description="Slots at or after this instant.")
    until: AwareDatetime | None = Field(None, description="Slots at or before this instant.")
    order: Literal["asc", "desc"] = "desc"


class VersionQuery(_Input):
    version: int | None = Field(None, ge=1, description="Refuse unless the job is at it.")


class DeleteQuery(_Input):
    cancel_active: bool = Field(
        True,
        description="Cancel the job's runs still going (default); their ids are in the answer."
        " The job's name cannot be used again until they have ended.",
    )


class LogQuery(_Input):
    attempt: int | None = Field(None, ge=1, le=1_000_000, description="Default: the latest.")
    offset: int = Field(0, ge=0, le=1 << 50, description="Byte offset (at most 2^50).")
    limit: int = Field(1 << 20, ge=1, le=1 << 20)
    follow: bool = Field(False, description="Stream while the attempt is executing.")


# -- responses -------------------------------------------------------------
class ErrorDetail(_Output):
    code: str
    message: str
    field: str | None = None


class ErrorBody(_Output):
    error: ErrorDetail


class JobBatchResult(_Output):
    """What became of one item: ``status`` is what ``POST /v1/jobs`` would
    have answered for it alone (201 created, 200 an idempotent replay)."""

    index: int = Field(description="The item's position in the request.")
    status: int
    id: str | None = Field(None, description="The job's full id (status 200 or 201).")
    job: JobRecord | None = Field(None, description="The job; null with Prefer: return=minimal.")
    error: ErrorDetail | None = None


class JobBatchResults(_Output):
    results: list[JobBatchResult] = Field(description="One per item, in order.")


class JobView(JobRecord):
    next_slot_ms: int | None = Field(None, description="Next due slot; null if none or paused.")


class JobPage(_Output):
    items: list[JobRecord]
    next_cursor: str | None = None


class DeleteResult(_Output):
    id: str
    active_runs: list[str] = Field(description="Runs still active when the job was deleted.")
    cancelled: list[str] = Field(default_factory=list)


class BackfillResult(_Output):
    created: list[str]


class RunPage(_Output):
    items: list[RunRecord]
    next_cursor: str | None = None


class SkipPage(_Output):
    items: list[SkipRecord]
    next_cursor: str | None = None


class Explain(_Output):
    pending_reason: str | None = Field(None, description="Why it has not started (yet).")
    skips: list[SkipRecord] = Field(description="Skipped-slot records nearest its slot.")


class RunView(RunRecord):
    explain: Explain | None = None


class TokenView(_Output):
    id: str = Field(description="The SHA-256 of the secret: names the token, reveals nothing.")
    tenant: str
    role: Role
    name: str
    created_ms: int = 0
    expires_ms: int | None = None
    last_used_ms: int = Field(0, description="Updated at most once a minute; 0: never used.")


class TokenCreated(TokenView):
    token: str = Field(description="The secret; shown only this once.")


class TokenList(_Output):
    items: list[TokenView]


class TenantView(_Output):
    name: str
    limits: TenantLimits
    updated_ms: int = 0
    queue_depth: int = Field(0, description="The tenant's runs waiting for placement now.")


class OwnerView(OwnerRecord):
    partition: int


class ClusterView(_Output):
    partitions: int
    schedulers: list[SchedulerMember]
    workers: list[WorkerMember]
    owners: list[OwnerView]
    unowned: list[int]
    queue_depth: int
    queue_by_partition: dict[str, int] = Field(description="Non-empty partitions only.")


class Health(_Output):
    status: str
    detail: str = ""
