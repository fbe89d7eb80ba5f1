"""Where the CPU goes: user + system time of each process group (etcd, the
schedulers, the workers, the benchmark itself) between two instants, per
unit of work. A throughput that misses its target is then explained by
milliseconds of CPU per run against the machine's budget, not guessed at."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from etcdsched.bench.env import Fleet, cpu_seconds

Groups = dict[str, list[int]]
"""Process ids by group name."""


@dataclass(frozen=True)
class CpuSample:
    wall_s: float
    seconds: dict[str, float]
    """CPU seconds used so far, per group."""


def sample(groups: Groups) -> CpuSample:
    used = {group: sum(map(cpu_seconds, pids)) for group, pids in groups.items()}
    return CpuSample(time.monotonic(), used)


def fleet_groups(etcd_pid: int, fleet: Fleet | None = None) -> Groups:
    """etcd, the agents by role (a process with both roles counts as a
    scheduler), and this process: the benchmark's client and counters."""
    groups: Groups = {"etcd": [etcd_pid]}
    for agent in fleet.agents.values() if fleet is not None else ():
        role = "scheduler" if "scheduler" in agent.roles else agent.roles[0]
        groups.setdefault(role, []).append(agent.pid)
    groups["benchmark"] = [os.getpid()]
    return groups


def per_unit_ms(before: CpuSample, after: CpuSample, units: int) -> dict[str, float]:
    """Milliseconds of CPU per unit for each group, their ``total``, and
    ``cores``: how many cores were busy on average over the interval."""
    used = {g: after.seconds[g] - before.seconds.get(g, 0.0) for g in after.seconds}
    wall = max(after.wall_s - before.wall_s, 1e-9)
    shares = {g: 1000 * s / max(units, 1) for g, s in used.items()}
    return {**shares, "total": sum(shares.values()), "cores": sum(used.values()) / wall}
