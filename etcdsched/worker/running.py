"""What a worker keeps about each assignment it is handling.

Below both the worker's service (:mod:`etcdsched.worker.service`), which
creates and tracks these, and the attempt code (:mod:`etcdsched.worker.attempt`
and its halves), which runs one: neither imports the other for them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from etcdsched.model.placement import NOTHING, Amount, plus
from etcdsched.model.records import Assignment
from etcdsched.worker.interrupts import Interrupt
from etcdsched.worker.process_group import Process


@dataclass
class Running:
    """One assignment this worker is handling."""

    assignment: Assignment
    task: asyncio.Task[None]
    assigned_revision: int
    """The ``mod_revision`` of the assignment as we saw it: the transaction
    that assigned the run to us wrote the run at this revision too, so an
    unchanged run still has it (the unread claim of ADR 0017 compares it)."""
    cancel: Interrupt = field(default_factory=Interrupt)
    """A client cancelled the run: stop the process, report ``cancelled``."""
    revoked: Interrupt = field(default_factory=Interrupt)
    """Recovery took the assignment back (hung/lost): stop, never report."""
    shutdown: Interrupt = field(default_factory=Interrupt)
    """This worker is stopping: hand the attempt back if its job has not
    started. A job already started runs on, within the shutdown grace."""
    halt: Interrupt = field(default_factory=Interrupt)
    """The shutdown grace ran out, or a second signal asked to stop now:
    stop the started job and report it ``interrupted`` (retried at once)."""
    process: Process | None = None
    """Set once the job is prepared (forked behind its gate)."""
    started: bool = False
    """The gate opened: the job itself runs (drain hands back the others)."""
    hang_deadline_ms: int | None = None
    """The claim's hang deadline (wall ms), for a job with a timeout: the
    watchdog kills the job before it, whatever the agent's loop is doing."""

    def interrupts(self) -> tuple[Interrupt, Interrupt, Interrupt]:
        """What ends the attempt before its job starts: revoke, cancel, shutdown."""
        return self.revoked, self.cancel, self.shutdown

    def interrupted(self) -> bool:
        return any(flag.is_set() for flag in self.interrupts())


class RunningAttempts(dict[str, Running]):
    """The assignments a worker is handling, by run id, with the total of
    their resources (``used``) kept as they come and go: every report asks
    for it (``report_may_wait``), and summing thousands of attempts per
    report was quadratic in a burst. Only ``[]=``, ``del`` and ``clear``
    change it, which is all the worker uses."""

    def __init__(self) -> None:
        super().__init__()
        self.used: Amount = NOTHING

    def __setitem__(self, run_id: str, item: Running) -> None:
        replaced = self.get(run_id)
        if replaced is not None:
            self.used = plus(self.used, replaced.assignment.resources, sign=-1)
        super().__setitem__(run_id, item)
        self.used = plus(self.used, item.assignment.resources)

    def __delitem__(self, run_id: str) -> None:
        self.used = plus(self.used, self[run_id].assignment.resources, sign=-1)
        super().__delitem__(run_id)

    def clear(self) -> None:
        super().clear()
        self.used = NOTHING
