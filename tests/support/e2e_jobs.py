"""Helpers for end-to-end policy tests: building specs, waiting for runs,
reading skip records and ledger files, and checking the explained ledger."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from etcdsched.model.records import RunRecord, SkipRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState
from etcdsched.store.ledger import LedgerReport, account
from etcdsched.worker.service import WorkerService
from tests.support.eventually import assert_eventually
from tests.support.ledgerfile import read_ledger
from tests.support.services import Services, full_id


def spec(trigger: Mapping[str, object], argv: list[str], **extra: object) -> JobSpec:
    return JobSpec.model_validate({"trigger": dict(trigger), "execution": {"argv": argv}, **extra})


def every_second(**extra: object) -> dict[str, object]:
    return {"kind": "interval", "every": "1s", **extra}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


def next_whole_second_ms(margin_ms: int = 600) -> int:
    """A whole second at least ``margin_ms`` from now (a shared interval start)."""
    return (now_ms() + margin_ms) // 1000 * 1000 + 1000


async def wait_until_ms(instant_ms: int, timeout: float = 15.0) -> None:
    """Let wall-clock time pass ``instant_ms`` (e.g. slots coming due during a
    deliberate downtime): the condition is the clock itself."""

    def passed() -> None:
        assert now_ms() >= instant_ms, f"{instant_ms - now_ms()} ms to go"

    await assert_eventually(passed, timeout=timeout)


def start_worker(services: Services, name: str, **overrides: object) -> WorkerService:
    """A worker whose lease outlives the event-loop stalls of a loaded host
    (these tests are about policies, not lease loss: the fault tests are)."""
    overrides.setdefault("lease_ttl", 5)
    return services.start_worker(name, None, **overrides)


async def skips_of(services: Services, job_id: str) -> list[SkipRecord]:
    page = await services.store.range(services.keys.skips_prefix(full_id(job_id)))
    return [kv.decode(SkipRecord).value for kv in page.kvs]


async def wait_runs(
    services: Services,
    job_id: str,
    check: Callable[[list[RunRecord]], bool],
    timeout: float = 10.0,
) -> list[RunRecord]:
    """The job's runs once ``check(runs)`` holds."""

    async def holds() -> list[RunRecord]:
        runs = await services.runs_of(job_id)
        assert check(runs), f"runs are {[_short(r) for r in runs]}"
        return runs

    result: list[RunRecord] = await assert_eventually(holds, timeout=timeout)
    return result


async def wait_state(
    services: Services, run_id: str, *states: RunState, timeout: float = 10.0
) -> RunRecord:
    async def reached() -> RunRecord:
        run = await services.run_of(run_id)
        assert run.state in states, _short(run)
        return run

    result: RunRecord = await assert_eventually(reached, timeout=timeout)
    return result


def _short(run: RunRecord) -> str:
    return f"{run.id} {run.state} attempt={run.attempt} reason={run.reason!r}"


def terminal(runs: Iterable[RunRecord]) -> bool:
    return all(r.state.terminal for r in runs)


async def ledger_ok(services: Services, job_id: str, until_ms: int | None = None) -> LedgerReport:
    """Every slot of the job (before its next due slot, or ``until_ms`` for a
    job with no slot left) is explained by exactly one run or skip record."""
    report = await account(services.store, services.keys, full_id(job_id), until_ms)
    assert report.ok, report
    return report


def intervals(ledger: Path) -> dict[str, tuple[dict[str, Any], dict[str, Any] | None]]:
    """(start, end-or-None) ledger lines per ``run#attempt``."""
    out: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    for line in read_ledger(ledger):
        key = f"{line['run']}#{line['attempt']}"
        if line["event"] == "start":
            out[key] = (line, None)
        else:
            out[key] = (out[key][0], line)
    return out


def max_concurrency(spans: Iterable[tuple[float, float]]) -> int:
    """The most spans open at one instant (an end at t closes before a start at t)."""
    events = sorted(
        [(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans],
        key=lambda e: (e[0], e[1]),
    )
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


async def only_run(services: Services, job_id: str, timeout: float = 10.0) -> str:
    [run] = await wait_runs(services, job_id, lambda rs: len(rs) == 1, timeout=timeout)
    return run.id


async def workers_registered(services: Services, count: int) -> None:
    """Registered in etcd *and* seen by every scheduler's worker cache (a
    retry placed before the cache saw the second worker has one choice)."""

    async def registered() -> None:
        page = await services.store.range(services.keys.members_prefix("workers"))
        assert len(page.kvs) == count
        for scheduler in services.schedulers.values():
            assert len(scheduler.workers.items) == count

    await assert_eventually(registered, timeout=5)
