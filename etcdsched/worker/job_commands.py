"""What a job is started as: its environment (the worker's allow-list, the
job's own, then the ``ETCDSCHED_*`` run identity) and its argv (a command, a
shell script, or a container runtime's ``run``)."""

from __future__ import annotations

import re
import shlex
import shutil
from datetime import UTC, datetime, timedelta

from etcdsched.model.errors import InvalidInput
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import CommandExecution, ContainerExecution

_CONTAINER_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def job_environment(
    run: RunRecord, attempt: int, worker_id: str, base: dict[str, str]
) -> dict[str, str]:
    """``base`` (the worker's allow-list, see :mod:`etcdsched.worker.sandbox`),
    then the job's own ``env``, then the ``ETCDSCHED_*`` run identity (which
    always wins). Nothing of the worker's own environment is inherited: its
    ``ETCDSCHED_*`` configuration (etcd endpoints, credentials) least of all."""
    return {**base, **run.spec.execution.env, **run_identity(run, attempt, worker_id)}


def run_identity(run: RunRecord, attempt: int, worker_id: str) -> dict[str, str]:
    """What a job needs to make itself idempotent (docs/design.md, "Recovery")."""
    scheduled = _EPOCH + timedelta(milliseconds=run.slot_ms)  # exact, unlike float seconds
    return {
        "ETCDSCHED_JOB_ID": run.job_id,
        "ETCDSCHED_RUN_ID": run.id,
        "ETCDSCHED_ATTEMPT": str(attempt),
        "ETCDSCHED_SCHEDULED_AT": scheduled.isoformat(timespec="milliseconds").replace(
            "+00:00", "Z"
        ),
        "ETCDSCHED_SCHEDULED_AT_MS": str(run.slot_ms),
        "ETCDSCHED_WORKER_ID": worker_id,
    }


def command_argv(execution: CommandExecution) -> list[str]:
    """The argv to exec. With ``shell``, a single element is the script
    itself; several are quoted back into one command line."""
    if not execution.shell:
        return list(execution.argv)
    script = execution.argv[0] if len(execution.argv) == 1 else shlex.join(execution.argv)
    return ["/bin/sh", "-c", script]


def container_command(
    execution: ContainerExecution,
    run: RunRecord,
    attempt: int,
    worker_id: str,
    user: tuple[int, int] | None = None,
) -> tuple[list[str], str]:
    """``<runtime> run --rm --name <name> [--user U:G] -e K ... -- image args``
    and the name. The runtime's own flags come only from here: the job's
    image is validated (no leading ``-``) and its ``args`` follow it, where
    the runtime passes them to the container.

    Variables are passed as ``-e K`` (the runtime CLI copies the value from
    its own environment, which is the job environment): values, secrets
    included, never show up in ``ps``. Only the job's ``env`` and the
    ``ETCDSCHED_*`` identity enter the container, not the worker's environment.
    """
    runtime = find_container_runtime(execution.runtime)
    safe_id = _CONTAINER_NAME_UNSAFE.sub("_", run.id)
    name = f"etcdsched-{safe_id}-{attempt}"
    keys = {**execution.env, **run_identity(run, attempt, worker_id)}
    env_flags = [flag for key in keys for flag in ("-e", key)]
    user_flags = ["--user", f"{user[0]}:{user[1]}"] if user is not None else []
    argv = [
        *(runtime, "run", "--rm", "--name", name, *user_flags, *env_flags),
        *(execution.image, *execution.args),
    ]
    return argv, name


def find_container_runtime(runtime: str) -> str:
    candidates = ["docker", "podman"] if runtime == "auto" else [runtime]
    for candidate in candidates:
        path = shutil.which(candidate)
        if path:
            return path
    raise InvalidInput(
        "no container runtime (docker or podman) on this worker", field="execution.runtime"
    )
