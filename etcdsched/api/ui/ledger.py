"""The slot ledger as cells: every recent slot of a job is one run or one
skip record (design.md, "What firing one entry does"), shown in slot order
so a gap in the runs always has its explanation beside it.

Pure: it arranges records already read, and reads nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from etcdsched.api.ui.render import utc_iso
from etcdsched.model.records import RunRecord, SkipRecord

SKIP_REASONS = {
    "misfire": "misfire: fired too late (every scheduler was down or behind)",
    "overlap": "overlap: the previous run was still going",
    "paused": "paused: the job was paused at this slot",
    "starting_deadline": "starting deadline passed before a worker was free",
    "dependency": "upstream failed: a depends_on run did not succeed",
    "deleted": "the job was deleted",
    "max_runs": "max_runs reached",
}
"""Each skip reason in words: the cell's hover text and its visible label."""


@dataclass(frozen=True)
class LedgerCell:
    """One run, or one skip record (which may stand for many slots)."""

    kind: Literal["run", "skip"]
    slot_ms: int
    state: str
    """The run's state, or ``skip``."""
    label: str
    """What the cell says: visible, so it reads without colour or hover."""
    title: str
    """The hover text: the whole story of the slot."""
    href: str = ""


def run_cell(run: RunRecord) -> LedgerCell:
    parts = [f"{run.state}", f"slot {utc_iso(run.slot_ms)}"]
    if run.kind != "scheduled":
        parts.append(f"{run.kind} run")
    if run.coalesced:
        parts.append(f"{run.coalesced} missed slots folded in")
    if run.reason:
        parts.append(run.reason)
    label = f"{run.state} (manual)" if run.kind == "manual" else str(run.state)
    return LedgerCell("run", run.slot_ms, str(run.state), label, "; ".join(parts), run_href(run.id))


def skip_cell(skip: SkipRecord) -> LedgerCell:
    why = SKIP_REASONS.get(skip.reason, skip.reason)
    if skip.count == 1:
        span = f"slot {utc_iso(skip.first_slot_ms)}"
    else:
        span = f"{skip.count} slots {utc_iso(skip.first_slot_ms)} to {utc_iso(skip.last_slot_ms)}"
    title = f"skipped, {why}; {span}" + (f"; {skip.detail}" if skip.detail else "")
    times = f" x{skip.count}" if skip.count > 1 else ""
    return LedgerCell("skip", skip.first_slot_ms, "skip", f"skipped{times}: {skip.reason}", title)


def run_href(run_id: str) -> str:
    return f"/ui/runs/{run_id}"


def ledger(runs: list[RunRecord], skips: list[SkipRecord], complete: bool) -> list[LedgerCell]:
    """Runs and skip records in slot order, oldest first. With
    ``complete`` false the runs are only the newest page: skip records
    older than the oldest run shown are left out too, so the ledger has no
    silent hole at its start."""
    cells = [run_cell(run) for run in runs]
    oldest = min((run.slot_ms for run in runs), default=None)
    for skip in skips:
        if complete or oldest is None or skip.last_slot_ms >= oldest:
            cells.append(skip_cell(skip))
    cells.sort(key=lambda cell: (cell.slot_ms, cell.kind == "run"))
    return cells
