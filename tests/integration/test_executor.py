"""ProcessExecutor against real processes: environment, logs, stopping whole
process groups (grandchildren included), failures to start, containers via a
fake runtime CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from etcdsched.logs.store import DirLogStore, LogWriter
from etcdsched.model.errors import InvalidInput
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import CommandExecution, JobSpec
from etcdsched.worker.executor import NoopExecutor, ProcessExecutor
from etcdsched.worker.job_commands import command_argv
from etcdsched.worker.process_group import ExitStatus, Process
from tests.support.eventually import assert_eventually
from tests.support.procs import alive
from tests.support.sandboxes import as_this_user

SLOT_MS = 1_767_225_600_123  # 2026-01-01T00:00:00.123Z
RUN_ID = f"job-1@{SLOT_MS:014d}"
GRACE = 0.5

Start = Callable[..., Awaitable[Process]]


def make_run(execution: dict[str, Any], kill_grace: float = GRACE) -> RunRecord:
    spec = JobSpec.model_validate(
        {"trigger": {"kind": "now"}, "execution": execution, "kill_grace": kill_grace}
    )
    return RunRecord(
        id=RUN_ID,
        job_id="job-1",
        tenant="default",
        partition=0,
        slot_ms=SLOT_MS,
        not_before_ms=SLOT_MS,
        spec=spec,
        job_version=1,
        created_ms=SLOT_MS,
        updated_ms=SLOT_MS,
    )


def live_group(pgid: int) -> list[int]:
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    members = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except FileNotFoundError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(pid)
    return members


async def read_pid(path: Path) -> int:
    def check() -> int:
        text = path.read_text() if path.exists() else ""
        assert text.endswith("\n"), f"{path.name} not written yet"
        return int(text)

    return await assert_eventually(check, timeout=5)


async def all_gone(*pids: int) -> None:
    def check() -> None:
        assert not [pid for pid in pids if alive(pid)], "processes survived"
        assert not live_group(pids[0]), "the job's process group survived"

    await assert_eventually(check, timeout=5)


@pytest.fixture
def store(tmp_path: Path) -> DirLogStore:
    return DirLogStore(tmp_path / "logs")


@pytest.fixture
def log(store: DirLogStore) -> LogWriter:
    return store.open_writer(RUN_ID, 2)


async def log_text(store: DirLogStore, log: LogWriter) -> str:
    log.close()
    chunk = await store.read(RUN_ID, 2)
    assert chunk.complete
    return chunk.data.decode()


@pytest_asyncio.fixture
async def start(log: LogWriter, tmp_path: Path) -> AsyncIterator[Start]:
    """Start a command in ``tmp_path``; anything still running at teardown is killed."""
    started: list[Process] = []

    async def _start(argv: list[str], **execution: Any) -> Process:
        kill_grace = execution.pop("kill_grace", GRACE)
        run = make_run({"argv": argv, "cwd": str(tmp_path), **execution}, kill_grace)
        process = await ProcessExecutor(as_this_user()).start(run, 2, "worker-7", log)
        started.append(process)
        return process

    yield _start
    for process in started:
        process.kill_now()
        await process.wait()


async def test_job_sees_its_identity_and_env(
    start: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_VAR", "from-worker")
    monkeypatch.setenv("ETCDSCHED_ETCD_PASSWORD", "worker-secret")
    script = "import json, os; json.dump(dict(os.environ), open('env.json', 'w'))"
    job_env = {"JOB_VAR": "from-job", "ETCDSCHED_RUN_ID": "spoofed"}
    process = await start([sys.executable, "-c", script], env=job_env)
    assert await process.wait() == ExitStatus(0, None)
    env = json.loads((tmp_path / "env.json").read_text())
    assert {k: v for k, v in env.items() if k.startswith("ETCDSCHED_")} == {
        "ETCDSCHED_JOB_ID": "job-1",
        "ETCDSCHED_RUN_ID": RUN_ID,
        "ETCDSCHED_ATTEMPT": "2",
        "ETCDSCHED_SCHEDULED_AT": "2026-01-01T00:00:00.123Z",
        "ETCDSCHED_SCHEDULED_AT_MS": str(SLOT_MS),
        "ETCDSCHED_WORKER_ID": "worker-7",
    }
    assert env["JOB_VAR"] == "from-job"
    assert "WORKER_VAR" not in env  # nothing of the worker's environment is inherited
    assert env["HOME"] == env["TMPDIR"] != str(tmp_path)  # the attempt's scratch directory


async def test_stdout_and_stderr_land_in_the_log(
    start: Start, store: DirLogStore, log: LogWriter
) -> None:
    process = await start(["sh", "-c", "echo out; echo err >&2; printf partial; exit 3"])
    assert await process.wait() == ExitStatus(3, None)
    text = await log_text(store, log)
    # The streams interleave by line; an unterminated last line runs into the other's.
    assert text.count("partial") == 1
    assert sorted(text.replace("partial", "").splitlines(keepends=True)) == ["err\n", "out\n"]


async def test_a_line_longer_than_the_stream_limit_is_kept_whole(
    start: Start, store: DirLogStore, log: LogWriter
) -> None:
    line = "x" * 200_000 + "\n"
    process = await start([sys.executable, "-c", f"print('x' * {len(line) - 1})"])
    await process.wait()
    assert await log_text(store, log) == line


async def test_follow_streams_a_running_job_and_ends_when_the_log_closes(
    start: Start, store: DirLogStore, log: LogWriter, tmp_path: Path
) -> None:
    process = await start(
        ["sh", "-c", "echo first; while [ ! -e go ]; do sleep 0.02; done; echo second"]
    )
    follower = store.follow(RUN_ID, 2)
    assert await anext(follower) == b"first\n"
    (tmp_path / "go").touch()
    await process.wait()
    log.close()
    assert [data async for data in follower] == [b"second\n"]


async def test_stop_kills_the_job_and_its_grandchild(start: Start, tmp_path: Path) -> None:
    process = await start(["sh", "-c", "sleep 300 & echo $! > grandchild.pid; sleep 300"])
    grandchild = await read_pid(tmp_path / "grandchild.pid")
    assert process.pid is not None and process.pgid == process.pid
    await process.stop(GRACE)
    assert await process.wait() == ExitStatus(None, signal.SIGTERM)
    await all_gone(process.pid, grandchild)


async def test_a_grandchild_ignoring_sigterm_is_killed_after_the_grace(
    start: Start, tmp_path: Path
) -> None:
    # The grandchild writes its pid only once it ignores SIGTERM.
    grandchild_script = 'trap "" TERM; echo $$ > grandchild.pid; exec sleep 300'
    script = f"sh -c '{grandchild_script}' & sleep 300"
    process = await start(["sh", "-c", script], kill_grace=60)
    grandchild = await read_pid(tmp_path / "grandchild.pid")
    began = time.monotonic()
    await process.stop(GRACE)
    assert GRACE <= time.monotonic() - began < GRACE + 3
    assert await process.wait() == ExitStatus(None, signal.SIGTERM)  # the leader obeyed
    assert process.pid is not None
    await all_gone(process.pid, grandchild)


async def test_a_job_ignoring_sigterm_is_killed_after_the_grace(
    start: Start, tmp_path: Path
) -> None:
    script = 'trap "" TERM; sleep 300 & echo $! > grandchild.pid; sleep 300'
    process = await start(["sh", "-c", script])
    grandchild = await read_pid(tmp_path / "grandchild.pid")
    began = time.monotonic()
    await process.stop(GRACE)
    assert GRACE <= time.monotonic() - began < GRACE + 3
    assert await process.wait() == ExitStatus(None, signal.SIGKILL)
    assert process.pid is not None
    await all_gone(process.pid, grandchild)
    await process.stop(GRACE)  # idempotent
    process.kill_now()  # a no-op once ended


async def test_leftovers_are_stopped_when_the_job_exits(start: Start, tmp_path: Path) -> None:
    process = await start(["sh", "-c", "sleep 300 & echo $! > grandchild.pid; exit 4"])
    assert await process.wait() == ExitStatus(4, None)
    grandchild = await read_pid(tmp_path / "grandchild.pid")
    assert process.pid is not None
    await all_gone(process.pid, grandchild)


async def test_kill_now_kills_the_whole_group_at_once(start: Start, tmp_path: Path) -> None:
    process = await start(["sh", "-c", "sleep 300 & echo $! > grandchild.pid; sleep 300"])
    grandchild = await read_pid(tmp_path / "grandchild.pid")
    process.kill_now()
    assert await process.wait() == ExitStatus(None, signal.SIGKILL)
    assert process.pid is not None
    await all_gone(process.pid, grandchild)


async def test_concurrent_stops_are_one_stop(start: Start) -> None:
    process = await start(["sleep", "300"])
    await assert_eventually(lambda: process.pid is not None and live_group(process.pid))
    stops = [process.stop(GRACE), process.stop(GRACE)]
    for stop in stops:
        await stop
    assert await process.wait() == ExitStatus(None, signal.SIGTERM)


async def test_a_missing_program_exits_127_with_a_log_line(
    start: Start, store: DirLogStore, log: LogWriter
) -> None:
    process = await start(["/nonexistent/etcdsched-no-such-program", "arg"])
    assert (process.pid, process.pgid) == (None, None)
    assert await process.wait() == ExitStatus(127, None)
    await process.stop(GRACE)
    process.kill_now()
    text = await log_text(store, log)
    assert "cannot start /nonexistent/etcdsched-no-such-program arg" in text
    assert "No such file or directory" in text


async def test_a_missing_working_directory_is_reported_too(
    start: Start, store: DirLogStore, log: LogWriter, tmp_path: Path
) -> None:
    process = await start(["true"], cwd=str(tmp_path / "absent"))
    assert await process.wait() == ExitStatus(127, None)
    assert "absent" in await log_text(store, log)


async def test_shell_mode(start: Start, store: DirLogStore, log: LogWriter) -> None:
    process = await start(['echo "$((1 + 2))"'], shell=True)
    await process.wait()
    assert await log_text(store, log) == "3\n"


def test_shell_argv_is_quoted_unless_it_is_one_script() -> None:
    quoted = CommandExecution(argv=["echo", "a b", "$HOME"], shell=True)
    assert command_argv(quoted) == ["/bin/sh", "-c", "echo 'a b' '$HOME'"]
    script = CommandExecution(argv=["echo $HOME | wc -c"], shell=True)
    assert command_argv(script) == ["/bin/sh", "-c", "echo $HOME | wc -c"]
    plain = CommandExecution(argv=["echo", "$HOME"])
    assert command_argv(plain) == ["echo", "$HOME"]


def test_exit_status_from_returncode() -> None:
    assert ExitStatus.from_returncode(0) == ExitStatus(0, None)
    assert ExitStatus.from_returncode(2) == ExitStatus(2, None)
    assert ExitStatus.from_returncode(-9) == ExitStatus(None, 9)


async def test_noop_executor_starts_nothing(log: LogWriter) -> None:
    process = await NoopExecutor().start(make_run({"argv": ["true"]}), 1, "w", log)
    assert (process.pid, process.pgid) == (None, None)
    assert await process.wait() == ExitStatus(0, None)
    await process.stop(0)
    process.kill_now()


FAKE_RUNTIME = """\
import json, os, sys, time
args = sys.argv[1:]
keys = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "-e"]
record = {"argv": args, "env": {key: os.environ.get(key) for key in keys}}
with open(os.environ["FAKE_RUNTIME_OUT"], "a") as out:
    out.write(json.dumps(record) + "\\n")
print("hello from the container", flush=True)
if "sleepy" in args:
    time.sleep(300)
"""


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``docker`` on PATH that records its invocations (there is no engine here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_RUNTIME}")
    docker.chmod(0o755)
    out = tmp_path / "runtime.jsonl"
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_RUNTIME_OUT", str(out))
    return out


def invocations(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


RUNTIME_SANDBOX = as_this_user(allow=("FAKE_RUNTIME_OUT",))
"""The fake runtime finds its output file in the environment it is given."""


async def test_container_runs_through_the_runtime_cli(
    fake_docker: Path, store: DirLogStore, log: LogWriter
) -> None:
    execution = {"kind": "container", "image": "alpine:3", "args": ["echo", "hi"]}
    run = make_run({**execution, "env": {"JOB_VAR": "v"}})
    process = await ProcessExecutor(RUNTIME_SANDBOX).start(run, 2, "worker-7", log)
    assert await process.wait() == ExitStatus(0, None)
    [call] = invocations(fake_docker)
    name = f"etcdsched-job-1_{SLOT_MS:014d}-2"
    assert call["argv"][:4] == ["run", "--rm", "--name", name]
    assert call["argv"][-3:] == ["alpine:3", "echo", "hi"]
    assert call["env"]["JOB_VAR"] == "v"
    assert call["env"]["ETCDSCHED_RUN_ID"] == RUN_ID
    assert call["env"]["ETCDSCHED_ATTEMPT"] == "2"
    assert RUN_ID not in call["argv"]  # values travel in the environment, not argv
    assert await log_text(store, log) == "hello from the container\n"


async def test_stopping_a_container_also_removes_it(fake_docker: Path, log: LogWriter) -> None:
    run = make_run({"kind": "container", "image": "sleepy"})
    process = await ProcessExecutor(RUNTIME_SANDBOX).start(run, 1, "worker-7", log)
    await assert_eventually(lambda: invocations(fake_docker), timeout=5)
    await process.stop(GRACE)
    await process.wait()
    assert invocations(fake_docker)[-1]["argv"] == ["rm", "-f", f"etcdsched-job-1_{SLOT_MS:014d}-1"]


@pytest.mark.parametrize("runtime", ["auto", "podman"])
async def test_no_container_runtime_is_invalid_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: LogWriter, runtime: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    run = make_run({"kind": "container", "image": "alpine:3", "runtime": runtime})
    with pytest.raises(InvalidInput) as raised:
        await ProcessExecutor(as_this_user()).start(run, 1, "worker-7", log)
    assert raised.value.field == "execution.runtime"


async def test_a_job_waits_for_its_guard_and_never_runs_if_the_agent_dies_first(
    tmp_path: Path, log: LogWriter
) -> None:
    """The watchdog must know the process group before the job runs: the
    gate opens only after ``guard``; if the agent dies before that (here
    the guard raises), the gate reads end-of-file and the job never runs."""
    marker = tmp_path / "ran"
    guarded: list[int] = []
    run = make_run({"argv": ["touch", str(marker)], "cwd": str(tmp_path)})
    executor = ProcessExecutor(as_this_user())
    process = await executor.start(run, 2, "worker-7", log, guard=guarded.append)
    assert (await process.wait()).exit_code == 0 and marker.exists()
    assert guarded == [process.pgid]

    marker.unlink()

    def agent_dies(pgid: int) -> None:
        raise RuntimeError("killed between fork and go")

    with pytest.raises(RuntimeError):
        await ProcessExecutor(as_this_user()).start(run, 2, "worker-7", log, guard=agent_dies)
    await asyncio.sleep(0.5)
    assert not marker.exists()
