"""One typed config per process. Each setting comes from the first of: a CLI
flag, its ``ETCDSCHED_*`` environment variable, the YAML config file named by
``--config``/``ETCDSCHED_CONFIG``, its default. Services receive this object;
there are no globals."""

from __future__ import annotations

import difflib
import os
import socket
import uuid
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

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


class ConfigFileError(ValueError):
    """A config file that cannot be used: missing, unreadable, not YAML, not a
    mapping, or naming a setting that does not exist."""


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings of a YAML config file (``setting: value``), refused whole
    on any unknown key: a misspelt key silently ignored would leave the
    default in force, the very surprise a config file is written to avoid."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigFileError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())  # one line: the position is in it
        raise ConfigFileError(f"config file {path} is not valid YAML: {reason}") from exc
    if data is None:
        return {}  # an empty file, or only comments: nothing set
    if not isinstance(data, dict):
        raise ConfigFileError(f"config file {path} must be a mapping of setting: value")
    for key in data:
        _check_key(key, path)
    return {str(key): value for key, value in data.items()}


def _check_key(key: object, path: Path) -> None:
    """Names the file and the key, and the setting probably meant."""
    if key == "config":
        raise ConfigFileError(f"config file {path}: 'config' cannot be set inside a config file")
    names = [name for name in Config.model_fields if name != "config"]
    if key in names:
        return
    close = difflib.get_close_matches(str(key).lower(), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigFileError(f"unknown setting {key!r} in config file {path}{hint}")


class ConfigFileSource(PydanticBaseSettingsSource):
    """Settings from the YAML file named by the ``config`` setting. Which file
    is itself a setting (``--config`` over ``ETCDSCHED_CONFIG``), so this
    source is ranked after the flags and the environment and reads the name
    from what they gave (``current_state``); everything it gives, in turn,
    loses to them and wins over the defaults."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: ``__call__`` reads the whole file at once (abstract in the base)."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = self.current_state.get("config")
        return read_config_file(Path(path)) if path else {}


class Config(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ETCDSCHED_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init keywords) > environment > config file > defaults: one rule
        for every setting. No .env or secrets directory is read: a second file
        format would be a second place to look."""
        return init_settings, env_settings, ConfigFileSource(settings_cls)

    config: Path | None = Field(
        None,
        description="YAML file of settings (keys: these names), below flags and the"
        " environment; --config or ETCDSCHED_CONFIG.",
    )

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
    retention_log_delete_grace_ms: int = Field(
        120_000,
        ge=0,
        description="A trimmed run's logs are deleted no sooner than this after it ended"
        " (its writer may still be uploading; etcdsched.scheduler.retention).",
    )
    log_dir: Path = Path(".etcdsched/logs")
    log_store: str = Field(
        "",
        description="Where run logs live: empty (LOG_DIR), a directory, file:///path, or"
        " s3://bucket/prefix (docs/operations.md, 'Log store').",
    )
    log_s3_endpoint_url: str | None = Field(
        None, description="S3 endpoint (e.g. http://127.0.0.1:8333); default: AWS's."
    )
    log_s3_region: str | None = None
    log_s3_access_key_file: Path | None = Field(
        None, description="File holding the S3 access key id (default: AWS_* variables)."
    )
    log_s3_secret_key_file: Path | None = Field(
        None, description="File holding the S3 secret key (with the access key file)."
    )
    log_s3_addressing_style: Literal["auto", "path", "virtual"] = "auto"
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
    metrics_host: str = Field(
        "127.0.0.1", description="Address of the /metrics listener (with METRICS_PORT)."
    )
    metrics_port: int | None = Field(
        None,
        description="Serve /metrics (plain HTTP, nothing else) on this port: for agents without"
        " the api role, so Prometheus can scrape schedulers and workers too.",
    )
    max_follows_per_tenant: int = Field(
        32, ge=1, description="Log follow streams one tenant may hold open per API process."
    )

    # webhooks (docs/webhooks.md)
    webhook_timeout_ms: int = Field(
        10_000, ge=100, description="Total time one webhook POST may take."
    )
    webhook_retry_initial_ms: int = Field(
        1000, ge=1, description="Wait after a webhook's first failed attempt (doubles after each)."
    )
    webhook_retry_max_delay_ms: int = Field(
        300_000, ge=1, description="Longest wait between two attempts of one delivery."
    )
    webhook_max_retry_ms: int = Field(
        86_400_000,
        ge=0,
        description="A delivery still failing this long after its event is given up (failed).",
    )
    webhook_concurrency: int = Field(
        8, ge=1, le=256, description="Webhook POSTs in flight at once per owned partition."
    )
    webhook_link_base: str = Field(
        "",
        description="Put before a webhook body's link (e.g. https://sched.example.com);"
        " empty: the link is the API path alone.",
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

    def log_store_options(self) -> dict[str, object]:
        """The S3 options of ``log_store_from_url`` (a directory store ignores them)."""
        return {
            "endpoint_url": self.log_s3_endpoint_url,
            "region": self.log_s3_region,
            "access_key_file": self.log_s3_access_key_file,
            "secret_key_file": self.log_s3_secret_key_file,
            "addressing_style": self.log_s3_addressing_style,
        }

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
