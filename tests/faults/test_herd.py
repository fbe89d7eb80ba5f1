"""A herd of real processes due at one instant on one worker (issue 28's
must-show, at CI size): the worker admits only what it can start, keeps its
lease while it forks the herd, and when it is killed mid-herd the runs it
never started go back to the queue without using an attempt, while the
ones it did start are ``lost`` and rerun; only the few caught between
their ``running`` mark and their gate opening (at most the start window)
are recorded ``lost`` without having run. Every job runs; no attempt runs
twice.

The start path is made deliberately narrow (``worker_start_window`` 8) so
that most of the herd is still waiting, assigned but unclaimed, when the
worker dies."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState
from etcdsched.runtime.clock import SystemClock
from etcdsched.scheduler.service import ensure_cluster
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import prefix_end
from tests.support.eventually import assert_eventually
from tests.support.procs import AgentProcess, agent_env

pytestmark = pytest.mark.slow
P = 8
HERD = 1500
WINDOW = 8
APPEND = 'echo "$ETCDSCHED_RUN_ID $ETCDSCHED_ATTEMPT $ETCDSCHED_WORKER_ID" >> "$0"'


def herd_spec(at_ms: int, ledger: Path) -> JobSpec:
    return JobSpec.model_validate(
        {
            "trigger": {"kind": "at", "at": ms_to_utc(at_ms)},
            "execution": {"argv": ["/bin/sh", "-c", APPEND, str(ledger)]},
            "retry": {"max_attempts": 2, "initial_delay": "0s", "jitter": 0},
        }
    )


async def create_herd(jobs: JobService, at_ms: int, ledger: Path) -> None:
    spec = herd_spec(at_ms, ledger)
    for first in range(0, HERD, 100):
        await asyncio.gather(*(jobs.create(spec, f"herd-{i}") for i in range(first, first + 100)))


async def all_runs(store: EtcdStore, keys: Keys) -> list[RunRecord]:
    page = await store.range(keys.runs_prefix(), prefix_end(keys.runs_prefix()))
    return [kv.decode(RunRecord).value for kv in page.kvs]


def ledger_lines(ledger: Path) -> list[tuple[str, int, str]]:
    if not ledger.exists():
        return []
    rows = (line.split() for line in ledger.read_text().splitlines() if line.strip())
    return [(run, int(attempt), worker) for run, attempt, worker in rows]


async def test_a_worker_killed_mid_herd_requeues_what_it_never_started(
    store: EtcdStore,
    keys: Keys,
    etcd_endpoints: list[str],
    tmp_path: Path,
    agents: dict[str, AgentProcess],
) -> None:
    clock = SystemClock()
    await ensure_cluster(store, keys, P, clock.now_ms())
    env = agent_env(
        etcd_endpoints, keys.prefix, tmp_path, worker_slots=HERD, worker_start_window=WINDOW
    )
    agents["s1"] = AgentProcess("s1", ["scheduler"], env, tmp_path).start()
    agents["w1"] = AgentProcess("w1", ["worker"], env, tmp_path).start()
    jobs = JobService(store, keys, clock, P)
    ledger = tmp_path / "ledger"
    at_ms = clock.now_ms() + 8000
    await create_herd(jobs, at_ms, ledger)
    claims_seen = []

    async def a_fifth_started() -> None:
        claims = await store.range(keys.claims_prefix(), prefix_end(keys.claims_prefix()))
        claims_seen.append(claims.count)
        assert len(ledger_lines(ledger)) >= HERD // 5

    await assert_eventually(a_fifth_started, timeout=60, interval=0.2)
    members = await store.range(keys.members_prefix("workers"), keys_only=True)
    assert [kv.key.rsplit("/", 1)[-1] for kv in members.kvs] == ["w1"]  # first session held
    agents["w1"].kill9()
    killed_ms = clock.now_ms()
    agents["w2"] = AgentProcess("w2", ["worker"], env, tmp_path).start()

    async def all_ended() -> list[RunRecord]:
        runs = await all_runs(store, keys)
        assert len(runs) == HERD and all(r.state.terminal for r in runs), Counter(
            r.state for r in runs
        )
        return runs

    runs = await assert_eventually(all_ended, timeout=120, interval=1.0)
    launches = Counter((run, attempt) for run, attempt, _ in ledger_lines(ledger))
    assert max(launches.values()) == 1, "an attempt ran twice"
    # claims live from the claim to the report: the window, plus the jobs
    # started and not yet reported; never the herd
    assert max(claims_seen) <= 10 * WINDOW, f"claims ran ahead of starts: {max(claims_seen)}"
    requeued, lost_unstarted = 0, 0
    for run in runs:
        assert run.state is RunState.SUCCEEDED, run
        for attempt in run.attempts:
            ran = (run.id, attempt.number) in launches
            if attempt.state is RunState.LOST:
                lost_unstarted += not ran
            else:
                assert ran and attempt.state is RunState.SUCCEEDED, (run.id, attempt)
        # handed back by recovery: its attempt on w1 was undone, w2 ran attempt 1
        requeued += [(a.number, a.worker) for a in run.attempts] == [(1, "w2")]
    # only a run caught between its running mark and its gate opening is
    # recorded lost without having run (ADR 0021): at most the start window
    assert lost_unstarted <= WINDOW, f"{lost_unstarted} runs lost that never started"
    print(
        f"herd of {HERD}: killed w1 at +{killed_ms - at_ms} ms; {requeued} runs requeued;"
        f" {lost_unstarted} lost unstarted; at most {max(claims_seen)} claims at once"
    )
    assert requeued >= HERD // 2  # most of the herd was waiting, unclaimed, and used no attempt
