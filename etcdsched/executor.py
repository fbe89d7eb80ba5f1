"""Starting and stopping a job's process (DESIGN §7).

Every job runs in its own session, so its process group id is its pid and
one ``killpg`` reaches everything it spawned that did not leave the group
on purpose. The rules, in the spirit of systemd's ``KillMode=control-group``:

* ``stop(grace)``: SIGTERM to the group, wait until the group is empty (or
  ``grace`` passed), then SIGKILL to the group.
* When the job's main process exits by itself, whatever it left running in
  its group is stopped the same way, with the job's ``kill_grace``: a run
  that is reported finished has no processes left behind.

"Empty" ignores zombies: an orphan re-parented to an init that does not reap
(a container's PID 1, some sandboxes) stays a zombie but runs no code.

The executor never closes the :class:`~etcdsched.logstore.LogWriter`: the
worker may append its own lines (why it stopped a job) after ``wait()``
returns, and ``wait()`` returns only once the output pumps have drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from etcdsched.job_commands import (
    command_argv,
    container_command,
    job_environment,
)
from etcdsched.logstore import LogWriter
from etcdsched.models import RunRecord
from etcdsched.spec import ContainerExecution

logger = logging.getLogger(__name__)

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
_GROUP_POLL = 0.05
_REAP_POLL = 0.002
_DRAIN_TIMEOUT = 1.0
_RUNTIME_CLEANUP_TIMEOUT = 10.0


@dataclass(frozen=True)
class ExitStatus:
    """How the job's main process ended: ``exit_code`` when it exited,
    ``signal`` (and no exit code) when a signal killed it."""

    exit_code: int | None
    signal: int | None = None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """asyncio reports death by signal N as returncode ``-N``."""
        if returncode >= 0:
            return cls(returncode, None)
        return cls(None, -returncode)


class Process(Protocol):
    """A started job. ``pgid`` is what the watchdog is told to guard."""

    @property
    def pid(self) -> int | None: ...

    @property
    def pgid(self) -> int | None: ...

    async def wait(self) -> ExitStatus:
        """The main process's status, once it exited, its group is empty
        (leftovers are stopped, see the module doc) and its output is in the log."""
        ...

    async def stop(self, grace: float) -> None:
        """SIGTERM the group, wait up to ``grace`` s, SIGKILL the group.
        Returns once the job has ended. Idempotent."""
        ...

    def kill_now(self) -> None:
        """SIGKILL the group at once. Sync and cheap: safe in a signal
        handler or a loop callback. A no-op once the job has ended."""
        ...


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


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid`` (Linux /proc)."""
    if pgid <= 1 or not _signal_group(pgid, 0):
        return []
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(name))
    return members


def _signal_group(pgid: int, signum: int) -> bool:
    """``killpg`` that treats a vanished group as done; False if nothing was there."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        logger.warning("not allowed to signal process group %d", pgid)
        return False
    return True


class _GroupProcess:
    """A job process started in its own session; see :class:`Process`."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        log: LogWriter,
        kill_grace: float,
        runtime_cleanup: list[str] | None = None,
    ) -> None:
        self._proc = proc
        self.pid: int | None = proc.pid
        self.pgid: int | None = proc.pid
        self._terminated = False
        self._runtime_cleanup = runtime_cleanup
        pumps = [_pump(proc.stdout, log), _pump(proc.stderr, log)]
        self._supervisor = asyncio.create_task(
            self._supervise([asyncio.create_task(p) for p in pumps], kill_grace),
            name=f"job-{proc.pid}",
        )

    async def wait(self) -> ExitStatus:
        return await asyncio.shield(self._supervisor)

    async def stop(self, grace: float) -> None:
        if self._supervisor.done():
            return
        self._terminate()
        try:
            await asyncio.wait_for(asyncio.shield(self._supervisor), max(grace, 0.0))
        except TimeoutError:
            self.kill_now()
            await asyncio.shield(self._supervisor)

    def kill_now(self) -> None:
        if not self._supervisor.done() and self.pgid is not None:
            _signal_group(self.pgid, signal.SIGKILL)

    def _terminate(self) -> None:
        if not self._terminated and self.pgid is not None:
            self._terminated = True
            _signal_group(self.pgid, signal.SIGTERM)

    async def _supervise(self, pumps: list[asyncio.Task[None]], grace: float) -> ExitStatus:
        try:
            returncode = await _main_process_exit(self._proc)
            await self._empty_group(grace)
            await asyncio.wait(pumps, timeout=_DRAIN_TIMEOUT)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        status = ExitStatus.from_returncode(returncode)
        if self._runtime_cleanup and (self._terminated or status.signal is not None):
            await _run_quietly(self._runtime_cleanup)
        return status

    async def _empty_group(self, grace: float) -> None:
        """After the main process exited: SIGTERM what is left of the group,
        give it ``grace`` seconds, then SIGKILL."""
        assert self.pgid is not None
        if not group_members(self.pgid):
            return
        self._terminate()
        deadline = time.monotonic() + grace
        while group_members(self.pgid):
            if time.monotonic() >= deadline:
                _signal_group(self.pgid, signal.SIGKILL)
                deadline = float("inf")  # now only wait for the kernel to finish them
            await asyncio.sleep(_GROUP_POLL)


class _EndedProcess:
    """A job that never got a process (it could not start, or a no-op)."""

    pid: int | None = None
    pgid: int | None = None

    def __init__(self, status: ExitStatus) -> None:
        self._status = status

    async def wait(self) -> ExitStatus:
        return self._status

    async def stop(self, grace: float) -> None:
        return None

    def kill_now(self) -> None:
        return None


async def _main_process_exit(proc: asyncio.subprocess.Process) -> int:
    """The main process's return code as soon as it exits.

    Not ``proc.wait()``: on Python 3.11 that also waits for the stdout and
    stderr pipes to close, which never happens while a leftover grandchild
    holds them, and stopping the leftovers is exactly what comes next. A
    pidfd becomes readable when the process exits; without pidfd support
    (Linux < 5.3) the return code is polled."""
    loop = asyncio.get_running_loop()
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):  # already reaped, or no pidfd
        pidfd = os.pidfd_open(proc.pid)
    if pidfd is not None:
        exited: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, readable)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
    poll = _REAP_POLL if pidfd is not None else _GROUP_POLL
    while proc.returncode is None:  # the child watcher reaps it a moment later
        await asyncio.sleep(poll)
    return proc.returncode


async def _pump(reader: asyncio.StreamReader | None, log: LogWriter) -> None:
    """Copy one pipe into the log, a whole line per write (longer lines than
    the stream limit go in pieces).

    If the log cannot be written (disk full, closed early) the pipe is still
    drained, so the job never blocks on a full pipe because of its log."""
    if reader is None:
        return
    broken = False
    while True:
        try:
            data = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as eof:
            data = eof.partial
        except asyncio.LimitOverrunError as overrun:
            data = await reader.read(overrun.consumed)
        if not data:
            return
        if broken:
            continue
        try:
            log.write(data)
        except (OSError, ValueError) as error:
            broken = True
            logger.warning("job output is being discarded: cannot write the log: %s", error)


async def _run_quietly(argv: list[str]) -> None:
    """Best-effort helper command (container cleanup); failures are logged."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except OSError as error:
        logger.warning("%s failed: %s", shlex.join(argv), error)
        return
    try:
        await asyncio.wait_for(proc.wait(), _RUNTIME_CLEANUP_TIMEOUT)
    except TimeoutError:
        logger.warning("%s did not finish in %ss", shlex.join(argv), _RUNTIME_CLEANUP_TIMEOUT)
        proc.kill()
        await proc.wait()


class ProcessExecutor(StartsAtOnce):
    """Runs commands (and containers, through the docker or podman CLI) as
    local processes in their own session."""

    async def prepare(
        self,
        run: RunRecord,
        attempt: int,
        worker_id: str,
        log: LogWriter,
        guard: Callable[[int], None] | None = None,
    ) -> Prepared:
        env = job_environment(run, attempt, worker_id)
        execution = run.spec.execution
        grace = run.spec.kill_grace.total_seconds()
        if isinstance(execution, ContainerExecution):
            argv, name = container_command(execution, run, attempt, worker_id)
            cleanup = [argv[0], "rm", "-f", name]
            return await self._spawn(argv, env, None, log, grace, guard, cleanup)
        return await self._spawn(command_argv(execution), env, execution.cwd, log, grace, guard)

    async def _spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        log: LogWriter,
        grace: float,
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
        missing = _not_executable(argv[0], env, cwd)
        if missing is not None:
            return Prepared(_failed_start(argv, cwd, missing, log))
        gate_read, gate_write = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *GATE,
                *argv,
                stdin=gate_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as error:
            os.close(gate_write)
            return Prepared(_failed_start(argv, cwd, error, log))
        except BaseException:  # e.g. cancelled mid-spawn: asyncio kills the child
            os.close(gate_write)
            raise
        finally:
            os.close(gate_read)
        prepared = Prepared(_GroupProcess(proc, log, grace, runtime_cleanup), gate_write)
        try:
            if guard is not None:
                guard(proc.pid)
        except BaseException:
            prepared.abort()
            raise
        return prepared


GATE = ["/bin/sh", "-c", 'read -r _ || exit 125; exec </dev/null; exec "$@"', "etcdsched-gate"]
"""Waits for the worker's go (its stdin), gives the job /dev/null as stdin."""


def _not_executable(program: str, env: dict[str, str], cwd: str | None) -> OSError | None:
    """The error exec would give, checked before the gate hides it."""
    if "/" in program:
        program = os.path.join(cwd or "", program)
        if not os.path.exists(program):
            return FileNotFoundError(2, "No such file or directory", program)
        if not os.access(program, os.X_OK) or os.path.isdir(program):
            return PermissionError(13, "Permission denied", program)
        return None
    if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        return FileNotFoundError(2, "No such file or directory", program)
    return None


def _failed_start(argv: list[str], cwd: str | None, error: OSError, log: LogWriter) -> Process:
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
    return _EndedProcess(ExitStatus(code, None))


class NoopExecutor(StartsAtOnce):
    """For benchmarks only: "starts" a job instantly, runs nothing, and
    reports exit code 0. No process, so ``pid``/``pgid`` are None and the
    watchdog has nothing to guard. Never use it to run real jobs."""

    async def prepare(
        self,
        run: RunRecord,
        attempt: int,
        worker_id: str,
        log: LogWriter,
        guard: Callable[[int], None] | None = None,
    ) -> Prepared:
        return Prepared(_EndedProcess(ExitStatus(0, None)))
