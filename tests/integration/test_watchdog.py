"""The watchdog kills a worker's jobs when the worker is frozen or dead.

A "fake agent" is a real Python process that starts a Watchdog, a job
(``sleep 300`` in its own session) and keeps feeding deadlines a second (or
a minute) ahead, as a worker does after each lease keep-alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from etcdsched.worker.watchdog import Watchdog
from tests.support.eventually import wait_until
from tests.support.procs import alive

REPO = Path(__file__).resolve().parents[2]

FAKE_AGENT = """\
import os, subprocess, sys, time
from etcdsched.worker.watchdog import Watchdog

out, ahead = sys.argv[1], float(sys.argv[2])
watchdog = Watchdog()
watchdog.start()
watchdog.feed(time.monotonic() + ahead)
job = subprocess.Popen(["sleep", "300"], start_new_session=True)
watchdog.add(job.pid)
with open(out + ".tmp", "w") as file:
    file.write(f"{job.pid} {watchdog.pid}\\n")
os.rename(out + ".tmp", out)
while True:
    watchdog.feed(time.monotonic() + ahead)
    time.sleep(0.2)
"""


def dead(pid: int) -> Callable[[], None]:
    def check() -> None:
        assert not alive(pid), f"process {pid} is still running"

    return check


class FakeAgent:
    def __init__(self, tmp_path: Path, ahead: float) -> None:
        script = tmp_path / "fake_agent.py"
        script.write_text(FAKE_AGENT)
        pids = tmp_path / "pids"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        # Its own session, so the test can freeze its whole process group.
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(pids), str(ahead)], env=env, start_new_session=True
        )
        try:
            self.job, self.watchdog = wait_until(lambda: _read_pids(pids), timeout=10)
        except BaseException:
            self.proc.kill()  # its watchdog then kills its job (EOF)
            self.proc.wait()
            raise

    def close(self) -> None:
        """Kill everything it started, even if a test failed half-way."""
        with contextlib.suppress(ProcessLookupError):  # already killed by the test
            os.killpg(self.proc.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()
        for pid in (self.job, self.watchdog):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _read_pids(path: Path) -> tuple[int, int]:
    assert path.exists(), "the fake agent has not started its job yet"
    job, watchdog = path.read_text().split()
    return int(job), int(watchdog)


@pytest.fixture
def agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FakeAgent]:
    """A fake agent feeding deadlines ``request.param`` (default 1) seconds ahead."""
    fake = FakeAgent(tmp_path, getattr(request, "param", 1.0))
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def spawn_job() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """``sleep 300`` in its own session (pgid == pid), killed at teardown."""
    jobs: list[subprocess.Popen[bytes]] = []

    def spawn() -> subprocess.Popen[bytes]:
        jobs.append(subprocess.Popen(["sleep", "300"], start_new_session=True))
        return jobs[-1]

    yield spawn
    for job in jobs:
        job.kill()
        job.wait()


@pytest.fixture
def watchdog() -> Iterator[Watchdog]:
    client = Watchdog()
    client.start()
    yield client
    client.close()


def test_a_frozen_agent_has_its_job_killed(agent: FakeAgent) -> None:
    assert alive(agent.job)
    os.killpg(agent.proc.pid, signal.SIGSTOP)  # the agent's whole group, not the watchdog
    stopped = time.monotonic()
    wait_until(dead(agent.job), timeout=3)
    assert time.monotonic() - stopped < 2.0  # deadline was at most 1 s ahead
    assert alive(agent.watchdog)  # the watchdog only fences; it keeps running


@pytest.mark.parametrize("agent", [60.0], indirect=True)
def test_a_killed_agent_has_its_job_killed_promptly(agent: FakeAgent) -> None:
    agent.proc.kill()
    agent.proc.wait()
    wait_until(dead(agent.job), timeout=3)  # long before the deadline: the EOF did it
    wait_until(dead(agent.watchdog), timeout=2)


def test_a_fed_watchdog_leaves_the_job_alone(agent: FakeAgent) -> None:
    began = time.monotonic()

    def held_long_enough() -> bool:
        if not alive(agent.job):
            pytest.fail("the job was killed although the watchdog was fed in time")
        return time.monotonic() - began >= 1.5

    wait_until(held_long_enough, timeout=5, interval=0.1)


def test_past_deadline_kills_tracked_and_newly_added_groups(
    watchdog: Watchdog, spawn_job: Callable[[], subprocess.Popen[bytes]]
) -> None:
    kept, removed, late = spawn_job(), spawn_job(), spawn_job()
    watchdog.feed(time.monotonic() + 60)
    watchdog.add(kept.pid)
    watchdog.add(removed.pid)
    watchdog.remove(removed.pid)
    watchdog.feed(time.monotonic() - 1)
    wait_until(lambda: kept.poll() == -signal.SIGKILL, timeout=2)
    watchdog.add(late.pid)
    wait_until(lambda: late.poll() == -signal.SIGKILL, timeout=2)
    # ``removed`` was untracked before the same kill pass that took ``kept``.
    assert removed.poll() is None


def test_a_new_deadline_rearms_the_watchdog(
    watchdog: Watchdog, spawn_job: Callable[[], subprocess.Popen[bytes]]
) -> None:
    job, probe = spawn_job(), spawn_job()
    watchdog.feed(time.monotonic() - 1)
    watchdog.feed(time.monotonic() + 60)
    watchdog.add(job.pid)  # would die at once if the watchdog were still expired
    watchdog.remove(job.pid)
    watchdog.add(probe.pid)
    watchdog.feed(time.monotonic() - 1)
    wait_until(lambda: probe.poll() == -signal.SIGKILL, timeout=2)
    # Commands are handled in order, so ``job`` got past its add unharmed.
    assert job.poll() is None


def test_close_kills_what_is_still_guarded(
    watchdog: Watchdog, spawn_job: Callable[[], subprocess.Popen[bytes]]
) -> None:
    job = spawn_job()
    watchdog.feed(time.monotonic() + 60)
    watchdog.add(job.pid)
    pid = watchdog.pid
    watchdog.close()
    assert pid is not None and not alive(pid)
    wait_until(lambda: job.poll() == -signal.SIGKILL, timeout=2)
    watchdog.feed(time.monotonic())  # after close: ignored, no new watchdog
    assert watchdog.pid is None


def test_a_dead_watchdog_is_restarted_with_its_state(
    watchdog: Watchdog, spawn_job: Callable[[], subprocess.Popen[bytes]]
) -> None:
    job = spawn_job()
    watchdog.feed(time.monotonic() + 60)
    watchdog.add(job.pid)
    old = watchdog.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    wait_until(dead(old), timeout=2)
    watchdog.feed(time.monotonic() - 1)  # fails on the dead one, replayed on a new one
    assert watchdog.pid not in (None, old)
    wait_until(lambda: job.poll() == -signal.SIGKILL, timeout=2)


def test_the_watchdog_ignores_bad_commands(
    spawn_job: Callable[[], subprocess.Popen[bytes]],
) -> None:
    job = spawn_job()
    proc = subprocess.Popen(
        [sys.executable, "-m", "etcdsched.worker.watchdog"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    commands = f"bogus\nadd 1\nadd x\ndeadline nan\n\xff\ndeadline {time.monotonic() - 1}\n"
    _, stderr = proc.communicate(f"{commands}add {job.pid}\n".encode("latin-1"), timeout=5)
    assert proc.returncode == 0
    assert job.wait(timeout=2) == -signal.SIGKILL
    assert stderr.count(b"ignoring bad command") == 5


def test_a_group_past_its_own_hang_deadline_dies_alone(
    watchdog: Watchdog, spawn_job: Callable[[], subprocess.Popen[bytes]]
) -> None:
    """A job with a timeout is guarded with its hang deadline: a stalled
    agent loop cannot let it outlive recovery's hung verdict, while the
    other jobs live on as long as the lease holds."""
    hung, other = spawn_job(), spawn_job()
    watchdog.feed(time.monotonic() + 60)
    watchdog.add(hung.pid, time.monotonic() + 0.3)
    watchdog.add(other.pid)
    wait_until(lambda: hung.poll() == -signal.SIGKILL, timeout=3)
    assert other.poll() is None
    old = watchdog.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)  # a restarted watchdog is told the own deadlines too
    wait_until(dead(old), timeout=2)
    late = spawn_job()
    watchdog.add(late.pid, time.monotonic() + 0.3)
    wait_until(lambda: late.poll() == -signal.SIGKILL, timeout=3)
    assert other.poll() is None
