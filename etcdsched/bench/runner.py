"""Runs the selected scenarios against a private etcd and writes the results.

One single-member etcd for the whole run (fsync on, as users run it,
unless ``--unsafe-no-fsync``; said on the report), a fresh key prefix per scenario. A
scenario that fails is recorded with its error and the others still run;
the results file is rewritten after every scenario, so an interrupted run
keeps what it measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from etcdsched.bench import (
    SCENARIOS,
    batch_create,
    failover,
    lag,
    memory,
    midnight,
    raw,
    scan,
    soak,
    throughput,
    ui_render,
)
from etcdsched.bench.context import BenchContext
from etcdsched.bench.cpu import SETTLE_BUSY, SETTLE_WINDOW_S, etcd_settled
from etcdsched.bench.env import machine_info, versions
from etcdsched.bench.options import BenchOptions
from etcdsched.bench.progress import note
from etcdsched.bench.report import render
from etcdsched.bench.results import ScenarioResult, write_results
from etcdsched.store.embedded import COMPACT_EVERY, EtcdTuning, can_skip_fsync
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.etcd_cluster import EtcdCluster

Scenario = Callable[[BenchContext], Awaitable[ScenarioResult]]
RUNNERS: dict[str, Scenario] = {
    "raw": raw.run,
    "throughput": throughput.run,
    "idle-lag": lag.run_idle,
    "burst": lag.run_burst,
    "midnight": midnight.run_midnight,
    "scan": scan.run,
    "memory": memory.run,
    "failover": failover.run,
    "soak": soak.run,
    "batch": batch_create.run,
    "ui": ui_render.run,
}
QUOTA_BYTES = 8 * 1024**3  # a million stored jobs take ~3 GB before compaction


def main(options: BenchOptions) -> int:
    """Run the benchmark; 0 if every scenario completed.

    SIGTERM is turned into KeyboardInterrupt like Ctrl-C, so the scenarios'
    ``finally`` blocks stop their agents and the etcd member: a benchmark
    killed by ``timeout`` or ``pkill`` once left a scheduler burning a CPU."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return asyncio.run(run_all(options))


def _meta(options: BenchOptions) -> dict[str, Any]:
    return {
        "command": options.command_line,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "fsync": options.fsync,
        "reduced": options.reduced,
        "smoke": options.smoke,
        "deviations": options.deviations(),
        "options": {k: v for k, v in dataclasses.asdict(options).items() if k != "extra"},
    }


def _work_dir(options: BenchOptions) -> Path:
    """Where etcd's data and the agents' logs go. The etcd is private to this
    run: a data dir left by an earlier run with the same ``--data-dir`` would
    hand its keys to this run's prefixes, so it is wiped."""
    if options.data_dir is None:
        return Path(tempfile.mkdtemp(prefix="etcdsched-bench-"))
    for stale in ("etcd", "agents"):
        shutil.rmtree(options.data_dir / stale, ignore_errors=True)
    return options.data_dir


TMPFS = Path("/dev/shm")


def _etcd_dir(options: BenchOptions, work_dir: Path) -> tuple[Path, str]:
    """Where etcd keeps its data, and how fsync is off (empty: it is on).
    etcd 3.4 has no ``--unsafe-no-fsync`` (ADR 0023): its data then goes
    on tmpfs, where a sync costs nothing, which is the same trade (a crash
    of the machine loses it)."""
    if options.fsync:
        return work_dir / "etcd", ""
    if can_skip_fsync():
        return work_dir / "etcd", "--unsafe-no-fsync"
    if not TMPFS.is_dir():
        raise SystemExit("etcd 3.4 has no --unsafe-no-fsync and there is no /dev/shm")
    return Path(tempfile.mkdtemp(prefix="etcdsched-bench-etcd-", dir=TMPFS)), "data on tmpfs"


def _tuning(options: BenchOptions) -> EtcdTuning:
    return EtcdTuning(
        unsafe_no_fsync=not options.fsync,
        quota_backend_bytes=QUOTA_BYTES,
        compact_every=COMPACT_EVERY,
    )


async def run_all(options: BenchOptions) -> int:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results_path = options.out_dir / f"{stamp}.json"
    work_dir = _work_dir(options)
    meta = _meta(options)
    if options.reduced:
        note("reduced sizes (smoke): " + ("; ".join(options.deviations()) or "--smoke"))
    note(f"etcd {'with' if options.fsync else 'WITHOUT'} fsync; work dir {work_dir}")
    results: list[ScenarioResult] = []
    etcd_dir, meta["fsync_off_by"] = _etcd_dir(options, work_dir)
    try:
        with EtcdCluster(etcd_dir, 1, tuning=_tuning(options), name_prefix="bench") as etcd:
            store = await EtcdStore.connect(EtcdOptions(endpoints=tuple(etcd.endpoints)))
            try:
                meta["versions"] = versions(await store.server_version())
                pid = etcd.member(0).pid or 0
                ctx = BenchContext(options, etcd.endpoints, store, work_dir, pid)
                await _run_selected(ctx, meta, results, results_path)
            finally:
                await store.close()
    finally:
        if options.data_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
        if etcd_dir.is_relative_to(TMPFS):
            shutil.rmtree(etcd_dir, ignore_errors=True)
    note(f"results: {results_path}")
    note(f"report: {render(meta, results, options.docs, source=results_path)}")
    return 1 if any(r.error for r in results) else 0


async def _run_selected(
    ctx: BenchContext, meta: dict[str, Any], results: list[ScenarioResult], path: Path
) -> None:
    selected = [s for s in SCENARIOS if s in ctx.options.scenarios]
    for name in selected:
        note(f"=== scenario {name}")
        settled_after = await etcd_settled(ctx.etcd_pid, SETTLE_MAX_S)
        started = time.monotonic()
        try:
            result = await RUNNERS[name](ctx)
        except Exception as exc:  # one broken scenario must not lose the others
            note(f"scenario {name} failed: {exc!r}")
            detail = "".join(traceback.format_exception(exc)[-6:])
            result = ScenarioResult(name=name, title=name, error=f"{exc!r}\n{detail}")
        result.seconds = time.monotonic() - started
        if settled_after > 2 * SETTLE_WINDOW_S:
            result.notes.append(
                f"Started after waiting {settled_after:.0f} s for etcd to settle"
                " from the scenario before (its CPU under"
                f" {SETTLE_BUSY:.0%} of a core for {SETTLE_WINDOW_S:.0f} s)."
            )
        ctx.results[name] = result
        results.append(result)
        meta["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        write_results(path, meta, results)


SETTLE_MAX_S = 300.0
