"""What the benchmark runs on and with: machine facts, versions, agent
processes (``python -m etcdsched.agent``) and their memory and CPU from /proc."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_info() -> dict[str, Any]:
    """CPU count and model, memory, kernel, and the load when the run began
    (the machine is shared: a high load average makes every number noisier)."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(_meminfo_kb("MemTotal") / 1024**2, 1),
        "kernel": platform.release(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _meminfo_kb(field: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def versions(etcd_server: str) -> dict[str, str]:
    try:
        ours = importlib.metadata.version("etcdsched")
    except importlib.metadata.PackageNotFoundError:
        ours = "unknown"
    found = {"etcdsched": ours, "etcd": etcd_server, "python": platform.python_version()}
    commit = source_commit(Path(__file__).resolve().parents[1])
    return {**found, "commit": commit} if commit else found


def source_commit(package_dir: Path) -> str:
    """The git commit the package was run from, ``+dirty`` when its files
    differ from it; empty unless the package's own files are tracked there
    (an installed wheel, even in a venv inside a checkout, names none). The
    version number alone does not tell two benchmark runs of the same
    release apart."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(package_dir), *args],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        if not git("ls-files", "--", "__init__.py"):  # e.g. a wheel in a venv inside a checkout
            return ""
        commit = git("rev-parse", "--short", "HEAD")
        dirty = bool(commit) and bool(git("status", "--porcelain", "--", "."))
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{commit}+dirty" if dirty else commit


def proc_status_kb(pid: int, field: str) -> int | None:
    """A ``kB`` field of /proc/<pid>/status (``VmRSS``, ``VmHWM``), or None."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class Agent:
    """One agent process, configured through ``ETCDSCHED_*`` variables. It
    gets its own session, so signals for it never reach the benchmark."""

    name: str
    roles: tuple[str, ...]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Agent:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "etcdsched.agent", *self.roles],
                env={**os.environ, **self.env, "ETCDSCHED_MEMBER_ID": self.name},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "agent not started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL the agent alone (a crash): its watchdog and jobs live on."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (graceful), then SIGKILL of the whole process group."""
        if self.proc is None:
            return
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # leftovers of the group (watchdog)

    def rss_kb(self) -> tuple[int | None, int | None, int]:
        """(VmRSS, VmHWM) of the agent, and VmRSS of it plus its descendants."""
        rss, hwm = proc_status_kb(self.pid, "VmRSS"), proc_status_kb(self.pid, "VmHWM")
        tree = (rss or 0) + sum(proc_status_kb(p, "VmRSS") or 0 for p in descendants(self.pid))
        return rss, hwm, tree

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


class Fleet:
    """The agents of one scenario; :meth:`stop_all` ends every one of them."""

    def __init__(self, base_env: dict[str, str], log_dir: Path) -> None:
        self.base_env = base_env
        self.log_dir = log_dir
        self.agents: dict[str, Agent] = {}

    def spawn(self, name: str, roles: tuple[str, ...], **env: object) -> Agent:
        extra = {f"ETCDSCHED_{k.upper()}": str(v) for k, v in env.items()}
        agent = Agent(name, roles, {**self.base_env, **extra}, self.log_dir / f"{name}.log")
        self.agents[name] = agent.start()
        return agent

    def stop_all(self) -> None:
        for agent in self.agents.values():
            if agent.alive:
                assert agent.proc is not None
                agent.proc.terminate()
        for agent in self.agents.values():
            agent.stop()

    def crashed(self) -> list[str]:
        """Agents that exited on their own (not killed by the benchmark)."""
        return [a.name for a in self.agents.values() if a.proc and a.proc.poll() not in (None, -9)]
