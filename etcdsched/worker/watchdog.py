"""Self-fencing that works while the agent is frozen or dead
(docs/design.md, "Claims and fencing").

A worker whose lease may have expired must not let its jobs run on: a new
attempt may already be running elsewhere. But a frozen agent (SIGSTOP, a
long pause) cannot kill anything, so the killing is done by this tiny
separate process, started with ``python -m etcdsched.worker.watchdog`` in its own
session (so signals aimed at the agent's process group do not reach it).

Protocol: one command per line on the watchdog's stdin (ASCII)::

    deadline <float>       kill every guarded group once time.monotonic() passes it
    add <pgid>             guard this process group
    add <pgid> <float>     guard it, and kill it alone once time.monotonic()
                           passes its own deadline (its hang deadline)
    remove <pgid>          stop guarding it (the job ended)

Deadlines are ``time.monotonic()`` instants: CLOCK_MONOTONIC is system-wide
on Linux, so the agent and the watchdog read the same clock, and wall-clock
steps do not matter. The agent moves the deadline forward on every
successful lease keep-alive (lease TTL minus a safety margin). When the
deadline passes, the watchdog SIGKILLs every guarded group and forgets it;
a group added while the deadline is past is killed at once. A group's own
deadline is its job's hang deadline (docs/design.md, "Claims and
fencing"): the agent's loop kills a job at its timeout, and if that loop is
stalled, this kills it before recovery's hung verdict can start a rerun. So
a stalled loop costs no job its life unless the job's time is up or the
lease may expire. On EOF (the
agent exited or was killed, even with ``kill -9``) it kills every guarded
group and exits. Nothing is guarded until the first ``deadline``.

The script side uses only the standard library and never imports the rest
of etcdsched, so it starts fast and cannot be broken by the agent's code.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

_CLOSE_TIMEOUT = 5.0
_READ_SIZE = 4096
_MAX_LINE = 256


# --- the watchdog process ---------------------------------------------------


def _say(message: str) -> None:
    """Log to stderr without ever raising: the agent (and its stderr pipe)
    may be gone, and a watchdog that dies on EPIPE would kill nothing."""
    with contextlib.suppress(OSError):
        os.write(2, f"etcdsched-watchdog[{os.getpid()}]: {message}\n".encode())


class _Guard:
    """The watchdog's state: the deadline and the guarded process groups."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.groups: set[int] = set()
        self.own_deadlines: dict[int, float] = {}
        """Groups that also die alone at their own (hang) deadline."""
        self._own_group = os.getpgrp()

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def seconds_left(self) -> float | None:
        """How long ``select`` may block: until the next deadline (the
        shared one or a group's own), or for input only when none is ahead."""
        ahead = list(self.own_deadlines.values())
        if self.deadline is not None and not self.expired():
            ahead.append(self.deadline)
        if not ahead:
            return None
        return max(min(ahead) - time.monotonic(), 0.0)

    def handle(self, line: bytes) -> None:
        try:
            command, *values = line.decode("ascii").split()
            if command == "deadline" and len(values) == 1:
                self.deadline = _finite(values[0])
            elif command == "add" and len(values) in (1, 2):
                self._add(int(values[0]), _finite(values[1]) if len(values) == 2 else None)
            elif command == "remove" and len(values) == 1:
                self.groups.discard(int(values[0]))
                self.own_deadlines.pop(int(values[0]), None)
            else:
                raise ValueError(command)
        except (UnicodeDecodeError, ValueError):
            _say(f"ignoring bad command {line[:_MAX_LINE]!r}")

    def enforce(self) -> None:
        if self.groups and self.expired():
            self.kill_all("fenced: the agent could not prove its lease by the deadline")
        now = time.monotonic()
        for pgid, deadline in list(self.own_deadlines.items()):
            if now >= deadline:
                self._kill(pgid, "its hang deadline passed (the agent did not stop it)")
                self.groups.discard(pgid)
                del self.own_deadlines[pgid]

    def kill_all(self, why: str) -> None:
        for pgid in sorted(self.groups):
            self._kill(pgid, why)
        self.groups.clear()
        self.own_deadlines.clear()

    def _add(self, pgid: int, own_deadline: float | None) -> None:
        if pgid <= 1 or pgid == self._own_group:
            raise ValueError(f"refusing to guard process group {pgid}")
        if self.expired():
            self._kill(pgid, "added after the deadline")
            return
        self.groups.add(pgid)
        if own_deadline is not None:
            self.own_deadlines[pgid] = own_deadline

    @staticmethod
    def _kill(pgid: int, why: str) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except PermissionError:
            _say(f"not allowed to kill process group {pgid}")
            return
        _say(f"killed process group {pgid}: {why}")


def _finite(text: str) -> float:
    value = float(text)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(text)
    return value


def serve(fd: int = 0) -> int:
    """Run the watchdog on the command stream ``fd`` until EOF."""
    guard = _Guard()
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            if selector.select(guard.seconds_left()):
                data = os.read(fd, _READ_SIZE)
                if not data:
                    guard.kill_all("agent gone (EOF)")
                    return 0
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    guard.handle(line)
                pending = pending[-_MAX_LINE:]
            guard.enforce()


# --- the agent's side -------------------------------------------------------


class Watchdog:
    """Client of the watchdog process, used by the agent.

    Every call is one small non-blocking pipe write, cheap enough for the
    keep-alive path and safe from any thread. The client remembers the
    deadline and the groups, so if the watchdog has died it is restarted
    (once per call) and told everything again; a call never raises for a
    dead watchdog, it logs.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._deadline: float | None = None
        self._groups: dict[int, float | None] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        with self._lock:
            if self._proc is None:
                self._closed = False
                self._spawn()

    def feed(self, deadline: float) -> None:
        """Kill the guarded groups once ``time.monotonic()`` passes ``deadline``."""
        with self._lock:
            self._deadline = deadline
            self._send(f"deadline {deadline!r}")

    def add(self, pgid: int, own_deadline: float | None = None) -> None:
        """Guard ``pgid``; with ``own_deadline`` (a ``time.monotonic()``
        instant), also kill it alone once that passes."""
        with self._lock:
            self._groups[pgid] = own_deadline
            self._send(_add_command(pgid, own_deadline))

    def remove(self, pgid: int) -> None:
        with self._lock:
            self._groups.pop(pgid, None)
            self._send(f"remove {pgid}")

    def close(self) -> None:
        """Stop the watchdog; it kills the groups still guarded, then exits."""
        with self._lock:
            proc, self._proc = self._proc, None
            self._closed = True
            if proc is None:
                return
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(_CLOSE_TIMEOUT)
            except subprocess.TimeoutExpired:
                log.error("watchdog %d did not exit; killing it", proc.pid)
                proc.kill()
                proc.wait()

    def _spawn(self) -> None:
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "etcdsched.worker.watchdog"],
            stdin=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
            env=env,
        )
        assert self._proc.stdin is not None
        os.set_blocking(self._proc.stdin.fileno(), False)

    def _send(self, line: str) -> None:
        if self._closed:
            log.debug("watchdog closed; not sending %r", line)
            return
        if self._proc is None:
            raise RuntimeError("Watchdog.start() was not called")
        if self._write(f"{line}\n"):
            return
        returncode = self._proc.poll() if self._proc is not None else None
        log.warning("watchdog is not running (exit status %s); restarting it", returncode)
        try:
            self._restart()
        except OSError:
            log.exception("cannot restart the watchdog: job processes are not fenced")

    def _restart(self) -> None:
        """Start a new watchdog and replay the state (the old one, if it is
        still around, gets EOF and exits)."""
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
        self._spawn()
        replay = [f"deadline {self._deadline!r}\n"] if self._deadline is not None else []
        replay += [f"{_add_command(pgid, d)}\n" for pgid, d in sorted(self._groups.items())]
        if replay and not self._write("".join(replay)):
            log.error("the restarted watchdog refuses commands: job processes are not fenced")

    def _write(self, text: str) -> bool:
        """False if the watchdog is gone (so the caller restarts it). A full
        pipe means a stuck watchdog: that is logged, not retried."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.closed or proc.poll() is not None:
            return False
        data = text.encode("ascii")
        try:
            written = proc.stdin.write(data)
        except (BrokenPipeError, ValueError):
            return False
        except BlockingIOError:
            written = None
        if written != len(data):
            log.error("watchdog %d is not reading its commands; dropped %r", proc.pid, text)
        return True


def _add_command(pgid: int, own_deadline: float | None) -> str:
    return f"add {pgid}" if own_deadline is None else f"add {pgid} {own_deadline!r}"


if __name__ == "__main__":
    sys.exit(serve())
