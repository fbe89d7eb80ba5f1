"""One typed config per process: ``ETCDSCHED_*`` environment variables,
overridden by CLI flags. Services receive this object; there are no globals."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from etcdsched.store.etcd import EtcdOptions

BACKLOG_LIMIT = 1000
"""Fired runs placement has not looked at, across the scheduler's
partitions, at which firing waits. Below saturation placement looks at each
fired run within one gathering wait (50 ms, about 80 runs at the ceiling),
so the brake never engages; 1,000 keeps placement fed across a firing
round trip while bounding the pile."""


def default_member_id() -> str:
    """Unique per process start: a restarted agent is a new member, so stale
    assignments of its previous incarnation can never be mistaken for its own."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Config(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ETCDSCHED_", extra="ignore")

    etcd: str = Field("127.0.0.1:2379", description="Comma-separated etcd endpoints.")
    etcd_timeout: float = 5.0
    etcd_ca_cert: Path | None = None
    etcd_cert: Path | None = None
    etcd_key: Path | None = None
    etcd_user: str | None = None
    etcd_password: str | None = Field(
        None,
        description="Prefer etcd_password_file: a process's environment can be read by"
        " other processes of its user.",
    )
    etcd_password_file: Path | None = Field(
        None, description="File holding the etcd password (first line); wins over etcd_password."
    )
    prefix: str = "/etcdsched/"
    partitions: int = Field(64, ge=1, le=1000, description="Used only at cluster init.")

    member_id: str = Field(default_factory=default_member_id)
    lease_ttl: int = Field(5, ge=2, le=300, description="Seconds; sessions of every role.")

    # scheduler
    lookahead_ms: int = Field(2000, ge=0, description="Fire slots this early (not-before).")
    horizon_ms: int = Field(60_000, ge=1000, description="Due entries kept in memory.")
    fire_batch: int = Field(64, ge=1, le=128)
    fire_backlog: int = Field(
        BACKLOG_LIMIT, ge=1, description="Fired runs unread by placement at which firing waits."
    )
    fire_onto_workers: bool = Field(
        True,
        description="Create a fired run already assigned to a worker with room, skipping the"
        " queue, when nothing waits for placement (ADR 0016).",
    )
    reconcile_every: float = Field(5.0, gt=0)
    adaptive_staging: bool = Field(
        True,
        description="Stage a coming herd early enough, at the measured rate, that it is staged"
        " by its instant (lookahead is then a minimum; etcdsched.scheduler.staging).",
    )
    max_staged_runs: int = Field(
        250_000,
        ge=0,
        description="Runs adaptive staging stages ahead at most: about 4 KB each in etcd with"
        " their history, so half of etcd's default 2 GiB quota.",
    )

    # worker
    worker_slots: int = Field(4, ge=0, le=1_000_000)
    worker_start_window: int = Field(
        256,
        ge=1,
        le=100_000,
        description="Attempts a worker takes from claim to start at once; the rest of a herd"
        " waits unclaimed, in due and priority order (etcdsched.worker.admission).",
    )
    worker_cpu: float = Field(0.0, ge=0)
    worker_memory_mb: int = Field(0, ge=0)
    worker_gpu: int = Field(0, ge=0)
    worker_labels: dict[str, str] = Field(default_factory=dict)
    worker_reserved: bool = Field(
        False,
        description="Reserve this worker for its labels: it takes only runs whose selector"
        " its labels match, never a run without a selector.",
    )
    worker_tenants: list[str] | None = Field(
        None,
        description='Tenants whose runs this worker takes (JSON list; ["*"]: all). Required'
        " for a worker started with `agent`; `up` serves all.",
    )
    executor: str = Field("process", description="'process', or 'noop' for benchmarks.")
    shutdown_grace: float = Field(30.0, ge=0)
    log_dir: Path = Path(".etcdsched/logs")
    worker_run_as: dict[str, str] = Field(
        default_factory=dict,
        description="Tenant -> user its jobs run as when the worker is root ('*': every"
        " other tenant; default nobody). A user is a name or a numeric uid.",
    )
    job_env_allow: list[str] = Field(
        default_factory=lambda: ["LANG", "LC_ALL", "TZ"],
        description="Variables of the worker's environment that jobs get; nothing else is"
        " inherited.",
    )
    job_path: str = Field(
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        description="PATH of a job that sets none in its env.",
    )
    scratch_dir: Path | None = Field(
        None,
        description="Per-attempt working directories of jobs without a cwd (default: under"
        " the system's temporary directory, which every job's user can reach).",
    )

    # etcdsched up
    embedded_client_port: int = Field(2379, description="Embedded etcd client port (up).")
    embedded_peer_port: int = Field(2380, description="Embedded etcd peer port (up).")

    # api
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_tls_cert: Path | None = Field(None, description="PEM certificate (chain) of the API.")
    api_tls_key: Path | None = Field(None, description="PEM private key of the API.")
    api_allow_plaintext: bool = Field(
        False,
        description="Serve plain HTTP on an address beyond loopback (only behind a TLS proxy).",
    )
    max_body_bytes: int = 1_048_576
    max_follows_per_tenant: int = Field(
        32, ge=1, description="Log follow streams one tenant may hold open per API process."
    )

    @model_validator(mode="after")
    def _horizon_covers_lookahead(self) -> Config:
        """The firer holds due entries up to the horizon in memory; a
        lookahead past it would silently fire no earlier than the horizon."""
        if self.horizon_ms <= self.lookahead_ms:
            raise ValueError(
                f"horizon_ms ({self.horizon_ms}) must be greater than lookahead_ms"
                f" ({self.lookahead_ms})"
            )
        return self

    def etcd_options(self) -> EtcdOptions:
        return EtcdOptions(
            endpoints=tuple(e.strip() for e in self.etcd.split(",") if e.strip()),
            timeout=self.etcd_timeout,
            ca_cert=self.etcd_ca_cert,
            cert=self.etcd_cert,
            key=self.etcd_key,
            username=self.etcd_user,
            password=self.etcd_secret(),
        )

    def etcd_secret(self) -> str | None:
        """The etcd password: from its file when one is set (read at each
        connect, so a rotated file is picked up), else the setting."""
        if self.etcd_password_file is not None:
            lines = self.etcd_password_file.read_text().splitlines()
            return lines[0].strip() if lines else ""
        return self.etcd_password
