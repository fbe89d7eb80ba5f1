"""Prepared jobs against real processes: forked and guarded ahead of their
instant, behind a gate that runs the job on ``open()`` and lets the process
go without running it on ``abort()`` (ADR 0008)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from etcdsched.logs.store import DirLogStore, LogWriter
from etcdsched.worker.executor import (
    EXIT_NOT_FOUND,
    Executor,
    NoopExecutor,
    Prepared,
    ProcessExecutor,
)
from etcdsched.worker.process_group import ExitStatus
from etcdsched.worker.starter import ThreadStarter
from tests.integration.test_executor import RUN_ID, make_run
from tests.support.eventually import assert_eventually
from tests.support.sandboxes import as_this_user

EXIT_GATE_ABORTED = 125
SETTLE = 5.0

Prepare = Callable[..., Awaitable[Prepared]]


@pytest.fixture
def log(tmp_path: Path) -> LogWriter:
    return DirLogStore(tmp_path / "logs").open_writer(RUN_ID, 2)


@pytest_asyncio.fixture
async def prepare(log: LogWriter, tmp_path: Path) -> AsyncIterator[Prepare]:
    """Prepare a command in ``tmp_path``; at teardown a gate still closed is
    aborted and anything still running is killed and reaped."""
    prepared: list[Prepared] = []

    async def _prepare(
        argv: list[str],
        guard: Callable[[int], None] | None = None,
        executor: Executor | None = None,
        **execution: Any,
    ) -> Prepared:
        run = make_run({"argv": argv, "cwd": str(tmp_path), **execution})
        executor = executor or ProcessExecutor(as_this_user())
        job = await executor.prepare(run, 2, "worker-7", log, guard)
        prepared.append(job)
        return job

    yield _prepare
    for job in prepared:
        job.abort()
        job.process.kill_now()
        await job.process.wait()


def cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


async def at_the_gate(pid: int) -> None:
    """The gate shell is asleep (in its ``read``) and has not exec'd the job."""

    def check() -> None:
        assert b"etcdsched-gate" in cmdline(pid), "the gate has exec'd"
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        assert stat[stat.rfind(b")") + 2 :][:1] == b"S", "the gate is not waiting yet"

    await assert_eventually(check, timeout=SETTLE)


def assert_closed(fd: int) -> None:
    """The gate's write end is closed (nothing can reuse the number without an await)."""
    with pytest.raises(OSError):
        os.fstat(fd)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


async def test_a_prepared_job_is_guarded_but_runs_only_once_opened(
    prepare: Prepare, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    guarded: list[int] = []
    prepared = await prepare(["touch", str(marker)], guard=guarded.append)

    pid = prepared.process.pid
    assert pid is not None and prepared.process.pgid == pid
    assert guarded == [pid]  # the watchdog knew before prepare returned
    assert prepared.holds_process
    await at_the_gate(pid)
    assert not marker.exists()

    gate_fd = prepared.gate_fd
    assert gate_fd is not None
    prepared.open()
    assert not prepared.holds_process
    assert_closed(gate_fd)
    assert await prepared.process.wait() == ExitStatus(0, None)
    assert marker.exists()
    prepared.abort()  # after open: nothing left to close


async def test_an_aborted_job_exits_125_without_running(prepare: Prepare, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    prepared = await prepare(["touch", str(marker)], guard=lambda pgid: None)
    assert prepared.process.pid is not None
    await at_the_gate(prepared.process.pid)

    gate_fd = prepared.gate_fd
    assert gate_fd is not None
    prepared.abort()
    assert not prepared.holds_process
    assert_closed(gate_fd)
    assert await prepared.process.wait() == ExitStatus(EXIT_GATE_ABORTED, None)
    assert not marker.exists()  # the gate exited: nothing can create it any more
    prepared.open()  # after abort: nothing left to write to


async def test_an_opened_job_gets_dev_null_not_the_gate_as_stdin(
    prepare: Prepare, tmp_path: Path
) -> None:
    prepared = await prepare(["sh", "-c", "readlink /proc/self/fd/0 > stdin.txt"])
    prepared.open()
    assert await prepared.process.wait() == ExitStatus(0, None)
    assert (tmp_path / "stdin.txt").read_text() == "/dev/null\n"


async def test_a_program_that_cannot_start_is_prepared_without_a_gate(
    prepare: Prepare,
) -> None:
    guarded: list[int] = []
    prepared = await prepare(["/nonexistent/program"], guard=guarded.append)
    assert not prepared.holds_process
    assert (prepared.process.pid, guarded) == (None, [])
    prepared.open()  # a no-op
    assert await prepared.process.wait() == ExitStatus(EXIT_NOT_FOUND, None)


async def test_noop_executor_prepares_no_process(prepare: Prepare) -> None:
    guarded: list[int] = []
    prepared = await prepare(["true"], guard=guarded.append, executor=NoopExecutor())
    assert not prepared.holds_process
    assert (prepared.process.pid, prepared.process.pgid, guarded) == (None, None, [])
    prepared.open()
    prepared.abort()
    assert await prepared.process.wait() == ExitStatus(0, None)


async def test_thread_starter_runs_a_prepared_job_at_its_instant(
    prepare: Prepare, tmp_path: Path
) -> None:
    """The worker's path: prepare ahead, the starter opens at the instant."""
    marker = tmp_path / "ran"
    prepared = await prepare(
        [
            sys.executable,
            "-c",
            "import pathlib, sys, time; "
            "pathlib.Path(sys.argv[1]).write_text(str(time.time_ns() // 1_000_000))",
            str(marker),
        ]
    )
    starter = ThreadStarter()
    try:
        at_ms = wall_ms() + 150
        ticket = starter.schedule(prepared, at_ms, lambda: True)
        stamp = await asyncio.wait_for(ticket.started, SETTLE)
    finally:
        starter.close()
    assert stamp is not None and stamp >= at_ms
    assert await prepared.process.wait() == ExitStatus(0, None)
    assert int(marker.read_text()) >= at_ms  # the job itself ran no earlier


async def test_thread_starter_refusal_leaves_the_gate_for_the_attempt_to_abort(
    prepare: Prepare, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    prepared = await prepare(["touch", str(marker)])
    starter = ThreadStarter()
    try:
        ticket = starter.schedule(prepared, wall_ms() + 50, lambda: False)
        assert await asyncio.wait_for(ticket.started, SETTLE) is None
    finally:
        starter.close()
    assert prepared.holds_process and prepared.process.pid is not None
    await at_the_gate(prepared.process.pid)

    prepared.abort()
    assert await prepared.process.wait() == ExitStatus(EXIT_GATE_ABORTED, None)
    assert not marker.exists()


def open_pipes() -> set[tuple[str, str]]:
    """This process's open pipe fds, as (fd, pipe inode)."""
    pipes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd, gone by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("pipe:"):
                pipes.add((fd, target))
    return pipes


async def test_a_prepare_cancelled_mid_spawn_leaves_no_gate_fd(
    log: LogWriter, tmp_path: Path
) -> None:
    run = make_run({"argv": ["true"], "cwd": str(tmp_path)})
    before = open_pipes()
    task = asyncio.create_task(ProcessExecutor(as_this_user()).prepare(run, 2, "worker-7", log))
    await asyncio.sleep(0)  # runs up to the fork's first await
    task.cancel()
    try:
        prepared = await task
    except asyncio.CancelledError:
        pass
    else:  # the spawn finished first: nothing to check this time
        prepared.abort()
        await prepared.process.wait()
        pytest.skip("prepare completed before it could be cancelled")
    assert open_pipes() - before == set()
