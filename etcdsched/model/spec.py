"""What a client submits: a job spec with every policy (docs/design.md, "Run states").

Validation happens here, at the edge: a spec that parses is a spec the
scheduler can run. Durations accept ``"30s"``, ``"5m"``, ISO 8601 or seconds.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    StrictBool,
    StrictFloat,
    StrictInt,
    Tag,
    field_validator,
)

from etcdsched.model.durations import format_duration, parse_duration
from etcdsched.model.notify import MAX_NOTIFY_RULES, NotifyRule
from etcdsched.model.triggers import Trigger

Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$")
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,255}$"
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,511}$"
"""An image reference: never starts with ``-``, so it cannot be read as a
flag of the container runtime."""
MAX_ARG_BYTES = 131_071
"""The kernel's limit on one argv or environment string (MAX_ARG_STRLEN,
128 KiB, less its terminating NUL)."""
LOADER_ENV_PREFIXES = ("LD_", "DYLD_", "MALLOC_")
LOADER_ENV_NAMES = frozenset(
    {
        *("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "IFS", "PS4"),
        *("GCONV_PATH", "GLIBC_TUNABLES", "HOSTALIASES", "LOCPATH", "NLSPATH"),
        "RESOLV_HOST_CONF",
        *("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT"),
        *("PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYLIB", "RUBYOPT"),
        *("NODE_OPTIONS", "NODE_PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS"),
    }
)
"""Variables that change what a loader, shell or interpreter runs before the
job's own code: refused in a job's ``env`` unless an admin allows the
tenant them (``loader_env`` in its limits)."""


def loader_variables(env: dict[str, str]) -> list[str]:
    """The names in ``env`` that only an allowed tenant may set."""
    return sorted(
        name for name in env if name in LOADER_ENV_NAMES or name.startswith(LOADER_ENV_PREFIXES)
    )


def _valid_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not re.fullmatch(ENV_NAME_PATTERN, name):
            raise ValueError(f"invalid variable name {name[:64]!r}: letters, digits and _")
        _valid_string(value, f"the value of {name}")
    return env


def _valid_string(value: str, what: str) -> str:
    if "\0" in value:
        raise ValueError(f"{what} contains a NUL byte")
    if len(value.encode()) > MAX_ARG_BYTES:
        raise ValueError(f"{what} is longer than {MAX_ARG_BYTES} bytes (the kernel's limit)")
    return value


EnvVars = Annotated[dict[str, str], AfterValidator(_valid_env)]


def _non_negative(value: timedelta) -> timedelta:
    if value < timedelta(0):
        raise ValueError("must not be negative")
    return value


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be positive")
    return value


NonNegDuration = Annotated[Duration, AfterValidator(_non_negative)]
PosDuration = Annotated[Duration, AfterValidator(_positive)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Outcome = Literal["failed", "timed_out", "lost"]


class RetryPolicy(_Strict):
    """How a failed attempt is retried: exponential backoff with jitter."""

    max_attempts: StrictInt = Field(1, ge=1, le=100, description="Total attempts, first included.")
    initial_delay: NonNegDuration = timedelta(seconds=1)
    multiplier: StrictFloat = Field(2.0, ge=1.0, le=10.0)
    max_delay: NonNegDuration = timedelta(minutes=5)
    jitter: StrictFloat = Field(0.1, ge=0.0, le=1.0, description="Fraction of the delay, +/-.")
    retry_on: frozenset[Outcome] = frozenset({"failed", "timed_out", "lost"})
    stop_at_next_slot: StrictBool = Field(False, description="Give up once the next slot is due.")


class MisfirePolicy(_Strict):
    """What to do with slots that came due while no scheduler could fire them.

    A slot is *misfired* when it is fired more than ``grace`` after its time."""

    policy: Literal["skip", "run_once", "run_all"] = "run_once"
    grace: NonNegDuration = timedelta(seconds=5)
    catch_up_window: PosDuration = timedelta(hours=1)
    max_catch_up: StrictInt = Field(10, ge=1, le=1000)


class Resources(_Strict):
    """What one run needs from a worker. ``slots`` counts concurrent runs."""

    slots: StrictInt = Field(1, ge=0, le=1024)
    cpu: StrictFloat = Field(0.0, ge=0.0, le=1024.0)
    memory_mb: StrictInt = Field(0, ge=0, le=16 * 1024 * 1024)
    gpu: StrictInt = Field(0, ge=0, le=64)


class Capacity(Resources):
    """What one worker offers: the dimensions of :class:`Resources`, with
    room for far more concurrent runs than one run may ask for (a worker of
    short or idle jobs can hold thousands)."""

    slots: StrictInt = Field(4, ge=0, le=1_000_000)


class Retention(_Strict):
    """How much history of finished runs stays in etcd."""

    keep_last: StrictInt = Field(100, ge=1, le=100_000)
    max_age: PosDuration | None = None


class CommandExecution(_Strict):
    """Run ``argv`` directly (no shell unless ``shell`` is true)."""

    kind: Literal["command"] = "command"
    argv: list[str] = Field(min_length=1, max_length=4096)
    shell: StrictBool = False
    env: EnvVars = Field(default_factory=dict)
    cwd: str | None = Field(None, max_length=4096)

    @field_validator("argv")
    @classmethod
    def _argv_not_empty(cls, argv: list[str]) -> list[str]:
        if not argv[0]:
            raise ValueError("argv[0] must name a program")
        for index, arg in enumerate(argv):
            _valid_string(arg, f"argv[{index}]")
        return argv

    @field_validator("cwd")
    @classmethod
    def _cwd_valid(cls, cwd: str | None) -> str | None:
        return None if cwd is None else _valid_string(cwd, "cwd")


class ContainerExecution(_Strict):
    """Run an image with the docker or podman CLI found on the worker."""

    kind: Literal["container"] = "container"
    image: str = Field(pattern=IMAGE_PATTERN, description="An image reference, e.g. alpine:3.")
    args: list[str] = Field(default_factory=list, max_length=4096)
    env: EnvVars = Field(default_factory=dict)
    runtime: Literal["auto", "docker", "podman"] = "auto"

    @field_validator("args")
    @classmethod
    def _args_valid(cls, args: list[str]) -> list[str]:
        for index, arg in enumerate(args):
            _valid_string(arg, f"args[{index}]")
        return args


def _execution_kind(value: object) -> str:
    """``kind`` may be left out: a bare ``{"argv": [...]}`` is a command."""
    if isinstance(value, dict):
        return str(value.get("kind", "command"))
    return str(getattr(value, "kind", "command"))


Execution = Annotated[
    Annotated[CommandExecution, Tag("command")] | Annotated[ContainerExecution, Tag("container")],
    Discriminator(_execution_kind),
]
Overlap = Literal["allow", "skip", "queue_one", "cancel_previous"]


class JobSpec(_Strict):
    """Everything a client says about a job. Unknown fields are rejected."""

    trigger: Trigger
    execution: Execution
    tenant: str = Field("default", pattern=TENANT_PATTERN)
    description: str = Field("", max_length=1024)
    labels: dict[str, str] = Field(default_factory=dict)
    selector: dict[str, str] = Field(
        default_factory=dict, description="Worker labels a run needs (e.g. pool)."
    )
    resources: Resources = Resources()
    priority: StrictInt = Field(100, ge=0, le=999, description="Higher is placed first.")
    timeout: PosDuration | None = None
    kill_grace: NonNegDuration = timedelta(seconds=10)
    starting_deadline: PosDuration | None = None
    jitter: NonNegDuration = timedelta(0)
    overlap: Overlap = "allow"
    misfire: MisfirePolicy = MisfirePolicy()
    retry: RetryPolicy = RetryPolicy()
    retention: Retention = Retention()
    depends_on: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Jobs (same tenant) whose latest run at or before a slot must succeed"
        " before this job's run for the slot starts (docs/dependencies.md).",
    )
    dependency_window: PosDuration = Field(
        timedelta(days=1), description="How far before a slot an upstream run may be."
    )
    dependency_timeout: PosDuration = Field(
        timedelta(days=1), description="How long after its slot a run waits for its upstreams."
    )
    pause_after_failures: StrictInt | None = Field(
        None,
        ge=1,
        le=1000,
        description="Pause the job once this many runs in a row ended failed, timed out or"
        " lost (sends job.paused; docs/webhooks.md).",
    )
    notify: list[NotifyRule] = Field(
        default_factory=list,
        max_length=MAX_NOTIFY_RULES,
        description="Events of this job's runs sent to webhooks of its tenant (docs/webhooks.md).",
    )

    @field_validator("labels", "selector")
    @classmethod
    def _label_keys(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not LABEL_KEY.fullmatch(key) or len(value) > 256:
                raise ValueError(f"invalid label {key!r}")
        return labels

    @field_validator("jitter")
    @classmethod
    def _jitter_fits(cls, jitter: timedelta) -> timedelta:
        if jitter > timedelta(hours=1):
            raise ValueError("jitter must be at most 1h")
        return jitter
