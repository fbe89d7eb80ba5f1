"""Fault-injection run: real processes, random faults, then a history check.

Usage::

    python -m tests.faults.harness --duration 30m --seed 7 \
        [--report docs/reliability.md --covers "what this run is for"]

It starts, as OS processes on loopback, a 3-member etcd cluster, 3 scheduler
agents and 3 worker agents (4 slots each); creates recurring jobs (1-2 s
intervals, mixed misfire and overlap policies, failing, hanging and long
ones) and keeps adding one-off ``at`` jobs; injects a fault every 1-3 s
(see :mod:`tests.faults.faults`) for ``--duration``. Then it *quiesces*:
stops injecting, heals everything (resumes paused agents, restarts dead
ones and etcd members), pauses every job so no slot comes due, waits (at
most 60 s) until every run is terminal, reads everything back from etcd and
the job ledger, and runs :func:`tests.faults.checker.check_history`.

An agent that exits although no fault touched it is restarted under a new
name (as a supervisor would) and listed as an *unplanned exit* in the report.

The exit status is 0 when no violation was found, 1 otherwise (130 when
interrupted). Every process is stopped at the end, also on Ctrl-C, SIGTERM
or an error. The work dir is kept for digging into a violation:
``ledger.jsonl`` (what the jobs wrote), ``history.jsonl`` (every job, run and
skip record read back from etcd), ``faults.jsonl`` (what was injected, and
when), ``agents/*.log`` and the etcd data.

``--report docs/reliability.md`` keeps that page's shape: the new run becomes
its latest run, the one before becomes a row of its table, and the full
report goes to ``docs/reliability/runs/`` (see :mod:`tests.faults.report`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import etcdsched
from etcdsched.model.durations import parse_duration
from etcdsched.model.errors import EtcdschedError
from etcdsched.model.notify_records import Webhook
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.webhooks import WebhookStore
from tests.faults.checker import check_history
from tests.faults.collect import collect_history, dump_history, pause_all, wait_until
from tests.faults.faults import Injector
from tests.faults.fleet import Fleet
from tests.faults.report import RunInfo, RunOutcome, command_line, render_text, write_report
from tests.faults.webhook_check import TENANT_EVENTS, check_webhooks, read_received
from tests.faults.workload import WEBHOOK, Workload
from tests.support.ledgerfile import JOBSCRIPT
from tests.support.webhook_receiver import WebhookReceiver

log = logging.getLogger("tests.faults.harness")
PARTITIONS = 8  # what tests/support/procs.agent_env configures


@dataclass(frozen=True)
class HarnessConfig:
    duration_s: float
    seed: int
    work_dir: Path
    schedulers: int = 3
    workers: int = 3
    worker_slots: int = 4
    recurring_jobs: int = 12
    one_off_every_s: tuple[float, float] = (2.0, 4.0)
    quiesce_timeout_s: float = 60.0
    fire_backlog: int | None = None
    covers: str = ""
    """What the run is for, in a few words (the reliability page's table)."""
    jobs_as: str | None = None
    """Run the jobs as this user (the workers are root): fencing must reach
    process groups of another user. None: as the harness's own user."""


def run_harness(config: HarnessConfig, command: str = "") -> RunOutcome:
    """The whole run, blocking. Cleans up every process it started."""
    prefix = f"/faults-{config.seed}-{uuid.uuid4().hex[:6]}/"
    work_dir = config.work_dir.resolve()
    fleet = Fleet(
        work_dir,
        prefix,
        config.schedulers,
        config.workers,
        config.worker_slots,
        config.fire_backlog,
    )
    if config.jobs_as:
        fleet.agent_settings["worker_run_as"] = json.dumps({"*": config.jobs_as})
    info = RunInfo(config.seed, command, config.duration_s, str(work_dir), prefix)
    info.commit, info.covers = source_commit(), config.covers
    started = time.monotonic()
    try:
        outcome = asyncio.run(_drive(config, fleet, info))
    finally:
        fleet.close()
    info.total_s = time.monotonic() - started
    return outcome


def source_commit() -> str:
    """The commit of the etcdsched package under test (it may be a worktree
    on ``PYTHONPATH``), ``-dirty`` if the package differs from it; "" if
    that is not a git checkout."""
    package = Path(etcdsched.__file__).parent

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=package, capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short=7", "HEAD")
        changed = git("diff", "--quiet", "HEAD", "--", ".").returncode != 0
    except OSError:
        return ""
    if head.returncode != 0:
        return ""
    return head.stdout.strip() + ("-dirty" if changed else "")


async def _drive(config: HarnessConfig, fleet: Fleet, info: RunInfo) -> RunOutcome:
    await asyncio.to_thread(fleet.start_cluster)
    store = await EtcdStore.connect(EtcdOptions(endpoints=tuple(fleet.endpoints)))
    receiver = WebhookReceiver(record_path=fleet.work_dir / "webhooks.jsonl")
    try:
        keys, clock = Keys(fleet.prefix), SystemClock()
        await ensure_cluster(store, keys, PARTITIONS, clock.now_ms())
        info.etcd_version = await store.server_version()
        await _subscribe(store, keys, receiver)
        fleet.start_agents()
        await _wait_agents_ready(store, keys, config)
        jobs = JobService(store, keys, clock, PARTITIONS)
        ledger = fleet.work_dir / "ledger.jsonl"
        runner = _jobs_reach(fleet.work_dir, ledger) if config.jobs_as else None
        workload = Workload(ledger, random.Random(f"{config.seed}/workload"), runner)
        recurring = workload.recurring(config.recurring_jobs)
        for plan in recurring:
            await jobs.create(plan.spec, plan.job_id)
        info.recurring_jobs = len(recurring)
        injector = Injector(
            fleet, store, keys, jobs, workload, recurring, random.Random(config.seed)
        )
        info.injected_s = await _inject(config, injector, jobs, workload)
        return await _quiesce_and_check(config, fleet, store, keys, jobs, info, injector)
    finally:
        receiver.stop_thread()
        await store.close()


async def _subscribe(store: EtcdStore, keys: Keys, receiver: WebhookReceiver) -> None:
    """Start the receiver (on loopback, recording every POST) and write the
    tenant's webhook to it: the run outcomes of every job (their specs add
    skipped slots)."""
    receiver.start_thread()
    now = SystemClock().now_ms()
    hook = Webhook(
        tenant="default",
        name=WEBHOOK,
        url=receiver.url,
        events=frozenset(TENANT_EVENTS),
        secret="harness-signing-secret",
        allow_http=True,
        allow_private=True,
        created_ms=now,
        updated_ms=now,
    )
    await WebhookStore(store, keys).put(hook)


async def _wait_agents_ready(store: EtcdStore, keys: Keys, config: HarnessConfig) -> None:
    async def ready() -> bool:
        schedulers = await store.range(keys.members_prefix("schedulers"), count_only=True)
        workers = await store.range(keys.members_prefix("workers"), count_only=True)
        owners = await store.range(keys.owners_prefix(), count_only=True)
        return (schedulers.count, workers.count, owners.count) == (
            config.schedulers,
            config.workers,
            PARTITIONS,
        )

    if not await wait_until(ready, timeout=60):
        raise RuntimeError("agents did not register and own every partition within 60 s")
    log.info("agents ready")


async def _inject(
    config: HarnessConfig, injector: Injector, jobs: JobService, workload: Workload
) -> float:
    log.info("injecting faults for %.0f s", config.duration_s)
    started = time.monotonic()
    rng = random.Random(f"{config.seed}/one-offs")
    side = [
        asyncio.create_task(_create_one_offs(jobs, workload, rng, config.one_off_every_s)),
        asyncio.create_task(_progress(injector, started)),
    ]
    try:
        await injector.run(config.duration_s)
    finally:
        for task in side:
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)
        await injector.finish()
    return time.monotonic() - started


async def _create_one_offs(
    jobs: JobService, workload: Workload, rng: random.Random, every_s: tuple[float, float]
) -> None:
    while True:
        await asyncio.sleep(rng.uniform(*every_s))
        plan = workload.one_off(jobs.clock.now_ms())
        try:
            await jobs.create(plan.spec, plan.job_id)
        except EtcdschedError as exc:
            log.info("one-off %s not created: %s", plan.job_id, exc)


async def _progress(injector: Injector, started: float) -> None:
    while True:
        await asyncio.sleep(60)
        log.info("%.0f s: %d faults injected", time.monotonic() - started, len(injector.faults))


async def _quiesce_and_check(
    config: HarnessConfig,
    fleet: Fleet,
    store: EtcdStore,
    keys: Keys,
    jobs: JobService,
    info: RunInfo,
    injector: Injector,
) -> RunOutcome:
    injector.note_exits()
    info.healed = await asyncio.to_thread(fleet.heal)
    log.info("healed: %s", ", ".join(info.healed) or "nothing to do")
    quiesce_ms = await pause_all(store, keys, jobs)
    started = time.monotonic()

    async def all_terminal() -> bool:
        page = await store.range(f"{keys.prefix}active/", count_only=True)
        return page.count == 0

    if not await wait_until(all_terminal, timeout=config.quiesce_timeout_s):
        log.warning("runs still active after %.0f s", config.quiesce_timeout_s)

    async def outbox_empty() -> bool:
        page = await store.range(f"{keys.prefix}outbox/", count_only=True)
        return page.count == 0

    if not await wait_until(outbox_empty, timeout=config.quiesce_timeout_s):
        log.warning("webhook deliveries still pending after %.0f s", config.quiesce_timeout_s)
    info.quiesce_s = time.monotonic() - started
    info.etcd_replacements = fleet.etcd_replacements
    info.etcd_revisions = await asyncio.to_thread(_member_revisions, fleet)
    await asyncio.sleep(1.0)  # a zombie would write one more beat by now
    history, info.ledger_bad_lines = await collect_history(
        store, keys, fleet.work_dir / "ledger.jsonl", quiesce_ms, fleet.log_dir / "runlogs"
    )
    dump_history(history, fleet.work_dir / "history.jsonl")
    (fleet.work_dir / "runinfo.json").write_text(json.dumps(asdict(info)))  # for recheck
    with (fleet.work_dir / "faults.jsonl").open("w") as out:
        for fault in sorted([*injector.faults, *injector.exits], key=lambda f: f.at_s):
            out.write(json.dumps(asdict(fault)) + "\n")
    report = check_history(history)
    received = read_received(fleet.work_dir / "webhooks.jsonl")
    hooks = check_webhooks(history.runs, history.skips, received)
    report.violations += hooks.violations
    log.info("%s", hooks.summary())
    info.webhooks = hooks.summary().removeprefix("webhooks: ")
    return RunOutcome(info, report, injector.faults, injector.exits)


def _member_revisions(fleet: Fleet) -> list[int]:
    """Each etcd member's revision once writes have stopped; read a few times
    because a write landing between two status calls differs innocently."""
    revisions: list[int] = []
    for _ in range(5):
        time.sleep(1.0)
        revisions = [int(member.status()["header"]["revision"]) for member in fleet.cluster]
        if len(set(revisions)) == 1:
            break
    return revisions


# -- command line ------------------------------------------------------------------


def _duration(text: str) -> float:
    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _jobs_reach(work_dir: Path, ledger: Path) -> tuple[str, str]:
    """What jobs of another user need: the work dir to pass through, the
    ledger to append to, and a job script and interpreter they may read
    (the venv's lives under a private home)."""
    work_dir.chmod(0o711)
    ledger.touch(mode=0o666)
    ledger.chmod(0o666)
    script = work_dir / "jobscript.py"
    shutil.copy(JOBSCRIPT, script)
    script.chmod(0o644)
    return "/usr/bin/python3", str(script)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.harness",
        description="Fault-injection run against real etcd, scheduler and worker processes.",
    )
    parser.add_argument("--duration", type=_duration, default=_duration("30m"),
                        help="how long to inject faults: 90s, 3m, 30m (default 30m)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    parser.add_argument("--report", type=Path,
                        help="also write the report as Markdown here; a page with generated "
                        "blocks (docs/reliability.md) is updated in place")  # fmt: skip
    parser.add_argument("--covers", default="", metavar="TEXT",
                        help="what this run is for, for the page's table")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, help="default: a new temporary directory")
    parser.add_argument("--jobs-as", metavar="USER",
                        help="workers (root) run every job as this user, e.g. nobody")  # fmt: skip
    parser.add_argument("--fire-backlog", type=int, metavar="N",
                        help="schedulers hold firing at N fired runs unread by placement "
                        "(default 1,000; a small N keeps the firing brake engaged)")  # fmt: skip
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: FrameType | None) -> Any:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("tests.faults").setLevel(logging.INFO)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    signal.signal(signal.SIGTERM, _interrupt)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix=f"etcdsched-faults-{args.seed}-"))
    print(f"seed {args.seed}, duration {args.duration:.0f} s, work dir {work_dir}", flush=True)
    config = HarnessConfig(
        duration_s=args.duration,
        seed=args.seed,
        work_dir=work_dir,
        fire_backlog=args.fire_backlog,
        covers=args.covers,
        jobs_as=args.jobs_as,
    )
    try:
        outcome = run_harness(config, command_line(argv))
    except KeyboardInterrupt:
        print(f"interrupted: every process stopped; logs and ledger are in {work_dir}")
        return 130
    print(render_text(outcome), flush=True)
    if args.report is not None:
        for written in write_report(args.report, outcome):
            print(f"report written to {written}")
    return 0 if outcome.report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
