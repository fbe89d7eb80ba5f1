"""Every etcd key etcdsched reads or writes is built and parsed here.

Layout (under a configurable prefix, default ``/etcdsched/``)::

    meta/cluster                              cluster settings (partition count)
    meta/admin-bootstrap                      the first admin token was made
    jobs/<tenant>:<job>                       job spec + state (a job id is <tenant>:<name>)
    due/<pp>/<slot_ms:14>/<job>               a job's next slot, per partition
    nextdue/<job>                             copy of the job's due entry (finds it)
    runs/<job>/<seq>                          run record; seq = slot_ms:14 [-tag]
    active/<pp>/<job>/<seq>                   pointer to a non-terminal run
    queue/<pp>/<rank:3>/<not_before_ms:14>/<run>  runs waiting for placement
    owners/<pp>                               partition owner (leased)
    members/schedulers/<id>, members/workers/<id>   live members (leased)
    assign/<worker>/<run>                     a run placed on a worker (its
                                              resources: the worker's used capacity)
    assign-epoch/<worker>                     touched by every placement on the
                                              worker (leased with its member key)
    claims/<pp>/<run>                         a worker's claim on a run (leased)
    skips/<job>/<first_slot_ms:14>            explained skipped slot ranges
    tokens/<sha256>, tenants/<tenant>, idem/<tenant>/<sha256>   API state
    webhooks/<tenant>/<name>                  a tenant's webhook (URL, events, secret)
    outbox/<pp>/<run>/<event id>              a delivery still to send (docs/webhooks.md)
    deliveries/<job>/<seq>/<event id>         a delivery sent or given up

Numbers are zero-padded to fixed width so lexical key order is numeric order.
Run ids are ``<job>@<seq>``; job ids cannot contain ``@`` or ``/``.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

SLOT_WIDTH = 14
PARTITION_WIDTH = 3
MAX_PARTITIONS = 10**PARTITION_WIDTH
MAX_RANK = 999
JOB_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
"""What a user names a job; unique within its tenant."""
JOB_ID_PATTERN = re.compile(r"^(?:[a-z0-9][a-z0-9_-]{0,62}:)?[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
"""A job's id: ``<tenant>:<name>``, so every key of a job (its record, due
entry, runs, skips, active pointers) carries its tenant and two tenants'
jobs of one name never meet. (Ids without a tenant are accepted by the key
functions, which tests of the layout use; every job the service creates has one.)"""
TENANT_SEP = ":"
WORKER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
RUN_SEQ_PATTERN = re.compile(r"^(\d{14})(?:-([a-z0-9]{1,24}))?$")


class KeyError_(ValueError):
    """A key or key component that does not fit the layout."""


def partition_of(job_id: str, partitions: int) -> int:
    """Stable partition of a job: blake2b of the id, mod the partition count.

    Stable across processes and Python versions (unlike ``hash()``)."""
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def validate_job_id(job_id: str) -> str:
    if not JOB_ID_PATTERN.fullmatch(job_id):
        raise KeyError_(
            "a job name must be 1-128 characters of letters, digits, '_', '.', '-' and start"
            " with a letter or digit (a full id is <tenant>:<name>)"
        )
    return job_id


def full_job_id(tenant: str, name_or_id: str) -> str:
    """``name`` of ``tenant`` as a full id; a full id must name ``tenant``."""
    validate_job_id(name_or_id)
    owner, sep, name = name_or_id.rpartition(TENANT_SEP)
    if sep and owner != tenant:
        raise KeyError_(f"job {name_or_id} is not of tenant {tenant}")
    return f"{tenant}{TENANT_SEP}{name}"


def tenant_of_job(job_id: str) -> str | None:
    """The tenant a full job id names (None for an id without one)."""
    tenant, sep, _ = job_id.rpartition(TENANT_SEP)
    return tenant if sep else None


def run_seq(slot_ms: int, tag: str | None = None) -> str:
    """Sequence part of a run id: the slot, plus a tag for manual runs."""
    if slot_ms < 0 or slot_ms >= 10**SLOT_WIDTH:
        raise KeyError_(f"slot out of range: {slot_ms}")
    seq = f"{slot_ms:0{SLOT_WIDTH}d}"
    return f"{seq}-{tag}" if tag else seq


def run_id(job_id: str, seq: str) -> str:
    return f"{job_id}@{seq}"


@dataclass(frozen=True)
class RunRef:
    """A parsed run id."""

    job_id: str
    seq: str

    @property
    def slot_ms(self) -> int:
        return int(self.seq[:SLOT_WIDTH])

    @property
    def run_id(self) -> str:
        return run_id(self.job_id, self.seq)


@functools.lru_cache(maxsize=1 << 16)
def parse_run_id(value: str) -> RunRef:
    """Cached: every key of a run is built from its id, and checks it."""
    job_id, sep, seq = value.rpartition("@")
    if not sep or not JOB_ID_PATTERN.fullmatch(job_id) or not RUN_SEQ_PATTERN.fullmatch(seq):
        raise KeyError_(f"not a run id: {value!r}")
    return RunRef(job_id, seq)


@dataclass(frozen=True)
class DueKey:
    partition: int
    slot_ms: int
    job_id: str


@dataclass(frozen=True)
class QueueKey:
    partition: int
    rank: int
    not_before_ms: int
    run_id: str


class Keys:
    """Builds and parses keys under one prefix. Each test gets its own prefix."""

    def __init__(self, prefix: str = "/etcdsched/") -> None:
        if not prefix.startswith("/") or not prefix.endswith("/"):
            raise KeyError_("prefix must start and end with '/'")
        self.prefix = prefix

    # -- cluster ---------------------------------------------------------
    def cluster_meta(self) -> str:
        return f"{self.prefix}meta/cluster"

    def admin_bootstrap(self) -> str:
        """Written with the first admin token: there is only ever one first."""
        return f"{self.prefix}meta/admin-bootstrap"

    # -- jobs ------------------------------------------------------------
    def jobs_prefix(self) -> str:
        return f"{self.prefix}jobs/"

    def job(self, job_id: str) -> str:
        return f"{self.jobs_prefix()}{job_id}"

    def parse_job(self, key: str) -> str:
        return self._strip(key, self.jobs_prefix())

    def tenant_jobs_prefix(self, tenant: str) -> str:
        """The jobs of one tenant: listing them reads no other tenant's key."""
        return f"{self.jobs_prefix()}{tenant}{TENANT_SEP}"

    # -- due index -------------------------------------------------------
    def due_prefix(self, partition: int) -> str:
        return f"{self.prefix}due/{self._pp(partition)}/"

    def due(self, partition: int, slot_ms: int, job_id: str) -> str:
        return f"{self.due_prefix(partition)}{slot_ms:0{SLOT_WIDTH}d}/{job_id}"

    def due_until(self, partition: int, until_ms: int) -> str:
        """Exclusive range end: every due key of the partition with slot <= until_ms."""
        return f"{self.due_prefix(partition)}{until_ms + 1:0{SLOT_WIDTH}d}"

    def parse_due(self, key: str) -> DueKey:
        rest = self._strip(key, f"{self.prefix}due/")
        pp, slot, job_id = self._split(rest, 3)
        return DueKey(int(pp), int(slot), job_id)

    def due_pointer(self, job_id: str) -> str:
        """Where a job's current due entry is: lifecycle operations find the
        due key through this instead of scanning the index."""
        return f"{self.prefix}nextdue/{job_id}"

    # -- runs ------------------------------------------------------------
    def runs_prefix(self, job_id: str | None = None) -> str:
        base = f"{self.prefix}runs/"
        return f"{base}{job_id}/" if job_id is not None else base

    def run(self, rid: str) -> str:
        ref = parse_run_id(rid)
        return f"{self.runs_prefix(ref.job_id)}{ref.seq}"

    def parse_run(self, key: str) -> RunRef:
        job_id, seq = self._split(self._strip(key, self.runs_prefix()), 2)
        return parse_run_id(run_id(job_id, seq))

    # -- active pointers -------------------------------------------------
    def active_prefix(self, partition: int, job_id: str | None = None) -> str:
        base = f"{self.prefix}active/{self._pp(partition)}/"
        return f"{base}{job_id}/" if job_id is not None else base

    def active(self, partition: int, rid: str) -> str:
        ref = parse_run_id(rid)
        return f"{self.active_prefix(partition, ref.job_id)}{ref.seq}"

    def parse_active(self, key: str) -> tuple[int, RunRef]:
        pp, job_id, seq = self._split(self._strip(key, f"{self.prefix}active/"), 3)
        return int(pp), parse_run_id(run_id(job_id, seq))

    # -- placement queue -------------------------------------------------
    def queue_root(self) -> str:
        """Every partition's queue."""
        return f"{self.prefix}queue/"

    def queue_prefix(self, partition: int) -> str:
        return f"{self.queue_root()}{self._pp(partition)}/"

    def queue(self, partition: int, priority: int, not_before_ms: int, rid: str) -> str:
        """Queue order is priority (high first), then not-before time, then run id."""
        rank = MAX_RANK - priority
        return f"{self.queue_prefix(partition)}{rank:03d}/{not_before_ms:0{SLOT_WIDTH}d}/{rid}"

    def parse_queue(self, key: str) -> QueueKey:
        pp, rank, nb, rid = self._split(self._strip(key, f"{self.prefix}queue/"), 4)
        parse_run_id(rid)
        return QueueKey(int(pp), int(rank), int(nb), rid)

    # -- ownership and membership ---------------------------------------
    def owners_prefix(self) -> str:
        return f"{self.prefix}owners/"

    def owner(self, partition: int) -> str:
        return f"{self.owners_prefix()}{self._pp(partition)}"

    def parse_owner(self, key: str) -> int:
        return int(self._strip(key, self.owners_prefix()))

    def members_prefix(self, role: str) -> str:
        if role not in ("schedulers", "workers"):
            raise KeyError_(f"unknown member role {role!r}")
        return f"{self.prefix}members/{role}/"

    def member(self, role: str, member_id: str) -> str:
        return f"{self.members_prefix(role)}{member_id}"

    def parse_member(self, role: str, key: str) -> str:
        return self._strip(key, self.members_prefix(role))

    # -- assignments, claims --------------------------------------
    def assign_prefix(self, worker_id: str | None = None) -> str:
        base = f"{self.prefix}assign/"
        return f"{base}{worker_id}/" if worker_id is not None else base

    def assign(self, worker_id: str, rid: str) -> str:
        return f"{self.assign_prefix(worker_id)}{rid}"

    def assign_epoch(self, worker_id: str) -> str:
        """Touched by every placement on ``worker_id``; leased like its member key.

        Placement compares its mod revision instead of ranging over the
        worker's assignments (ADR 0013).
        """
        return f"{self.prefix}assign-epoch/{worker_id}"

    def parse_assign(self, key: str) -> tuple[str, str]:
        worker_id, rid = self._split(self._strip(key, self.assign_prefix()), 2)
        parse_run_id(rid)
        return worker_id, rid

    def claims_prefix(self, partition: int | None = None) -> str:
        base = f"{self.prefix}claims/"
        return f"{base}{self._pp(partition)}/" if partition is not None else base

    def claim(self, partition: int, rid: str) -> str:
        return f"{self.claims_prefix(partition)}{rid}"

    def parse_claim(self, key: str) -> tuple[int, str]:
        pp, rid = self._split(self._strip(key, self.claims_prefix()), 2)
        parse_run_id(rid)
        return int(pp), rid

    # -- deleted jobs whose history is still to go ------------------------
    def gone_prefix(self, partition: int) -> str:
        return f"{self.prefix}gone/{self._pp(partition)}/"

    def gone(self, partition: int, job_id: str) -> str:
        """Written by a job's delete; the partition's retention removes the
        job's runs, logs and archive, then this key."""
        return f"{self.gone_prefix(partition)}{job_id}"

    def parse_gone(self, key: str) -> str:
        return self._split(self._strip(key, f"{self.prefix}gone/"), 2)[1]

    # -- ledger of skipped slots ----------------------------------------
    def skips_prefix(self, job_id: str) -> str:
        return f"{self.prefix}skips/{job_id}/"

    def skip(self, job_id: str, first_slot_ms: int) -> str:
        return f"{self.skips_prefix(job_id)}{first_slot_ms:0{SLOT_WIDTH}d}"

    def parse_skip(self, key: str) -> tuple[str, int]:
        job_id, first = self._split(self._strip(key, f"{self.prefix}skips/"), 2)
        return job_id, int(first)

    # -- API state -------------------------------------------------------
    def token(self, token_hash: str) -> str:
        return f"{self.prefix}tokens/{token_hash}"

    def tokens_prefix(self) -> str:
        return f"{self.prefix}tokens/"

    def tenant(self, tenant: str) -> str:
        return f"{self.prefix}tenants/{tenant}"

    def idempotency(self, tenant: str, key_hash: str) -> str:
        return f"{self.prefix}idem/{tenant}/{key_hash}"

    # -- webhooks and their deliveries (docs/webhooks.md) ------------------
    def webhooks_prefix(self, tenant: str | None = None) -> str:
        base = f"{self.prefix}webhooks/"
        return f"{base}{tenant}/" if tenant is not None else base

    def webhook(self, tenant: str, name: str) -> str:
        return f"{self.webhooks_prefix(tenant)}{name}"

    def parse_webhook(self, key: str) -> tuple[str, str]:
        tenant, name = self._split(self._strip(key, self.webhooks_prefix()), 2)
        return tenant, name

    def outbox_prefix(self, partition: int, subject: str | None = None) -> str:
        """A partition's pending deliveries; with ``subject`` (a run id), one run's."""
        base = f"{self.prefix}outbox/{self._pp(partition)}/"
        return f"{base}{subject}/" if subject is not None else base

    def outbox(self, partition: int, subject: str, event_id: str) -> str:
        parse_run_id(subject)
        return f"{self.outbox_prefix(partition, subject)}{event_id}"

    def parse_outbox(self, key: str) -> tuple[int, str, str]:
        pp, subject, event_id = self._split(self._strip(key, f"{self.prefix}outbox/"), 3)
        parse_run_id(subject)
        return int(pp), subject, event_id

    def deliveries_prefix(self, subject: str) -> str:
        """The ended deliveries of one run (or skipped slot): deleted with the run."""
        ref = parse_run_id(subject)
        return f"{self.prefix}deliveries/{ref.job_id}/{ref.seq}/"

    def delivery(self, subject: str, event_id: str) -> str:
        return f"{self.deliveries_prefix(subject)}{event_id}"

    def job_deliveries_prefix(self, job_id: str) -> str:
        return f"{self.prefix}deliveries/{job_id}/"

    # -- helpers ---------------------------------------------------------
    @staticmethod
    def _pp(partition: int) -> str:
        if not 0 <= partition < MAX_PARTITIONS:
            raise KeyError_(f"partition out of range: {partition}")
        return f"{partition:0{PARTITION_WIDTH}d}"

    @staticmethod
    def _strip(key: str, prefix: str) -> str:
        if not key.startswith(prefix):
            raise KeyError_(f"{key!r} is not under {prefix!r}")
        return key[len(prefix) :]

    @staticmethod
    def _split(rest: str, parts: int) -> list[str]:
        pieces = rest.split("/", parts - 1)
        if len(pieces) != parts or not all(pieces):
            raise KeyError_(f"malformed key part {rest!r}")
        return pieces
