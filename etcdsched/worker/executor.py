"""Preparing and starting a job's process (docs/design.md, "Claims and fencing").

A job starts behind a *gate* (:data:`GATE`): it is forked first, its
process group is told to the watchdog, and only when the gate opens does
it ``exec`` the job — at once (:meth:`StartsAtOnce.start`) or at its
instant (ADR 0008). What happens to the process group after that (waiting,
stopping, output) is :mod:`etcdsched.worker.process_group`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from etcdsched.logs.store import LogWriter
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import ContainerExecution
from etcdsched.worker.job_commands import command_argv, container_command, job_environment
from etcdsched.worker.process_group import EndedProcess, ExitStatus, GroupProcess, Process
from etcdsched.worker.sandbox import JobPlace, JobUser, Sandbox

logger = logging.getLogger(__name__)

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


class Prepared:
    """A job made ready ahead of its instant: its process exists behind a
    gate (see :meth:`ProcessExecutor.prepare`) and runs nothing until
    :meth:`open`. :meth:`abort` instead makes it exit (status 125) without
    running the job. The caller calls exactly one of them, once; the gate
    write end is closed either way. A job with nothing to open (a no-op, a
    program that cannot be started) has ``gate_fd`` None."""

    def __init__(self, process: Process, gate_fd: int | None = None) -> None:
        self.process = process
        self.gate_fd = gate_fd

    @property
    def holds_process(self) -> bool:
        """A process is waiting at the gate (it costs a process until opened)."""
        return self.gate_fd is not None

    def open(self) -> None:
        """Let the job run. One pipe write: safe from any thread."""
        fd, self.gate_fd = self.gate_fd, None
        if fd is not None:
            try:
                os.write(fd, b"go\n")
            finally:
                os.close(fd)

    def abort(self) -> None:
        """The gate reads end-of-file and exits without running the job."""
        fd, self.gate_fd = self.gate_fd, None
        if fd is not None:
            os.close(fd)


class Executor(Protocol):
    """Prepares the process of one attempt of a run, its output going to ``log``."""

    holds_processes: bool
    """Whether a prepared job holds a process until it is opened. One that
    does not costs nothing to hold, so the worker prepares it as soon as
    it is claimed instead of shortly before its instant."""

    async def prepare(
        self,
        run: RunRecord,
        attempt: int,
        worker_id: str,
        log: LogWriter,
        guard: Callable[[int], None] | None = None,
    ) -> Prepared:
        """Make the job ready to start: ``guard`` (the watchdog) learns its
        process group before this returns; the job runs on ``open()``."""
        ...


class StartsAtOnce:
    """``start`` = ``prepare`` then ``open`` (for callers with no instant to wait for)."""

    holds_processes = True

    async def start(
        self: Executor,
        run: RunRecord,
        attempt: int,
        worker_id: str,
        log: LogWriter,
        guard: Callable[[int], None] | None = None,
    ) -> Process:
        prepared = await self.prepare(run, attempt, worker_id, log, guard)
        prepared.open()
        return prepared.process


class ProcessExecutor(StartsAtOnce):
    """Runs commands (and containers, through the docker or podman CLI) as
    local processes in their own session, contained by ``sandbox`` (whom
    they run as, where, with which environment).

    A container job's runtime CLI runs as the agent (it needs the runtime's
    socket) and is told ``--user`` so that the job inside runs as the
    tenant's user."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    async def prepare(
        self,
        run: RunRecord,
        attempt: int,
        worker_id: str,
        log: LogWriter,
        guard: Callable[[int], None] | None = None,
    ) -> Prepared:
        # a thread: a directory, its owner and a file each cost the disk a
        # journal write, and the disk may be slow (seen: 100 starts/s on a
        # herd whose event loop waited on them); the loop goes on meanwhile
        place, env, env_file = await asyncio.to_thread(self._place, run, attempt, worker_id)
        job = _JobLaunch(
            env=env,
            cwd=place.cwd,
            user=place.user,
            grace=run.spec.kill_grace.total_seconds(),
            on_end=functools.partial(self.sandbox.scratch.remove, place.scratch),
            setpriv=self.sandbox.run_as.setpriv,
            env_file=env_file,
        )
        execution = run.spec.execution
        if isinstance(execution, ContainerExecution):
            ids = (place.user.uid, place.user.gid) if place.user is not None else None
            argv, name = container_command(execution, run, attempt, worker_id, ids)
            runtime = _JobLaunch(job.env, place.scratch, None, job.grace, job.on_end)
            return await self._spawn(argv, runtime, log, guard, [argv[0], "rm", "-f", name])
        return await self._spawn(command_argv(execution), job, log, guard)

    def _place(
        self, run: RunRecord, attempt: int, worker_id: str
    ) -> tuple[JobPlace, dict[str, str], Path | None]:
        """The attempt's scratch directory, environment and (for a job of
        another user) environment file: the disk work of a start."""
        place = self.sandbox.place(run, attempt)
        env = job_environment(run, attempt, worker_id, place.env)
        env_file = write_env_file(place.scratch, env, place.user) if place.user else None
        return place, env, env_file

    async def _spawn(
        self,
        argv: list[str],
        job: _JobLaunch,
        log: LogWriter,
        guard: Callable[[int], None] | None,
        runtime_cleanup: list[str] | None = None,
    ) -> Prepared:
        """Spawn the job behind a gate: a shell that waits for one line on
        its stdin before it execs the job. ``guard`` (the watchdog) learns
        the process group before the gate can open. An agent killed before
        the gate opened leaves a gate that reads end-of-file and exits
        without running the job, instead of a job nobody guards (found by
        the 30-minute fault run: a kill -9 landed between fork and guard and
        the job outlived its lost attempt's rerun). The gate also lets the
        fork happen ahead of the job's instant (ADR 0008)."""
        missing = _not_executable(argv[0], job.env, job.cwd) if job.user is None else None
        if missing is not None:
            job.on_end()
            return Prepared(_failed_start(argv, job.cwd, missing, log))
        gate_read, gate_write = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *job.gate(argv),
                stdin=gate_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=job.spawn_env(),
                cwd=job.cwd if job.user is None else "/",
                start_new_session=True,
            )
        except OSError as error:
            os.close(gate_write)
            job.on_end()
            return Prepared(_failed_start(argv, job.cwd, error, log))
        except BaseException:  # e.g. cancelled mid-spawn: asyncio kills the child
            os.close(gate_write)
            job.on_end()
            raise
        finally:
            os.close(gate_read)
        process = GroupProcess(proc, log, job.grace, runtime_cleanup, job.on_end)
        prepared = Prepared(process, gate_write)
        try:
            if guard is not None:
                guard(proc.pid)
        except BaseException:
            prepared.abort()
            raise
        return prepared


@dataclass(frozen=True)
class _JobLaunch:
    """How one process of an attempt starts, and what to undo when it ends."""

    env: dict[str, str]
    cwd: Path
    user: JobUser | None
    grace: float
    on_end: Callable[[], None]
    setpriv: str = "setpriv"
    env_file: Path | None = None
    """A switched job's environment, read by its gate after the switch."""

    def spawn_env(self) -> dict[str, str]:
        """What the spawned process starts with. A switched job gets its own
        environment only after the switch, from :attr:`env_file`: ``setpriv``
        runs as the agent (root), where a variable such as ``LD_PRELOAD``
        would run the tenant's code as root."""
        return self.env if self.user is None else dict(SWITCH_ENV)

    def gate(self, argv: list[str]) -> list[str]:
        """What to spawn: the gate, then ``argv``. For a job of another user,
        ``setpriv`` (util-linux) first becomes that user, with none of the
        agent's groups, and the gate enters the job's directory *as that
        user*: a directory entered by the agent would hand the job what lies
        below it even where the job may not pass. Asking Python to switch
        instead (``user=``) would make it ``fork`` the whole agent rather
        than ``vfork``: slower as the agent grows, and gRPC's fork handlers
        then run in the child (seen: its poller logging into the job's output)."""
        if self.user is None:
            return [*GATE, *argv]
        ids = [f"--reuid={self.user.uid}", f"--regid={self.user.gid}", "--clear-groups"]
        return [self.setpriv, *ids, "--", *GATE_AS_USER, str(self.env_file), str(self.cwd), *argv]


GATE = ["/bin/sh", "-c", 'read -r _ || exit 125; exec </dev/null; exec "$@"', "etcdsched-gate"]
"""Waits for the worker's go (its stdin), gives the job /dev/null as stdin."""
GATE_AS_USER = [
    "/bin/sh",
    "-c",
    'read -r _ || exit 125; exec </dev/null; exec 3<"$1" || exit 126; rm -f -- "$1"; '
    '. /dev/fd/3 || exit 126; exec 3<&-; cd -- "$2" || exit 126; shift 2; exec "$@"',
    "etcdsched-gate",
]
"""The gate of a job of another user: once open, it takes the job's
environment from the file given first (removed before it is read, so that
nothing but the job itself ever runs with that environment), enters the
directory given second, both as the job's user, then execs the job."""
SWITCH_ENV = {"PATH": "/usr/bin:/bin"}
"""All that ``setpriv`` and the gate start with before the job's environment."""
ENV_FILE = ".etcdsched-env"


def write_env_file(scratch: Path, env: dict[str, str], user: JobUser) -> Path:
    """``env`` as ``export NAME='value'`` lines in the attempt's scratch
    directory, readable by the job's user alone. Names are checked when the
    job is submitted; values are quoted (a NUL, which no quoting survives,
    is refused at submission too)."""
    path = scratch / ENV_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w") as out:
        out.write("".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items()))
    os.chown(path, user.uid, user.gid)
    return path


def _not_executable(program: str, env: dict[str, str], cwd: Path | None) -> OSError | None:
    """The error exec would give, checked before the gate hides it."""
    if "/" in program:
        program = os.path.join(cwd or "", program)  # relative to the job's cwd
        if not os.path.exists(program):
            return FileNotFoundError(2, "No such file or directory", program)
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            return PermissionError(13, "Permission denied", program)
        return None
    if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        return FileNotFoundError(2, "No such file or directory", program)
    return None


def _failed_start(argv: list[str], cwd: Path | None, error: OSError, log: LogWriter) -> Process:
    """A program that cannot be started is the job's failure, not the
    worker's: it ends like a shell would report it (127, or 126)."""
    code = EXIT_NOT_EXECUTABLE if isinstance(error, PermissionError) else EXIT_NOT_FOUND
    where = f" in {cwd}" if cwd else ""
    reason = error.strerror or str(error)
    message = f"etcdsched: cannot start {shlex.join(argv)}{where}: {reason}"
    logger.info("%s", message)
    try:
        log.write(f"{message}\n".encode())
    except (OSError, ValueError) as log_error:
        logger.warning("cannot write the log: %s", log_error)
    return EndedProcess(ExitStatus(code, None))


class NoopExecutor(StartsAtOnce):
    """For benchmarks only: "starts" a job instantly, runs nothing, and
    reports exit code 0. No process, so ``pid``/``pgid`` are None and the
    watchdog has nothing to guard. Never use it to run real jobs."""

    holds_processes = False

    async def prepare(
        self,
        run: RunRecord,
        attempt: int,
        worker_id: str,
        log: LogWriter,
        guard: Callable[[int], None] | None = None,
    ) -> Prepared:
        return Prepared(EndedProcess(ExitStatus(0, None)))
