"""Check a finished fault-injection run again from its work dir.

Usage::

    python -m tests.faults.recheck WORK_DIR [--report docs/reliability.md] \
        [--covers TEXT] [--commit SHA]

Reads what the harness left behind once every process was gone:
``history.jsonl`` (every job, run and skip record read from etcd after
quiesce), archived runs under ``agents/runlogs/*/archive.jsonl``,
``ledger.jsonl``, ``faults.jsonl`` and ``runinfo.json`` (the run's
description), and runs the same checker. Job processes still alive and
capacity still held after quiesce cannot be observed any more: the recheck
leaves those two out, so the first check's notes on them stand. Use it when
the checker or the collector is fixed after a long run, and say so
(``--covers``). On ``docs/reliability.md`` the recheck of the latest run
replaces it (its report file has the same name); a recheck of an older run
makes it the latest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from etcdsched.model.records import JobRecord, RunRecord, SkipRecord
from tests.faults.checker import History, check_history
from tests.faults.collect import archived_runs
from tests.faults.faults import Fault
from tests.faults.report import RunInfo, RunOutcome, render_text, write_report
from tests.support.ledgerfile import read_ledger_tolerant


def load_history(work_dir: Path) -> History:
    jobs, runs, skips = [], [], []
    window: dict[str, Any] = {"until_ms": {}, "quiesce_ms": 0}
    for line in (work_dir / "history.jsonl").read_text().splitlines():
        item = json.loads(line)
        kind, record = item["type"], item["record"]
        if kind == "job":
            jobs.append(JobRecord.model_validate(record))
        elif kind == "run":
            runs.append(RunRecord.model_validate(record))
        elif kind == "skip":
            skips.append(SkipRecord.model_validate(record))
        else:
            window = record
    stored = {run.id: run for run in runs}  # an archive line repeated in the old history
    for run in archived_runs(work_dir / "agents" / "runlogs"):
        stored.setdefault(run.id, run)
    ledger, _ = read_ledger_tolerant(work_dir / "ledger.jsonl")
    return History(
        jobs=jobs,
        runs=list(stored.values()),
        skips=skips,
        until_ms=window["until_ms"],
        quiesce_ms=window["quiesce_ms"],
        ledger=ledger,
    )


def load_faults(work_dir: Path) -> tuple[list[Fault], list[Fault]]:
    """Injected faults, and agents that exited on their own."""
    lines = (work_dir / "faults.jsonl").read_text().splitlines()
    every = [Fault(**json.loads(line)) for line in lines if line.strip()]
    exits = [f for f in every if f.kind == "agent_exited"]
    return [f for f in every if f.kind != "agent_exited"], exits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.recheck")
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--report", type=Path, help="also write the report as Markdown here")
    parser.add_argument("--covers", help="what the run is for (default: as the harness had it)")
    parser.add_argument("--commit", help="the commit it ran on, if its runinfo.json lacks it")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    info = RunInfo(**json.loads((args.work_dir / "runinfo.json").read_text()))
    if args.covers is not None:
        info.covers = args.covers
    if args.commit is not None:
        info.commit = args.commit
    report = check_history(load_history(args.work_dir))
    faults, exits = load_faults(args.work_dir)
    outcome = RunOutcome(info, report, faults, exits)
    print(render_text(outcome), flush=True)
    if args.report is not None:
        for written in write_report(args.report, outcome):
            print(f"report written to {written}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
