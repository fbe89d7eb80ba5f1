"""Scenario ``raw``: what this etcd and this client do without etcdsched.

Three measurements through the same client stack the agents use
(``EtcdStore`` over etcd3aio/grpc.aio, one connection): sequential single
puts, single puts with 64 in flight, and sequential transactions of 128 puts
(etcd's default ``--max-txn-ops`` is 128, so that is the largest allowed).
A "put" is a one-op transaction, which etcd applies like a plain put.
"""

from __future__ import annotations

import asyncio
import time

from etcdsched.bench.context import BenchContext
from etcdsched.bench.cpu import fleet_groups, per_unit_ms, sample
from etcdsched.bench.measure import summary
from etcdsched.bench.progress import note
from etcdsched.bench.results import ScenarioResult, Table
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Ops, Store

PLAN = (  # (label, transactions in flight, puts per transaction)
    ("sequential single puts", 1, 1),
    ("single puts, 64 in flight", 64, 1),
    ("128-put transactions, sequential", 1, 128),
)
KEY_SPACE = 10_000  # keys are overwritten in a ring, so the database stays small


async def measure_puts(
    store: Store, keys: Keys, value: bytes, in_flight: int, ops_per_txn: int, seconds: float
) -> dict[str, float]:
    """Send transactions of ``ops_per_txn`` puts from ``in_flight`` loops for
    ``seconds``; txns/s, puts/s and per-transaction latency."""
    latencies: list[float] = []
    end = time.monotonic() + seconds

    async def loop(worker: int) -> None:
        i = 0
        while time.monotonic() < end:
            ops = [
                Ops.put(f"{keys.prefix}raw/{worker:03d}/{(i + k) % KEY_SPACE:05d}", value)
                for k in range(ops_per_txn)
            ]
            i += ops_per_txn
            sent = time.monotonic()
            await store.txn([], ops)
            latencies.append((time.monotonic() - sent) * 1000)

    started = time.monotonic()
    await asyncio.gather(*(loop(w) for w in range(in_flight)))
    elapsed = time.monotonic() - started
    lat = summary(latencies)
    return {
        "txns_per_s": len(latencies) / elapsed,
        "puts_per_s": len(latencies) * ops_per_txn / elapsed,
        "p50_ms": lat.get("p50", 0.0),
        "p99_ms": lat.get("p99", 0.0),
    }


async def run(ctx: BenchContext) -> ScenarioResult:
    opts = ctx.options
    keys = ctx.new_keys("raw")
    value = b"x" * opts.raw_value_bytes
    store = await ctx.connect()
    plan = PLAN
    rows = []
    measured: dict[str, dict[str, float]] = {}
    try:
        groups = fleet_groups(ctx.etcd_pid)
        for label, in_flight, per_txn in plan:
            note(f"raw: {label} for {opts.raw_seconds:g}s")
            before = sample(groups)
            m = await measure_puts(store, keys, value, in_flight, per_txn, opts.raw_seconds)
            puts = round(m["puts_per_s"] * (time.monotonic() - before.wall_s))
            cpu = per_unit_ms(before, sample(groups), puts)
            measured[label] = {**m, "etcd_cpu_ms": cpu["etcd"], "client_cpu_ms": cpu["benchmark"]}
            rows.append(
                [label, in_flight, per_txn, m["txns_per_s"], m["puts_per_s"], m["p50_ms"],
                 m["p99_ms"], 1000 * cpu["etcd"], 1000 * cpu["benchmark"]]
            )  # fmt: skip
    finally:
        await store.close()
        await ctx.store.txn([], [Ops.delete_prefix(keys.prefix)])
    columns = ["measurement", "in flight", "puts/txn", "txns/s", "puts/s", "p50 ms", "p99 ms",
               "etcd CPU µs/put", "client CPU µs/put"]  # fmt: skip
    return ScenarioResult(
        name="raw",
        title="Raw etcd baseline (same etcd, same client, same run)",
        params={"seconds_each": opts.raw_seconds, "value_bytes": opts.raw_value_bytes},
        tables=[Table("etcd alone", columns, rows)],
        metrics={
            "put1_per_s": measured[plan[0][0]]["puts_per_s"],
            "put64_per_s": measured[plan[1][0]]["puts_per_s"],
            "txn128_per_s": measured[plan[2][0]]["txns_per_s"],
            "put64_etcd_cpu_ms": measured[plan[1][0]]["etcd_cpu_ms"],
            "put64_client_cpu_ms": measured[plan[1][0]]["client_cpu_ms"],
        },
        notes=[
            f"Values are {opts.raw_value_bytes} bytes (a run record is about 1.1 KB). "
            "Latency is per transaction as the client sees it.",
            "The Python client (grpc.aio) is part of what is measured: on a 2-core machine "
            "it, not etcd, may be the limit for the 64-in-flight rate.",
            "CPU is user + system time of the etcd process and of the benchmark (the "
            "client) over each measurement, per put.",
        ],
    )
