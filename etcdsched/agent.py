"""An agent process: any subset of the roles scheduler, worker and api,
sharing one etcd connection. ``etcdsched up`` is an agent with all roles on
top of a private single-member etcd.

The first SIGTERM/SIGINT stops the agent gracefully: it says at once on
stderr what it waits for; the scheduler and the API stop at once (the
scheduler revokes its lease, so its partitions are free for another at
once); the worker drains (takes nothing new, hands back what has not
started, lets running jobs finish within ``shutdown_grace``). A second
signal, or the grace running out, stops the running jobs: each attempt is
recorded ``interrupted`` (reason ``interrupted by shutdown``) and retried
at once. Then the worker's lease is revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from etcdsched.config import Config
from etcdsched.logs.factory import log_store_from_url
from etcdsched.logs.store import DirLogStore
from etcdsched.model.errors import Conflict
from etcdsched.runtime.clock import SystemClock
from etcdsched.runtime.metrics_server import serve_metrics
from etcdsched.scheduler.service import SchedulerService, ensure_cluster
from etcdsched.store.embedded import COMPACT_EVERY, EtcdMember, EtcdTuning
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.etcd_auth import secure_embedded_etcd
from etcdsched.store.keys import Keys
from etcdsched.store.lease_renewer import BlockingRenewer
from etcdsched.store.session import Renewer, RenewerFactory
from etcdsched.worker.executor import Executor, NoopExecutor, ProcessExecutor
from etcdsched.worker.sandbox import Sandbox
from etcdsched.worker.service import WorkerService
from etcdsched.worker.starter import ThreadStarter

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)
ROLES = frozenset({"scheduler", "worker", "api"})


def make_executor(config: Config) -> Executor:
    """``noop`` exists for benchmarks only: it starts nothing and succeeds.
    Real jobs are contained as the config says (whom they run as, where,
    with which environment), and the agent says so once at start."""
    if config.executor == "noop":
        return NoopExecutor()
    sandbox = Sandbox.from_config(config)
    sandbox.scratch.prepare_root()  # a scratch root we cannot use fails the start, not each job
    run_as = sandbox.run_as
    contained = run_as.can_switch and not run_as.runs_root_jobs()
    log.log(logging.INFO if contained else logging.WARNING, "%s", run_as.describe())
    return ProcessExecutor(sandbox)


def renewer_factory(config: Config) -> RenewerFactory:
    """Connects a session's renewal thread to the same etcd (ADR 0005)."""

    async def connect() -> Renewer:
        return BlockingRenewer(config.etcd_options())

    return connect


class StopRequests:
    """What the agent was asked to do about stopping. The first SIGTERM or
    SIGINT (or ``graceful`` set by whoever embeds the agent) asks for a
    graceful stop; a second one to stop the running jobs now, not after
    the grace: a user pressing Ctrl-C twice means it."""

    def __init__(self, graceful: asyncio.Event | None = None) -> None:
        self.graceful = graceful or asyncio.Event()
        self.now = asyncio.Event()
        self.signal: str | None = None
        """The signal that asked for the graceful stop, if one did."""

    def install(self) -> None:
        """Take SIGTERM/SIGINT. Only the main thread can: an agent run on
        another thread (embedded) is stopped through ``graceful`` instead."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.received, signum)

    def received(self, signum: int) -> None:
        if not self.graceful.is_set():
            self.signal = signal.Signals(signum).name
            self.graceful.set()
        elif not self.now.is_set():
            say("stopping: stopping the running jobs now")
            self.now.set()

    def again_hint(self) -> str:
        """How to ask a second time, in the words of the first asking."""
        if self.signal == "SIGINT":
            return "; press Ctrl-C again to stop them now"
        if self.signal is not None:
            return f"; send {self.signal} again to stop them now"
        return ""


def say(line: str) -> None:
    """One line for whoever stopped the agent, on stderr at once, whatever
    the log level: a stop that waits must say what for."""
    print(line, file=sys.stderr, flush=True)


def stopping_line(jobs: int, grace: float, hint: str) -> str:
    if jobs == 0:
        return "stopping: no job is running"
    noun = "job" if jobs == 1 else "jobs"
    return f"stopping: waiting for {jobs} running {noun}, up to {grace:g} s{hint}"


async def run_agent(
    config: Config,
    roles: set[str],
    stop: asyncio.Event | None = None,
    ready: Callable[[], None] | None = None,
) -> None:
    """Run the roles until ``stop`` is set or SIGTERM/SIGINT arrives (see
    the module docstring for what a first and a second signal do).
    ``ready`` is called once every role runs and the API listens."""
    _check_roles(config, roles)
    requests = StopRequests(stop)
    requests.install()
    _watch_children_with_pidfds()
    store = await EtcdStore.connect(config.etcd_options())
    keys, clock = Keys(config.prefix), SystemClock()
    try:
        meta = await ensure_cluster(store, keys, config.partitions, clock.now_ms())
        logs = log_store_from_url(config.log_store, config.log_dir, **config.log_store_options())
        if isinstance(logs, DirLogStore):
            logs.make_private()
        worker = None
        tasks: dict[str, asyncio.Task[None]] = {}
        if "scheduler" in roles:
            renewal = renewer_factory(config)
            scheduler = SchedulerService(config, store, keys, clock, logs, renewal)
            tasks["scheduler"] = asyncio.create_task(scheduler.run(), name="scheduler")
        if "worker" in roles:
            executor = make_executor(config)
            renewal = renewer_factory(config)
            worker = WorkerService(
                config, store, keys, clock, executor, logs, None, renewal, ThreadStarter()
            )
            tasks["worker"] = asyncio.create_task(worker.run(), name="worker")
        runners = []
        if "api" in roles:
            from etcdsched.api.app import serve_api

            runners.append(await serve_api(config, store, keys, clock, meta.partitions, logs))
        if config.metrics_port is not None:
            runners.append(await serve_metrics(config.metrics_host, config.metrics_port))
        log.info("agent %s running roles %s", config.member_id, sorted(roles))
        if ready is not None:
            ready()
        await _until_stopped(requests.graceful, list(tasks.values()))
        jobs = worker.started_jobs() if worker is not None else 0
        say(stopping_line(jobs, config.shutdown_grace, requests.again_hint()))
        await _stop_roles(requests, tasks, worker, runners)
        await logs.aclose()  # the last chunks of an object store's logs go up
    finally:
        await store.close()


def _check_roles(config: Config, roles: set[str]) -> None:
    unknown = roles - ROLES
    if unknown or not roles:
        raise ValueError(f"roles must be a non-empty subset of {sorted(ROLES)}")
    if "worker" in roles and config.worker_tenants is None:
        raise ValueError(
            "a worker must say whose runs it takes: ETCDSCHED_WORKER_TENANTS='[\"team-a\"]'"
            " (or '[\"*\"]' for every tenant)"
        )


async def _stop_roles(
    requests: StopRequests,
    tasks: dict[str, asyncio.Task[None]],
    worker: WorkerService | None,
    runners: list[web.AppRunner],
) -> None:
    """The scheduler and the API stop at once, while the worker drains:
    neither has anything to finish, and a scheduler that revokes its lease
    now frees its partitions for the others now. The worker stops last."""
    scheduler = tasks.pop("scheduler", None)
    quick: list[asyncio.Future[None]] = []
    if scheduler is not None:
        scheduler.cancel()
        quick.append(scheduler)
    quick += [asyncio.ensure_future(runner.cleanup()) for runner in runners]
    if worker is not None:
        await worker.drain(requests.now)
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*quick, *tasks.values(), return_exceptions=True)


async def _until_stopped(stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
    """Wait for the stop signal; a role that crashes stops the agent."""
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([waiter, *tasks], return_when="FIRST_COMPLETED")
    waiter.cancel()
    for task in done:
        if task is not waiter and task.exception() is not None:
            log.error("role %s crashed", task.get_name(), exc_info=task.exception())


def start_embedded_etcd(data_dir: Path, client_port: int, peer_port: int) -> EtcdMember:
    """The private single-member etcd of ``etcdsched up``, on fixed loopback
    ports so a restart finds its data and its peers' URLs unchanged."""
    data_dir.mkdir(parents=True, exist_ok=True)
    member = EtcdMember(
        "etcdsched",
        data_dir / "etcd",
        client_port,
        peer_port,
        tuning=EtcdTuning(compact_every=COMPACT_EVERY, quota_backend_bytes=4 * 1024**3),
    )
    member.start()
    member.wait_ready(timeout=30)
    return member


async def run_up(config: Config, data_dir: Path, etcd: str | None = None) -> None:
    """``etcdsched up``: embedded etcd (unless ``etcd`` names a cluster), an
    admin token on first start (written to ``<data_dir>/admin.token``), and
    one agent with every role."""
    member = None
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)  # the agent's alone: etcd, tokens, passwords, logs
    settings: dict[str, object] = {}
    if "log_dir" not in config.model_fields_set:  # a log dir set by flag, env or file wins
        settings["log_dir"] = data_dir / "logs"
    if config.worker_tenants is None:
        settings["worker_tenants"] = ["*"]  # one user's laptop: every tenant
    if etcd is None:
        member = start_embedded_etcd(
            data_dir, config.embedded_client_port, config.embedded_peer_port
        )
        etcd = member.endpoint
        credentials = secure_embedded_etcd(etcd, data_dir, config.prefix)
        settings |= {"etcd_user": credentials.user, "etcd_password_file": credentials.password_file}
    config = config.model_copy(update={"etcd": etcd, **settings})
    try:
        await _ensure_admin_token(config, data_dir)
        banner = up_banner(config, data_dir)
        await run_agent(config, set(ROLES), ready=lambda: print(banner, flush=True))
    finally:
        if member is not None:
            member.stop()


def up_banner(config: Config, data_dir: Path) -> str:
    """What ``up`` prints on stdout once its API listens: where to point a
    client, where its token and its data are, and how to stop it."""
    scheme = "https" if config.api_tls_cert is not None else "http"
    host = f"[{config.api_host}]" if ":" in config.api_host else config.api_host
    token_file = data_dir / "admin.token"
    token = str(token_file) if token_file.exists() else "none (see the log above)"
    return (
        f"etcdsched is up\n"
        f"  API          {scheme}://{host}:{config.api_port}\n"
        f"  admin token  {token}\n"
        f"  data         {data_dir}\n"
        f"  Ctrl-C stops it (running jobs get {config.shutdown_grace:g} s to finish)"
    )


async def _ensure_admin_token(config: Config, data_dir: Path) -> None:
    token_file = data_dir / "admin.token"
    if token_file.exists():
        return
    from etcdsched.api.auth import create_admin_token

    store = await EtcdStore.connect(config.etcd_options())
    try:
        secret = await create_admin_token(store, Keys(config.prefix))
    except Conflict as exc:  # the file was removed; the cluster's first token is made
        log.warning("no %s, and no new one: %s", token_file, exc.message)
        return
    finally:
        await store.close()
    token_file.touch(mode=0o600)
    token_file.write_text(secret + "\n")
    log.info("admin token written to %s", token_file)


def _allow_open_files() -> None:
    """Raise the soft open-files limit to the hard one: a worker keeps one
    log file open per run it has claimed, and a burst placed ahead can
    claim thousands."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


GC_THRESHOLDS = (10_000, 20, 20)
"""Young-generation collections every 10,000 allocations instead of 700,
and a full one every 400 of those."""


def _collect_garbage_rarely() -> None:
    """A full collection walks every tracked object and holds the GIL for
    it: 50-90 ms in a busy worker on this project's benchmark machine, four
    times a minute at 100 jobs/s, each one a start that late. The objects of
    startup (modules, classes) are frozen out of the collections, and the
    collections run less often."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _watch_children_with_pidfds() -> None:
    """Python 3.11 waits for each job process on a thread of its own; a
    worker starting 100 jobs a second then starts 100 threads a second, and
    their wake-ups compete with the event loop for the GIL. A pidfd watcher
    waits in the event loop (Linux >= 5.3; 3.12+ does this by itself).
    Called on the running loop, which it watches for."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return  # the kernel has no pidfds: keep the default
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)


def main(roles: list[str], config: Config | None = None) -> None:
    """Process entry point: config from ``ETCDSCHED_*``; logs to stderr."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _allow_open_files()
    _collect_garbage_rarely()
    asyncio.run(run_agent(config or Config(), set(roles)))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:] or sorted(ROLES))
