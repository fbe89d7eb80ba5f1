"""What one mutation costs etcd's CPU, with and without prefix watchers
and per-op compares: a side measurement behind docs/adr/0020-benchmark-history.md's
analysis, not part of ``etcdsched bench``.

Starts its own single etcd (fsync off) on loopback, writes 128-put
transactions of 700-byte values (about a run record) over a ring of keys,
and reports etcd's user+system CPU per mutation with 0, 1 and 3
``etcdctl watch --prefix`` processes attached, each also with one
``exists`` compare per put. Run: ``.venv/bin/python scripts/etcd_cost_probe.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from pathlib import Path

from etcdsched.bench.env import cpu_seconds
from etcdsched.store.embedded import EtcdTuning, etcd_binary
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.etcd_cluster import EtcdCluster
from etcdsched.store.kv import Cmp, Ops

KEYS = 10_000
PER_TXN = 128


async def measure(store: EtcdStore, pid: int, label: str, seconds: float, compares: bool) -> None:
    value, done, i = b"x" * 700, 0, 0
    end, before = time.monotonic() + seconds, cpu_seconds(pid)
    while time.monotonic() < end:
        keys = [f"/probe/{(i + k) % KEYS:05d}" for k in range(PER_TXN)]
        checks = [Cmp.exists(k) for k in keys] if compares and i >= KEYS else []
        await store.txn(checks, [Ops.put(k, value) for k in keys])
        i, done = i + PER_TXN, done + PER_TXN
    used = cpu_seconds(pid) - before
    print(f"{label:48s} {done / seconds:8.0f} puts/s  etcd {used / done * 1e6:5.1f} µs/put")


async def main() -> None:
    with (
        tempfile.TemporaryDirectory() as work,
        EtcdCluster(Path(work), 1, tuning=EtcdTuning(unsafe_no_fsync=True)) as etcd,
    ):
        member = etcd.member(0)
        assert member.pid is not None
        store = await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd.endpoints)))
        try:
            await measure(store, member.pid, "warm-up", 3, False)
            for watchers in (0, 1, 3):
                await _with_watchers(store, member.pid, member.endpoint, watchers)
        finally:
            await store.close()


async def _with_watchers(store: EtcdStore, pid: int, endpoint: str, watchers: int) -> None:
    command = [str(etcd_binary("etcdctl")), "--endpoints", endpoint, "watch", "--prefix", "/probe/"]
    procs = [subprocess.Popen(command, stdout=subprocess.DEVNULL) for _ in range(watchers)]
    try:
        await asyncio.sleep(1)
        await measure(store, pid, f"128-put txns, {watchers} prefix watchers", 8, False)
        await measure(store, pid, "  + one exists-compare per put", 8, True)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    asyncio.run(main())
