"""Request and response bodies and query strings of the HTTP API.

Requests forbid unknown fields (a typo is a 422 naming it, never silently
ignored); responses reuse the stored records and ignore unknown fields, so
an older client keeps working against a newer server.

Instants in queries and request bodies are RFC 3339 strings with an offset;
stored records keep epoch milliseconds (fields ending in ``_ms``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
    model_validator,
)

from etcdsched.api.auth import JsonInt, Role, TenantLimits
from etcdsched.model.records import (
    STORAGE_ONLY,
    JobRecord,
    OwnerRecord,
    RunRecord,
    SchedulerMember,
    SkipRecord,
    WorkerMember,
)
from etcdsched.model.spec import LABEL_KEY, TENANT_PATTERN, JobSpec, PosDuration
from etcdsched.model.states import RunState
from etcdsched.model.triggers import LAST_INSTANT, Instant
from etcdsched.store.job_create import MAX_IDEMPOTENCY_KEY
from etcdsched.store.keys import JOB_ID_PATTERN

FIRST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
MAX_PAGE = 1000
MAX_BATCH = 1000
"""Items in one ``POST /v1/jobs:batch``."""

# Patterns as JSON Schema (ECMA 262) and pydantic (Rust regex) read them
# alike: ``[0-9]``, not ``\d`` (a Unicode digit in both), and ``$`` only at
# the very end (Python's ``re`` would also let a trailing newline through).
JOB_ID = JOB_ID_PATTERN.pattern
"""A job name, or a full id ``<tenant>:<name>``."""
RUN_SEQ = r"[0-9]{14}(?:-[a-z0-9]{1,24})?"
RUN_ID = JOB_ID.removesuffix("$") + "@" + RUN_SEQ + "$"
JOB_CURSOR = r"^[A-Za-z0-9_-]{1,1024}$"
"""A job listing's cursor: base64url without padding."""
RUN_CURSOR = "^" + RUN_SEQ + "$"
SKIP_CURSOR = r"^[0-9]{1,14}$"
LABEL_FILTER = "^" + LABEL_KEY.pattern.strip("^$") + r"=[\s\S]{0,256}$"
TOKEN_ID = r"^[0-9a-f]{64}$"
JOB_ID_FIELD = Field(
    None,
    pattern=JOB_ID,
    description="Job name: 1-128 of letters, digits, '_', '.', '-' (or the full id"
    " '<tenant>:<name>' of the spec's tenant).",
)


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

    id: str | None = JOB_ID_FIELD
    spec: JobSpec


class JobBatchItem(_Input):
    """One job of ``POST /v1/jobs:batch``: a create body plus its own
    idempotency key (the ``Idempotency-Key`` header of a single create)."""

    id: str | None = JOB_ID_FIELD
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
    force: StrictBool = Field(False, description="Run even if the overlap policy is 'skip'.")


class BackfillBody(_Input):
    start: Instant
    end: Instant
    limit: JsonInt = Field(1000, ge=1, le=MAX_PAGE, description="Refuse ranges with more slots.")


class CancelBody(_Input):
    reason: str = Field("", max_length=512)


class TokenBody(_Input):
    tenant: str | None = Field(
        None, pattern=TENANT_PATTERN, description="Default: the caller's own tenant."
    )
    role: Role = "editor"
    name: str = Field(min_length=1, max_length=128, description="Who or what holds it.")
    expires_in: PosDuration | None = Field(None, description="e.g. 30d; default: never.")


class TenantLimitsBody(TenantLimits):
    """``PUT /v1/tenants/{tenant}``: the whole set of limits, a limit left
    out unlimited. At least one must be named: an empty body (or ``{}``),
    most likely a client that lost its payload, must not lift every limit
    of a tenant; clearing them all is saying so (``{"max_jobs": null}``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    @model_validator(mode="after")
    def _names_one(self) -> TenantLimitsBody:
        if not self.model_fields_set:
            names = ", ".join(TenantLimits.model_fields)
            raise ValueError(f"name at least one limit ({names}); null lifts one")
        return self

    def limits(self) -> TenantLimits:
        return TenantLimits.model_validate(self.model_dump(exclude_unset=True))


# -- query strings ---------------------------------------------------------
class PageQuery(_Input):
    """A page of a job's skipped-slot records (and the base of the other pages)."""

    cursor: str | None = Field(
        None, pattern=SKIP_CURSOR, description="next_cursor of the previous page."
    )
    limit: int = Field(100, ge=1, le=MAX_PAGE)


class JobListQuery(PageQuery):
    cursor: str | None = Field(
        None, pattern=JOB_CURSOR, description="next_cursor of the previous page."
    )
    tenant: str | None = Field(None, pattern=TENANT_PATTERN, description="Admin tokens only.")
    state: Literal["active", "paused"] | None = None
    label: list[Annotated[str, Field(pattern=LABEL_FILTER)]] = Field(
        default_factory=list, description="k=v; repeat to AND them."
    )

    def label_pairs(self) -> dict[str, str]:
        return dict(label.split("=", 1) for label in self.label)


class RunListQuery(PageQuery):
    cursor: str | None = Field(
        None, pattern=RUN_CURSOR, description="next_cursor of the previous page."
    )
    state: list[RunState] = Field(default_factory=list, description="Repeat to OR them.")
    since: AwareDatetime | None = Field(None, description="Slots at or after this instant.")
    until: AwareDatetime | None = Field(None, description="Slots at or before this instant.")
    order: Literal["asc", "desc"] = "desc"

    @field_validator("since", "until")
    @classmethod
    def _within_slots(cls, value: datetime | None) -> datetime | None:
        """A bound beyond the instants a slot can name is moved to the
        nearest one: it filters the same slots, and keys stay 14 digits."""
        if value is None:
            return None
        try:
            in_utc = value.astimezone(UTC)
        except OverflowError:  # 9999-12-31T23:59:59-14:00 is past year 9999 in UTC
            return LAST_INSTANT
        return min(max(in_utc, FIRST_INSTANT), LAST_INSTANT)


class VersionQuery(_Input):
    version: int | None = Field(
        None, ge=1, description="Refuse unless the job is at it (If-Match wins)."
    )
    force: bool = Field(
        False, description="Replace whatever the version, without If-Match or version."
    )


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

    API_EXCLUDE: ClassVar[dict[str, Any]] = {"results": {"__all__": {"job": STORAGE_ONLY}}}


class JobView(JobRecord):
    next_slot_ms: int | None = Field(None, description="Next due slot; null if none or paused.")


class JobPage(_Output):
    items: list[JobRecord]
    next_cursor: str | None = None

    API_EXCLUDE: ClassVar[dict[str, Any]] = {"items": {"__all__": STORAGE_ONLY}}


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
