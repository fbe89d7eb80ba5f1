"""A job's process group: waiting for it, stopping it, its output.

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

Nothing here closes the :class:`~etcdsched.logs.store.LogWriter`: the worker
may append its own lines (why it stopped a job) after ``wait()`` returns,
and ``wait()`` returns only once the output pumps have drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from etcdsched.logs.store import LogWriter

logger = logging.getLogger(__name__)

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

    def ended(self) -> ExitStatus | None:
        """What :meth:`wait` would return, if it would return at once; else None."""
        ...

    async def stop(self, grace: float) -> None:
        """SIGTERM the group, wait up to ``grace`` s, SIGKILL the group.
        Returns once the job has ended. Idempotent."""
        ...

    def kill_now(self) -> None:
        """SIGKILL the group at once. Sync and cheap: safe in a signal
        handler or a loop callback. A no-op once the job has ended."""
        ...


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


class GroupProcess:
    """A job process started in its own session; see :class:`Process`."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        log: LogWriter,
        kill_grace: float,
        runtime_cleanup: list[str] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self._proc = proc
        self._on_end = on_end
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

    def ended(self) -> ExitStatus | None:
        task = self._supervisor
        ended = task.done() and not task.cancelled() and task.exception() is None
        return task.result() if ended else None

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
        if self._on_end is not None:
            await asyncio.to_thread(self._on_end)  # e.g. removing a scratch directory
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


class EndedProcess:
    """A job that never got a process (it could not start, or a no-op)."""

    pid: int | None = None
    pgid: int | None = None

    def __init__(self, status: ExitStatus) -> None:
        self._status = status

    async def wait(self) -> ExitStatus:
        return self._status

    def ended(self) -> ExitStatus | None:
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
