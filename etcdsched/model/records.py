"""Records stored in etcd. Each is JSON with a schema version ``v`` so
``etcdctl get --prefix /etcdsched/`` stays readable and old records can be
migrated. The store hands these back together with their revisions."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapSerializer,
    WrapValidator,
    computed_field,
)
from pydantic.json_schema import JsonSchemaValue, SkipJsonSchema
from pydantic_core import CoreSchema

from etcdsched.model.codec import STORED
from etcdsched.model.spec import Capacity, JobSpec, Resources
from etcdsched.model.states import RunState
from etcdsched.model.triggers import WATCH_SLOT, jitter_offset_ms


def _snapshot_json(
    spec: JobSpec, handler: SerializerFunctionWrapHandler, info: SerializationInfo
) -> Any:
    """In etcd, a spec snapshot leaves out every field at its default (but
    the trigger's and the execution's ``kind``, which tell the kinds
    apart): a run record shrinks from about 1.3 KB to 0.7 KB and parses
    three times faster, and each run is written and read several times.
    Elsewhere (API responses) the snapshot is whole."""
    if info.context is not STORED:
        return handler(spec)
    return _COMPACT_SNAPSHOTS.of(spec)


class _CompactSnapshots:
    """The compact stored form of each spec object in use, made once: a
    scheduler writes every run twice (fired, then placed) with the spec
    object of its job's due entry, and building this form was a tenth of
    encoding a run. Keyed by object identity (a spec is frozen; a changed
    spec is a new object), dropped when the spec is collected."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[JobSpec], dict[str, Any]]] = {}

    def of(self, spec: JobSpec) -> dict[str, Any]:
        held = self._by_id.get(id(spec))
        if held is not None and held[0]() is spec:
            return held[1]
        data = spec.model_dump(mode="json", exclude_defaults=True)
        data["trigger"] = {"kind": spec.trigger.kind, **data.get("trigger", {})}
        data["execution"] = {"kind": spec.execution.kind, **data.get("execution", {})}
        self.remember(spec, data)
        return data

    def remember(self, spec: JobSpec, data: dict[str, Any]) -> None:
        key = id(spec)
        self._by_id[key] = (weakref.ref(spec, lambda _: self._forget(key)), data)

    def _forget(self, key: int) -> None:
        held = self._by_id.get(key)
        if held is not None and held[0]() is None:
            del self._by_id[key]


_COMPACT_SNAPSHOTS = _CompactSnapshots()


@dataclass(frozen=True)
class _DocumentedWhole:
    """The schema of a snapshot is the whole spec's (what API responses
    show): the compact stored form is not part of the API."""

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler({k: v for k, v in schema.items() if k != "serialization"})


def _read_snapshot(
    value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> JobSpec:
    """A snapshot read from JSON: its stored form is remembered as the
    spec's, so writing the run back (a worker reads each run once and writes
    it once) does not build it again; written back as read, it reads back
    the same."""
    spec: JobSpec = handler(value)
    if info.mode == "json" and isinstance(value, dict):
        _COMPACT_SNAPSHOTS.remember(spec, value)
    return spec


SpecSnapshot = Annotated[
    JobSpec,
    WrapValidator(_read_snapshot),
    WrapSerializer(_snapshot_json),
    _DocumentedWhole(),
]
"""A job's spec copied into a run. Reading it back fills the defaults in
again, so a snapshot taken by an older version whose default later changed
takes the new default: a run lives for one slot and its retries; the job
record and its due entry, which live as long as the job, are stored whole."""


class Record(BaseModel):
    """Base of everything stored: ignores unknown fields from newer versions."""

    model_config = ConfigDict(extra="ignore")
    v: int = 1


class ClusterMeta(Record):
    """Set once at cluster initialisation; ``partitions`` never changes."""

    partitions: int = Field(ge=1, le=1000)
    created_ms: int
    layout: int = 1
    """How keys are laid out: 2 since job ids carry their tenant. Data of
    an earlier layout is refused with a clear error, never misread."""


class ActivePointer(Record):
    """Value of ``active/<pp>/<job>/<seq>``: enough for recovery to find runs
    of a vanished worker and hung runs without reading every run."""

    run_id: str
    worker: str | None = None
    attempt: int = 0
    deadline_ms: int | None = None


class QueueEntry(Record):
    """Value of ``queue/<pp>/<rank>/<not_before>/<run>``: the run, and the
    instant after which it is skipped instead of placed (its starting
    deadline; None for retries and runs without one). Carried here so a
    scheduler whose workers are full knows every queued run's deadline
    without reading the runs."""

    run_id: str
    deadline_ms: int | None = None


class JobRecord(Record):
    """A job as stored: its spec plus lifecycle state.

    ``version`` counts spec changes; runs snapshot the spec they were created
    from, so an update affects future slots only."""

    id: str
    spec: JobSpec
    state: Literal["active", "paused"] = "active"
    version: int = 1
    created_ms: int
    updated_ms: int
    anchor_ms: int = Field(description="Instant interval and 'now' triggers count from.")
    paused_ms: int | None = None
    idempotency_record: SkipJsonSchema[str | None] = None
    """The etcd key of the idempotency record its create wrote (``idem/...``),
    so deleting the job drops the record with it and a replay of the key then
    makes a new job. None: created without a key, or before records said.
    Storage only: the schema leaves it out, and API answers exclude it
    (:data:`STORAGE_ONLY`; a serializer that dropped it cost a tenth of the
    API's CPU in a batch create, building each record twice)."""


STORAGE_ONLY = {"idempotency_record"}
"""Fields of a :class:`JobRecord` that API answers leave out."""


class DueEntry(Record):
    """A job's next slot in the due index, carrying the spec snapshot the
    scheduler needs to fire it without reading the job.

    ``job_key_version`` is the etcd ``version`` of the job key the entry was
    computed from: firing compares it, so a slot computed from an outdated
    spec is never fired."""

    job_id: str
    slot_ms: int
    job_key_version: int
    job_version: int
    anchor_ms: int
    spec: JobSpec
    fired: int = Field(0, description="Slots of this job fired so far (for max_runs).")
    last_slot_ms: int | None = Field(None, description="The slot fired just before this one.")
    armed_by: str = Field(
        "",
        description="An 'after' job's entry moved to now: the upstream runs that ended as"
        " asked (becomes the run's fired note).",
    )

    @property
    def due_ms(self) -> int | None:
        """The instant this entry is due, or None for an ``after`` job waiting
        at the watch slot (it has no instant: its upstream runs decide)."""
        return None if self.slot_ms == WATCH_SLOT else self.slot_ms

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fire_order(self) -> tuple[int, int]:
        """(earliest start ms, priority): what a partition orders a backlog
        by, the slot plus the job's jitter offset, then priority. Stored as
        the entry's last field, so the firer reads it from the end of the
        stored bytes without decoding the entry and its spec
        (``etcdsched.scheduler.fire_order``): a million at midnight took
        twenty seconds of the scheduler's one core to decode."""
        window_ms = int(self.spec.jitter.total_seconds() * 1000)
        start_ms = self.slot_ms + jitter_offset_ms(self.job_id, self.slot_ms, window_ms)
        return start_ms, self.spec.priority


class Attempt(Record):
    """One execution attempt of a run, with its own timing and outcome."""

    number: int
    worker: str
    state: RunState = RunState.ASSIGNED
    assigned_ms: int
    started_ms: int | None = None
    ended_ms: int | None = None
    exit_code: int | None = None
    pid: int | None = None
    reason: str = ""


class RunRecord(Record):
    """A run: one slot of one job (or one manual trigger)."""

    id: str
    job_id: str
    tenant: str
    partition: int
    slot_ms: int
    not_before_ms: int
    kind: Literal["scheduled", "manual", "backfill"] = "scheduled"
    state: RunState = RunState.PENDING
    attempt: int = 0
    attempts: list[Attempt] = Field(default_factory=list)
    spec: SpecSnapshot
    job_version: int
    created_ms: int
    updated_ms: int
    retry_at_ms: int | None = None
    cancel_requested: bool = False
    reason: str = Field("", description="Why it is pending, skipped or ended as it did.")
    coalesced: int = Field(0, description="Missed slots folded into this run (run_once).")
    fired_note: str = Field(
        "",
        description="Why the scheduler created the run as it did (e.g. a misfire catch-up);"
        " set once at creation, never overwritten, unlike reason.",
    )
    worker: str | None = None
    queue_key: str | None = Field(None, description="Its placement queue key while queued.")
    created_by: str = Field("", description="The scheduler (or API) that created the run.")

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


SkipReason = Literal[
    "paused", "misfire", "overlap", "starting_deadline", "deleted", "dependency", "max_runs"
]
"""Why slots did not run: a skip record's reason, and the ``reason`` label
of ``etcdsched_skipped_slots_total``."""


class SkipRecord(Record):
    """A range of slots that were deliberately not run, and why. One record
    covers many slots, so a long pause costs one key, not thousands."""

    job_id: str
    first_slot_ms: int
    last_slot_ms: int
    count: int
    reason: SkipReason
    detail: str = ""
    created_ms: int


class WorkerMember(Record):
    """A live worker's advertisement (bound to its lease)."""

    id: str
    capacity: Capacity
    labels: dict[str, str] = Field(default_factory=dict)
    tenants: list[str] = Field(default_factory=lambda: ["*"])
    """The tenants whose runs it takes (``*``: every tenant)."""
    host: str = ""
    pid: int = 0
    started_ms: int
    draining: bool = False
    reserved: bool = False
    """Reserved for its labels: it takes only runs whose (non-empty)
    selector its labels match, never a run without a selector
    (``etcdsched.model.placement``)."""


class SchedulerMember(Record):
    """A live scheduler (bound to its lease)."""

    id: str
    host: str = ""
    pid: int = 0
    started_ms: int


class OwnerRecord(Record):
    """Who owns a partition. The key's create_revision is the fencing token."""

    scheduler: str
    since_ms: int


class ClaimHint(Record):
    """What a worker needs to claim an attempt without reading its run first
    (ADR 0017): the claim key's partition, and the hang budget that goes
    into the active pointer's deadline."""

    partition: int
    hang_budget_ms: int | None
    """The run's timeout plus its kill grace; ``None`` for a run without a
    timeout (it is never declared hung)."""


HUNG_SLACK_MS = 5000
"""How long after its timeout and kill grace a running attempt is declared
hung by recovery: the worker's own timeout (and, with its loop stalled, its
watchdog) ends the job first."""


def hang_budget_ms(spec: JobSpec) -> int | None:
    """Timeout plus kill grace in ms, or ``None`` without a timeout."""
    if spec.timeout is None:
        return None
    return int((spec.timeout + spec.kill_grace).total_seconds() * 1000)


class Assignment(Record):
    """A run placed on a worker; the worker watches only its own assignments."""

    run_id: str
    attempt: int
    not_before_ms: int
    resources: Resources
    cancel: bool = False
    priority: int = 100
    """The run's priority: a worker with more runs due than it can start at
    once claims and starts higher priorities first."""
    claim_hint: ClaimHint | None = None
    """Set by every writer since ADR 0017; an assignment written before
    has none, and its worker reads the run before claiming."""


class Claim(Record):
    """A worker's claim on an executing attempt; bound to the worker's lease,
    so it disappears when the worker does."""

    run_id: str
    worker: str
    attempt: int
    lease: int
