"""Rendering a fault-injection run: plain text for the terminal, Markdown for
``--report FILE`` (e.g. ``docs/reliability.md``). Both show the same
sections; the Markdown one adds the full fault log."""

from __future__ import annotations

import os
import platform
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

import etcdsched
from tests.faults.checker import VIOLATION_KINDS, HistoryReport, Percentiles
from tests.faults.faults import Fault

Rows = list[tuple[str, str]]
METRICS = [
    "- *rerun after lost*: for every attempt recorded `lost`, the next attempt's ledger "
    "`start` minus the lost attempt's last `beat` (wall clock): lease expiry (TTL 2 s), "
    "detection, retry, placement and the new process start.",
    "- *start lag*: a run's first ledger `start` minus its `not_before_ms`. *Claim*: the "
    "worker's claim instant (`started_ms`) minus `not_before_ms` (firing, placement, overlap "
    "waits, faults). *Spawn*: ledger `start` minus the claim (claim transaction, fork/exec "
    "and the job's own Python start-up).",
]
SHOWN_VIOLATIONS = 50


@dataclass
class RunInfo:
    seed: int
    command: str
    duration_s: float
    work_dir: str
    prefix: str
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    etcdsched_version: str = etcdsched.__version__
    etcd_version: str = "?"
    python: str = platform.python_version()
    machine: str = f"{platform.platform()} ({platform.machine()})"
    cpus: int = os.cpu_count() or 0
    injected_s: float = 0.0
    quiesce_s: float = 0.0
    total_s: float = 0.0
    recurring_jobs: int = 0
    healed: list[str] = field(default_factory=list)
    ledger_bad_lines: int = 0
    etcd_replacements: int = 0
    etcd_revisions: list[int] = field(default_factory=list)
    """Each member's revision after quiesce: all equal, or etcd itself diverged."""


@dataclass
class RunOutcome:
    info: RunInfo
    report: HistoryReport
    faults: list[Fault]
    exits: list[Fault] = field(default_factory=list)
    """Agents that exited on their own during the run (restarted under a new name)."""


def counter(values: Counter[str]) -> str:
    if not values:
        return "none"
    return ", ".join(f"{key} {count}" for key, count in sorted(values.items()))


def percentiles(p: Percentiles, unit: str = "ms") -> str:
    if p.count == 0:
        return "n/a (n=0)"
    return f"p50 {p.p50:.0f} {unit}, p99 {p.p99:.0f} {unit}, max {p.max:.0f} {unit} (n={p.count})"


def sections(outcome: RunOutcome) -> list[tuple[str, Rows]]:
    report = outcome.report
    delays = [
        ("rerun after lost", percentiles(report.rerun_delay())),
        ("start lag", percentiles(report.start_lag())),
        ("  of which claim", percentiles(report.claim_lag())),
        ("  of which spawn", percentiles(report.spawn_lag())),
    ]
    verdict = [
        ("violations", f"{len(report.violations)}: {counter(report.violation_counts())}"),
        ("unplanned exits", _exits(outcome.exits)),
        ("healed at quiesce", ", ".join(outcome.info.healed) or "nothing"),
        ("torn ledger lines", str(outcome.info.ledger_bad_lines)),
        ("notes", _notes(report)),
    ]
    return [
        ("Run", _run_rows(outcome.info)),
        ("Totals", _total_rows(outcome)),
        ("Delays", delays),
        ("Verdict", verdict),
    ]


def _run_rows(info: RunInfo) -> Rows:
    return [
        ("seed", str(info.seed)),
        ("command", f"`{info.command}`"),
        ("date", info.started),
        ("duration", f"{info.duration_s:.0f} s requested, {info.injected_s:.0f} s of faults"),
        ("quiesce", f"every run terminal {info.quiesce_s:.1f} s after the last job was paused"),
        ("wall time", f"{info.total_s:.0f} s including start-up and checks"),
        ("versions", f"etcdsched {info.etcdsched_version}, etcd {info.etcd_version}"),
        ("machine", f"{info.machine}, {info.cpus} CPUs, Python {info.python}"),
        ("work dir", info.work_dir),
    ]


def _total_rows(outcome: RunOutcome) -> Rows:
    info, report = outcome.info, outcome.report
    faults = Counter(f.kind for f in outcome.faults)
    fault_errors = sum(1 for f in outcome.faults if f.error)
    slots = (
        f"{report.slots_expected} due: {report.slots_by_run} run, {report.slots_by_skip} skipped"
    )
    return [
        ("jobs", f"{report.jobs} ({info.recurring_jobs} recurring, the rest one-off `at`)"),
        ("slots", slots),
        ("runs", f"{report.runs}: {counter(report.runs_by_state)}"),
        ("attempts", f"{report.attempts}: {counter(report.attempts_by_state)}"),
        ("executions", f"{report.executions} processes seen in the ledger"),
        ("skips", f"{report.skip_records} records: {counter(report.skips_by_reason)} (slots)"),
        ("faults", f"{len(outcome.faults)}: {counter(faults)}"),
        ("fault errors", f"{fault_errors} (etcd unavailable during a storm, etc.)"),
        ("etcd restarts", _etcd_restarts(info)),
    ]


def _etcd_restarts(info: RunInfo) -> str:
    """Killed members come back empty (member remove + add): etcd 3.5.1 can
    restart a member killed under load with applied writes missing."""
    revisions = ", ".join(str(r) for r in info.etcd_revisions) or "?"
    same = len(set(info.etcd_revisions)) == 1
    verdict = "consistent" if same else "DIVERGED (etcd fault, not a scheduler one)"
    return (
        f"{info.etcd_replacements} killed members rejoined empty (etcd 3.5.1 bug, "
        f"etcd issue 13766); member revisions after quiesce: {revisions}, {verdict}"
    )


def _notes(report: HistoryReport) -> str:
    notes = []
    if report.open_attempts:
        notes.append(
            f"{len(report.open_attempts)} terminal run(s) whose last attempt is still "
            f"assigned/running: {_some(report.open_attempts)}"
        )
    if report.leaked_capacity:
        notes.append(
            f"{len(report.leaked_capacity)} worker slot(s) still counted as used after "
            f"quiesce: {_some(report.leaked_capacity)}"
        )
    return "; ".join(notes) or "none"


def _exits(exits: list[Fault]) -> str:
    if not exits:
        return "none"
    return f"{len(exits)} agent(s) exited on their own: " + "; ".join(
        f"{e.target} at {e.at_s:.0f} s ({e.detail})" for e in exits
    )


def _some(items: list[str], shown: int = 5) -> str:
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def render_text(outcome: RunOutcome) -> str:
    lines = [f"etcdsched fault-injection run, seed {outcome.info.seed}"]
    for title, rows in sections(outcome):
        lines.append(f"== {title}")
        lines += [f"  {key:<18} {value.replace('`', '')}" for key, value in rows]
    violations = outcome.report.violations
    if violations:
        lines.append("== Violations")
        lines += [f"  {v}" for v in violations[:SHOWN_VIOLATIONS]]
        if len(violations) > SHOWN_VIOLATIONS:
            lines.append(f"  ... and {len(violations) - SHOWN_VIOLATIONS} more")
    lines.append("RESULT: " + ("OK" if outcome.report.ok else "VIOLATIONS FOUND"))
    return "\n".join(lines)


def render_markdown(outcome: RunOutcome) -> str:
    ok = outcome.report.ok
    lines = [
        "# Reliability: fault-injection run",
        "",
        f"Result: **{'no violations' if ok else 'VIOLATIONS FOUND'}**. "
        "Produced by `tests/faults/harness.py`; the checker is `tests/faults/checker.py`.",
    ]
    for title, rows in sections(outcome):
        lines += ["", f"## {title}", "", "| | |", "| --- | --- |"]
        lines += [f"| {key} | {_cell(value)} |" for key, value in rows]
    lines += ["", "## What the checker verifies", ""]
    lines += [f"- `{kind}`: {meaning}" for kind, meaning in VIOLATION_KINDS.items()]
    lines += ["", "## How the delays are measured", "", *METRICS]
    lines += ["", "## Violations", ""]
    lines += [
        f"- `{v.kind}` {v.run_id or v.job_id}: {_cell(v.detail)}" for v in outcome.report.violations
    ]
    if ok:
        lines.append("None.")
    lines += [
        "",
        "## Fault log",
        "",
        "| t (s) | fault | target | detail |",
        "| ---: | --- | --- | --- |",
    ]
    for f in sorted([*outcome.faults, *outcome.exits], key=lambda f: f.at_s):
        detail = f"{f.detail} **error: {f.error}**" if f.error else f.detail
        lines.append(f"| {f.at_s:.2f} | {f.kind} | {f.target} | {_cell(detail)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def command_line(argv: list[str]) -> str:
    return " ".join([sys.executable.rsplit("/", 1)[-1], "-m", "tests.faults.harness", *argv])
