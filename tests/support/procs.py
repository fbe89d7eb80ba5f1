"""Agents as real OS processes, for fault tests (kill -9, SIGSTOP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path


class AgentProcess:
    """``python -m etcdsched.agent <roles>`` configured through ETCDSCHED_* env."""

    def __init__(self, name: str, roles: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.roles = roles
        self.env = {**os.environ, **env, "ETCDSCHED_MEMBER_ID": name}
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "etcdsched.agent", *self.roles],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop_signal(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def cont_signal(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def terminate(self, timeout: float = 10) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.pid, signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


AS_THIS_USER = json.dumps({"*": str(os.geteuid())})
"""``worker_run_as`` of the suite's agents: their jobs write ledgers in
pytest's private temporary directories, so they run as the test's own user.
tests/security runs jobs as other users (the default mapping)."""


def agent_env(endpoints: list[str], prefix: str, log_dir: Path, **extra: object) -> dict[str, str]:
    env = {
        "ETCDSCHED_ETCD": ",".join(endpoints),
        "ETCDSCHED_PREFIX": prefix,
        "ETCDSCHED_PARTITIONS": "8",
        "ETCDSCHED_LEASE_TTL": "2",
        "ETCDSCHED_LOOKAHEAD_MS": "300",
        "ETCDSCHED_RECONCILE_EVERY": "0.5",
        "ETCDSCHED_LOG_DIR": str(log_dir / "runlogs"),
        "ETCDSCHED_SHUTDOWN_GRACE": "15",
        "ETCDSCHED_WORKER_RUN_AS": AS_THIS_USER,
        "ETCDSCHED_WORKER_TENANTS": '["*"]',
        "ETCDSCHED_SCRATCH_DIR": str(log_dir / "scratch"),
    }
    env.update({f"ETCDSCHED_{k.upper()}": str(v) for k, v in extra.items()})
    return env


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie (this sandbox's init does not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
