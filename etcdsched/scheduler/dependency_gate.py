"""Whether a run may start as far as its ``depends_on`` says (docs/dependencies.md).

A run of B for slot *s* waits, for each upstream A, for *the* run of A:
the latest run of A scheduled at or before *s* within B's
``dependency_window``. A's schedule says which slot that is, so B never
takes an older run of A while A's run for that slot is still to be fired.
The run succeeded: go on. It ended any other way, or its slot was skipped:
B's run is skipped, naming it. Nothing ended by ``s + dependency_timeout``:
B's run is skipped, naming what it waited for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.records import JobRecord, RunRecord
from etcdsched.model.states import RunState
from etcdsched.model.triggers import latest_slot_at_or_before
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Store
from etcdsched.store.upstream_runs import latest_run, skip_covering


@dataclass(frozen=True)
class Verdict:
    """``go``, ``wait`` (``why`` names what for) or ``skip`` (``why`` says why)."""

    kind: Literal["go", "wait", "skip"]
    why: str = ""


GO = Verdict("go")


def shown(ms: int) -> str:
    """An instant as RFC 3339 UTC to the millisecond."""
    return ms_to_utc(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class DependencyGate:
    """Reads each upstream job and the runs of it that matter (a few keys)."""

    def __init__(self, store: Store, keys: Keys) -> None:
        self.store = store
        self.keys = keys

    async def verdict(self, run: RunRecord, now_ms: int) -> Verdict:
        """The first upstream that is not ``go`` decides; a wait past the
        timeout becomes a skip."""
        for upstream in run.spec.depends_on:
            verdict = await self._upstream(run, upstream)
            if verdict.kind == "go":
                continue
            timeout_ms = int(run.spec.dependency_timeout.total_seconds() * 1000)
            if verdict.kind == "wait" and now_ms > run.slot_ms + timeout_ms:
                return Verdict("skip", f"dependency timeout passed, still {verdict.why}")
            return verdict
        return GO

    async def _upstream(self, run: RunRecord, upstream: str) -> Verdict:
        kv = await self.store.get(self.keys.job(upstream))
        if kv is None:
            return Verdict("skip", f"upstream job {upstream} no longer exists")
        job = kv.decode(JobRecord).value
        window_ms = int(run.spec.dependency_window.total_seconds() * 1000)
        first_ms = run.slot_ms - window_ms
        expected = latest_slot_at_or_before(job.spec.trigger, run.slot_ms, job.anchor_ms, window_ms)
        found = await latest_run(self.store, self.keys, upstream, first_ms, run.slot_ms)
        if expected is not None and (found is None or found.slot_ms < expected):
            return await self._not_fired(upstream, expected)
        if found is None:
            before = shown(run.slot_ms)
            return Verdict("wait", f"waiting for a run of {upstream} at or before {before}")
        if found.state is RunState.SUCCEEDED:
            return GO
        if found.state.terminal:
            why = f": {found.reason}" if found.reason else ""
            return Verdict("skip", f"upstream run {found.id} ended {found.state.value}{why}")
        return Verdict("wait", f"waiting for upstream run {found.id} ({found.state.value})")

    async def _not_fired(self, upstream: str, slot_ms: int) -> Verdict:
        """A's run for the slot is not there: skipped, or still to be fired."""
        skip = await skip_covering(self.store, self.keys, upstream, slot_ms)
        if skip is not None:
            detail = f" ({skip.detail})" if skip.detail else ""
            why = f"upstream {upstream}'s slot {shown(slot_ms)} was skipped: {skip.reason}{detail}"
            return Verdict("skip", why)
        return Verdict("wait", f"waiting for upstream {upstream}'s run for slot {shown(slot_ms)}")
