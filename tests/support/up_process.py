"""``etcdsched up`` and the ``etcdsched`` CLI as real processes, for the
README tour and the security tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from etcdsched.store.embedded import reserve_ports


class Tour:
    """``etcdsched up`` and the CLI as a user runs them: real processes in
    ``workdir`` on reserved loopback ports, stopped (SIGCONT first) at close."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        client, peer, api = reserve_ports(3)
        self.etcd = f"127.0.0.1:{client}"
        self.env = {
            **os.environ,
            "ETCDSCHED_EMBEDDED_CLIENT_PORT": str(client),
            "ETCDSCHED_EMBEDDED_PEER_PORT": str(peer),
            "ETCDSCHED_LEASE_TTL": "2",
            "ETCDSCHED_LOOKAHEAD_MS": "300",
            "ETCDSCHED_RECONCILE_EVERY": "0.5",
            "ETCDSCHED_URL": f"http://127.0.0.1:{api}",
        }
        self.api_port = api
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(
        self, *args: str, env: dict[str, str] | None = None, stderr_apart: bool = False
    ) -> subprocess.Popen[bytes]:
        """Start ``etcdsched <args>``; its output goes to ``proc-<n>.log``,
        and with ``stderr_apart`` its stderr to ``proc-<n>.err`` (read them
        with :meth:`stdout` and :meth:`stderr`)."""
        n = len(self.procs)
        log = (self.workdir / f"proc-{n}.log").open("wb")
        err = (self.workdir / f"proc-{n}.err").open("wb") if stderr_apart else subprocess.STDOUT
        proc = subprocess.Popen(
            [sys.executable, "-m", "etcdsched", *args],
            cwd=self.workdir,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=err,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def stdout(self, proc: subprocess.Popen[bytes]) -> str:
        """What ``proc`` wrote so far to stdout (and stderr, unless kept apart)."""
        return self._read(proc, "log")

    def stderr(self, proc: subprocess.Popen[bytes]) -> str:
        """What ``proc``, spawned with ``stderr_apart``, wrote so far to stderr."""
        return self._read(proc, "err")

    def _read(self, proc: subprocess.Popen[bytes], suffix: str) -> str:
        path = self.workdir / f"proc-{self.procs.index(proc)}.{suffix}"
        return path.read_text(errors="replace") if path.exists() else ""

    def cli(self, *args: str) -> str:
        """The CLI as the README's user runs it, with the URL of this ``up``
        (its port is not the default, so the token goes with it, as the
        README says for that case)."""
        token_file = self.workdir / ".etcdsched" / "admin.token"
        token = {"ETCDSCHED_TOKEN": token_file.read_text().strip()} if token_file.exists() else {}
        result = subprocess.run(
            [sys.executable, "-m", "etcdsched", *args],
            cwd=self.workdir,
            env={**self.env, **token},
            capture_output=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout.decode()

    def json(self, *args: str) -> Any:
        return json.loads(self.cli("-o", "json", *args))

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.api_port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def close(self) -> None:
        """SIGTERM each process still running; a second SIGTERM to any
        still waiting for its jobs after 2 s (an agent then stops them
        now), SIGKILL after 20 s."""
        live = [proc for proc in self.procs if proc.poll() is None]
        for proc in live:
            os.killpg(proc.pid, signal.SIGCONT)
            proc.terminate()
        for second in (False, True):
            for proc in live:
                try:
                    proc.wait(18 if second else 2)
                except subprocess.TimeoutExpired:
                    if second:
                        proc.kill()
                    else:
                        proc.terminate()
