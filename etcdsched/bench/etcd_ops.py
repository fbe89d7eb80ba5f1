"""What etcd did per unit of work, from its own Prometheus counters
(``/metrics`` on the client URL): puts, deletes, transactions, key reads
(compares included: etcd reads a key to compare it) and events sent to
watchers. With the CPU table this says *why* a run costs what it does."""

from __future__ import annotations

import asyncio
import urllib.request

from etcdsched.store.etcd import EtcdStore

COUNTERS = {
    "txns": "etcd_mvcc_txn_total",
    "puts": "etcd_mvcc_put_total",
    "deletes": "etcd_mvcc_delete_total",
    "key reads": "etcd_mvcc_range_total",
    "watch events": "etcd_debugging_mvcc_events_total",
    "raft proposals": "etcd_server_proposals_committed_total",
}
"""Column name -> etcd counter (unlabelled)."""
DB_SIZE = {"db bytes": "etcd_mvcc_db_total_size_in_bytes",
           "db bytes in use": "etcd_mvcc_db_total_size_in_use_in_bytes"}  # fmt: skip
"""etcd's database file, and the part of it holding live pages: the file
never shrinks without a defragmentation, the part in use does once the
history is compacted."""
BACKGROUND = {
    "compactions": "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count",
    "compaction ms": "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_sum",
    "gc cycles": "go_gc_duration_seconds_count",
    "snapshots": "etcd_debugging_snap_save_total_duration_seconds_count",
}
"""etcd's background work that finished: history compactions and the time
they took, Go garbage collections, and raft snapshots saved. The scan
scenario counts them per pass, to show what shared etcd's CPU with the
pass (compaction every 10 s, ADR 0015; a collection's marking grows with
the heap that a million stored jobs leave; a snapshot copies the state)."""


def parse_counters(text: str, counters: dict[str, str] = COUNTERS) -> dict[str, float]:
    """The ``counters`` (default :data:`COUNTERS`) found in a Prometheus text page."""
    wanted = {metric: name for name, metric in counters.items()}
    found: dict[str, float] = {}
    for line in text.splitlines():
        metric, _, value = line.partition(" ")
        if metric in wanted:
            found[wanted[metric]] = float(value)
    return found


async def read_counters(endpoint: str, counters: dict[str, str] = COUNTERS) -> dict[str, float]:
    """etcd's ``counters`` now; empty if its metrics cannot be read."""

    def fetch() -> str:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as page:
            return str(page.read().decode())

    try:
        return parse_counters(await asyncio.to_thread(fetch), counters)
    except OSError:
        return {}


def per_unit(before: dict[str, float], after: dict[str, float], units: int) -> dict[str, float]:
    """Each counter's growth per unit (only counters read both times)."""
    return {k: (after[k] - before[k]) / max(units, 1) for k in after if k in before}


async def compacted_db(store: EtcdStore, endpoint: str) -> dict[str, float]:
    """etcd's :data:`DB_SIZE` once its history is compacted away (now, not
    at the next automatic compaction): what the live keys take."""
    revision = (await store.range("\0", count_only=True)).revision
    await store.compact(revision)
    await asyncio.sleep(1.0)
    return await read_counters(endpoint, DB_SIZE)
