"""A multi-host deployment from plain processes (issue 30): every agent is
its own OS process with a home directory of its own, as if each ran on a
separate host. Nothing is shared between them but the etcd cluster and the
log store named by ``log_env`` (an S3 bucket in the tests), so a test that
passes here cannot lean on a shared disk.

Each host's home holds its agent's output (``<name>.log``), the directory
``ETCDSCHED_LOG_DIR`` points to (``runlogs``: it must stay empty when the
log store is a bucket) and its jobs' scratch directories. Leases are short
(``agent_env``: a 2 s TTL) so a killed worker is noticed within seconds.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from etcdsched.store.embedded import reserve_ports
from tests.support.procs import AgentProcess, agent_env

STOP_WAIT = 5.0
"""How long :meth:`Topology.close` lets the agents stop before SIGKILL."""


@dataclass
class Host:
    """One agent process and its private directory."""

    name: str
    role: str
    home: Path
    process: AgentProcess

    @property
    def log_dir(self) -> Path:
        """The agent's ``ETCDSCHED_LOG_DIR`` (as ``agent_env`` names it)."""
        return self.home / "runlogs"

    @property
    def alive(self) -> bool:
        proc = self.process.proc
        return proc is not None and proc.poll() is None

    def runs_as(self, worker_id: str) -> bool:
        """A worker's id in etcd is its member name, with ``.<n>`` appended
        when it had to start a new session (``WorkerService``): both are this host."""
        return worker_id == self.name or worker_id.startswith(f"{self.name}.")

    def local_files(self) -> list[Path]:
        """Every file under the local log directory (none is expected)."""
        if not self.log_dir.exists():
            return []
        return sorted(path for path in self.log_dir.rglob("*") if path.is_file())


class Topology:
    """Schedulers, workers and API agents as separate processes.

    ``close`` stops every process ever started (SIGTERM to all at once, then
    SIGKILL after :data:`STOP_WAIT`) and is safe to call twice."""

    def __init__(
        self, work_dir: Path, endpoints: list[str], prefix: str, log_env: dict[str, str]
    ) -> None:
        self.work_dir = work_dir
        self.endpoints = endpoints
        self.prefix = prefix
        self.log_env = log_env
        self.api_port = reserve_ports(1)[0]
        self.hosts: list[Host] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self, schedulers: int = 2, workers: int = 2) -> None:
        """All agents at once (their Python start-up overlaps), one API."""
        for i in range(schedulers):
            self._spawn(f"s{i + 1}", "scheduler")
        for i in range(workers):
            self._spawn(f"w{i + 1}", "worker")
        self._spawn("api1", "api", ETCDSCHED_API_PORT=str(self.api_port))

    def _spawn(self, name: str, role: str, **extra_env: str) -> Host:
        home = self.work_dir / name
        home.mkdir(parents=True)
        env = {**agent_env(self.endpoints, self.prefix, home), **self.log_env, **extra_env}
        env["ETCDSCHED_SHUTDOWN_GRACE"] = "1"  # teardown need not wait for jobs
        process = AgentProcess(name, [role], env, home)
        host = Host(name, role, home, process)
        self.hosts.append(host)  # before start: close() must see it even if start fails
        process.start()
        return host

    def by_role(self, role: str) -> list[Host]:
        return [host for host in self.hosts if host.role == role]

    def worker_running(self, worker_id: str) -> Host:
        """The worker host an attempt's ``worker`` field names."""
        found = [host for host in self.by_role("worker") if host.runs_as(worker_id)]
        assert len(found) == 1, f"no single worker host is {worker_id!r}: {self.hosts}"
        return found[0]

    def api_ready(self) -> bool:
        """``/readyz`` answers 200 (False while the API is not listening yet)."""
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def dead(self) -> list[str]:
        """Hosts whose agent exited (a test that killed none expects [])."""
        return [host.name for host in self.hosts if not host.alive]

    def tails(self, lines: int = 15) -> str:
        """The end of every agent's output: what to read when a test fails."""
        parts = [f"--- {h.name} ({h.role})\n{h.process.log_tail(lines)}" for h in self.hosts]
        return "\n".join(parts)

    def close(self) -> None:
        running = [h.process.proc for h in self.hosts if h.process.proc and h.alive]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + STOP_WAIT
        for proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
