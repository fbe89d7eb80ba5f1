"""Where the CPU goes: user + system time of each process group (etcd, the
schedulers, the workers, the benchmark itself) between two instants, per
unit of work. A throughput that misses its target is then explained by
milliseconds of CPU per run against the machine's budget, not guessed at."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

from etcdsched.bench.env import Fleet, cpu_seconds
from etcdsched.bench.progress import note

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


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_BUSY = 0.1
"""etcd is idle when it used less than this share of a core in a window."""
SETTLE_WINDOW_S = 1.0


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy so far, every core and
    process together (user, nice, system, irq and softirq of /proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
        user, nice, system, _idle, _iowait, irq, softirq = map(int, fields)
    except (OSError, ValueError):
        return 0.0
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


async def etcd_settled(etcd_pid: int, max_s: float) -> float:
    """Wait until etcd is idle, so work done before (a scenario's, a
    compaction, a large delete) is not charged to what is measured next.
    Returns the seconds waited, at most ``max_s``."""
    began = time.monotonic()
    while time.monotonic() - began < max_s:
        before = cpu_seconds(etcd_pid)
        await asyncio.sleep(SETTLE_WINDOW_S)
        if cpu_seconds(etcd_pid) - before < SETTLE_BUSY * SETTLE_WINDOW_S:
            break
    else:
        note(f"etcd still busy after {max_s:.0f} s; going on")
    return time.monotonic() - began


def others_cores(before: CpuSample, after: CpuSample, machine_s: float) -> float:
    """Cores that processes outside the samples' groups kept busy on average
    between the two samples, the machine having been busy ``machine_s``."""
    wall = max(after.wall_s - before.wall_s, 1e-9)
    return max(0.0, machine_s / wall - per_unit_ms(before, after, 1)["cores"])
