"""The processes of a fault-injection run: a 3-member etcd cluster and
scheduler and worker agents, all real OS processes on loopback.

Everything here is synchronous (``subprocess`` and signals); the harness calls
the slow parts (waiting for etcd health) through ``asyncio.to_thread``.
:meth:`Fleet.close` stops every process it ever started and is safe to call
more than once, from a ``finally`` after Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from etcdsched.store.embedded import COMPACT_EVERY, EtcdMember, EtcdTuning
from etcdsched.store.etcd_cluster import EtcdCluster
from tests.support.procs import AgentProcess, agent_env

log = logging.getLogger(__name__)
ETCD_TUNING = EtcdTuning(unsafe_no_fsync=True, compact_every=COMPACT_EVERY)
"""Compacts like ``etcdsched up`` (ADR 0015), so watches and listings that
a compaction overtakes are part of what the faults exercise."""


@dataclass
class AgentSlot:
    """One agent position (``s1``, ``w2``...). Every restart is a new
    process under a new member name (``w2-r2``): a name must not be reused
    while the old incarnation's lease may still be alive."""

    base: str
    role: str
    generation: int = 0
    process: AgentProcess | None = None
    paused: bool = False
    busy: bool = False
    """A fault is acting on this agent; no other fault may pick it."""
    retired: list[AgentProcess] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.base if self.generation <= 1 else f"{self.base}-r{self.generation}"

    @property
    def alive(self) -> bool:
        proc = self.process.proc if self.process else None
        return proc is not None and proc.poll() is None


class Fleet:
    def __init__(
        self,
        work_dir: Path,
        prefix: str,
        schedulers: int,
        workers: int,
        worker_slots: int,
        fire_backlog: int | None = None,
    ) -> None:
        """``fire_backlog``: the schedulers' firing brake limit (ADR 0014),
        small to keep the brake engaged under faults; None: the default."""
        self.work_dir = work_dir
        self.prefix = prefix
        self.log_dir = work_dir / "agents"
        self.agent_settings: dict[str, object] = {"worker_slots": worker_slots}
        if fire_backlog is not None:
            self.agent_settings["fire_backlog"] = fire_backlog
        self.cluster = EtcdCluster(work_dir / "etcd", size=3, tuning=ETCD_TUNING)
        self.agents = [AgentSlot(f"s{i + 1}", "scheduler") for i in range(schedulers)]
        self.agents += [AgentSlot(f"w{i + 1}", "worker") for i in range(workers)]
        self.etcd_down: int | None = None
        """Index of the etcd member deliberately down (at most one at a time)."""
        self.etcd_replacements = 0
        """Killed members brought back empty (member remove + add)."""
        self._closed = False

    @property
    def endpoints(self) -> list[str]:
        return self.cluster.endpoints

    # -- starting ----------------------------------------------------------------
    def start_cluster(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.cluster.start()

    def start_agents(self) -> None:
        for slot in self.agents:
            self.spawn(slot)

    def spawn(self, slot: AgentSlot) -> AgentProcess:
        """Start the slot's next incarnation under a fresh name."""
        slot.generation += 1
        env = agent_env(self.endpoints, self.prefix, self.log_dir, **self.agent_settings)
        slot.process = AgentProcess(slot.name, [slot.role], env, self.log_dir).start()
        slot.paused = False
        return slot.process

    def by_role(self, role: str) -> list[AgentSlot]:
        return [s for s in self.agents if s.role == role]

    # -- faults ------------------------------------------------------------------
    def kill9(self, slot: AgentSlot) -> None:
        if slot.process is not None:
            with contextlib.suppress(ProcessLookupError):
                slot.process.kill9()
            slot.retired.append(slot.process)
        slot.process = None
        slot.paused = False

    def pause(self, slot: AgentSlot) -> None:
        assert slot.process is not None
        slot.process.stop_signal()
        slot.paused = True

    def resume(self, slot: AgentSlot) -> None:
        if slot.process is not None and slot.paused:
            with contextlib.suppress(ProcessLookupError):
                slot.process.cont_signal()
        slot.paused = False

    def etcd_member(self, index: int) -> EtcdMember:
        return self.cluster.member(index)

    def kill_etcd(self, index: int) -> None:
        self.etcd_down = index
        self.cluster.member(index).kill()

    def restart_etcd(self, index: int, timeout: float = 20.0) -> None:
        """Bring a killed member back as an empty replacement that catches up
        from the leader (see :meth:`EtcdCluster.replace_member` for why: etcd
        3.5.1 may restart a member killed under load with writes missing)."""
        member = self.cluster.member(index)
        if not member.alive:
            self.cluster.replace_member(index, timeout)
            self.etcd_replacements += 1
        member.wait_ready(timeout)
        self.etcd_down = None

    # -- healing and stopping ----------------------------------------------------
    def heal(self) -> list[str]:
        """Resume paused agents, restart dead ones, make every etcd member
        healthy. Returns what it had to do."""
        actions = []
        for slot in self.agents:
            if slot.paused:
                self.resume(slot)
                actions.append(f"resumed {slot.name}")
            if not slot.alive:
                self.kill9(slot)
                actions.append(f"restarted {slot.name} as {self.spawn(slot).name}")
        down = [m.name for m in self.cluster if m.paused or not m.alive]
        for index, member in enumerate(self.cluster):
            if not member.alive:
                self.restart_etcd(index)
        self.cluster.heal()
        self.etcd_down = None
        actions += [f"restarted etcd {name}" for name in down]
        return actions

    def close(self) -> None:
        """Stop everything: agents first (SIGCONT + SIGTERM in parallel, then
        SIGKILL after a grace period), then the etcd cluster."""
        if self._closed:
            return
        self._closed = True
        running = [s.process for s in self.agents if s.process is not None]
        for process in running:
            with contextlib.suppress(ProcessLookupError, AssertionError):
                process.cont_signal()
                assert process.proc is not None
                process.proc.terminate()
        for process in running:
            try:
                process.terminate(timeout=8)
            except Exception:  # keep stopping the rest
                log.exception("stopping agent %s", process.name)
        for slot in self.agents:
            for process in [*slot.retired, *([slot.process] if slot.process else [])]:
                if process.proc is not None and process.proc.poll() is None:
                    process.proc.kill()
        try:
            self.cluster.stop()
        except Exception:
            log.exception("stopping etcd")
            for member in self.cluster:
                with contextlib.suppress(Exception):
                    member.kill()

    def agent_logs(self) -> list[Path]:
        return sorted(self.log_dir.glob("*.log"))

    def restart_exited(self) -> list[tuple[str, str]]:
        """Agents that exited although no fault touched them (a supervisor
        such as systemd would restart them, and so do we, under a new name).
        Returns ``(name, why)`` for each: exit status and last log line."""
        found = []
        for slot in self.agents:
            if slot.busy or slot.process is None or slot.alive:
                continue
            process = slot.process
            tail = process.log_tail(1).strip()[:200]
            why = f"exit status {process.proc.returncode if process.proc else '?'}: {tail}"
            self.kill9(slot)
            found.append((slot.name, f"{why}; restarted as {self.spawn(slot).name}"))
        return found
