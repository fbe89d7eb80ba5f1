"""Reads of an upstream job's runs for the jobs that depend on it
(``depends_on``) or are triggered by it (an ``after`` trigger); see
docs/dependencies.md. A job's runs are keyed by slot, so both questions are
one bounded range read of that job's keys."""

from __future__ import annotations

from etcdsched.model.records import RunRecord, SkipRecord
from etcdsched.store.keys import Keys, run_seq
from etcdsched.store.kv import Store

ENDED_LOOKBACK = 64
"""Runs of an upstream read, newest slot first, when looking for one that
ended after an instant: a run that ended late has an early slot, but not
64 slots early in any schedule an ``after`` job can keep up with."""


async def latest_run(
    store: Store, keys: Keys, job_id: str, first_ms: int, last_ms: int
) -> RunRecord | None:
    """The run of ``job_id`` with the latest slot in ``[first_ms, last_ms]``
    (a manual run of a slot's millisecond sorts after the scheduled one)."""
    prefix = keys.runs_prefix(job_id)
    start, end = f"{prefix}{run_seq(max(0, first_ms))}", f"{prefix}{run_seq(last_ms + 1)}"
    page = await store.range(start, end, limit=1, descending=True)
    return page.kvs[0].decode(RunRecord).value if page.kvs else None


async def skip_covering(store: Store, keys: Keys, job_id: str, slot_ms: int) -> SkipRecord | None:
    """The skip record of ``job_id`` that covers ``slot_ms``, if any: the
    one starting latest at or before it (skip keys are their first slot)."""
    prefix = keys.skips_prefix(job_id)
    end = keys.skip(job_id, slot_ms + 1)
    page = await store.range(prefix, end, limit=1, descending=True)
    if not page.kvs:
        return None
    skip = page.kvs[0].decode(SkipRecord).value
    return skip if skip.last_slot_ms >= slot_ms else None


async def runs_ended_since(
    store: Store, keys: Keys, job_id: str, since_ms: int, window_ms: int
) -> list[RunRecord]:
    """The runs of ``job_id`` that ended (became terminal) at or after
    ``since_ms``, among its latest runs with a slot no earlier than
    ``since_ms - window_ms``. A terminal run is written once more at most
    (by retention, which deletes it), so its ``updated_ms`` is when it ended."""
    prefix = keys.runs_prefix(job_id)
    start = f"{prefix}{run_seq(max(0, since_ms - window_ms))}"
    end = f"{prefix[:-1]}0"  # just past the prefix: "/" + 1
    page = await store.range(start, end, limit=ENDED_LOOKBACK, descending=True)
    runs = [kv.decode(RunRecord).value for kv in page.kvs]
    return [run for run in runs if run.state.terminal and run.updated_ms >= since_ms]
