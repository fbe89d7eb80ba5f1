"""The benchmark's accounting: CPU per unit and group, cores busy, etcd's counters."""

from __future__ import annotations

import os
from pathlib import Path

from etcdsched.bench.cpu import CpuSample, fleet_groups, per_unit_ms, sample
from etcdsched.bench.describe import version_line
from etcdsched.bench.env import source_commit
from etcdsched.bench.etcd_ops import BACKGROUND, parse_counters, per_unit


def test_per_unit_splits_by_group_and_counts_cores() -> None:
    before = CpuSample(10.0, {"etcd": 1.0, "scheduler": 2.0})
    after = CpuSample(12.0, {"etcd": 1.5, "scheduler": 3.5})
    cpu = per_unit_ms(before, after, 1000)
    assert cpu["etcd"] == 0.5  # 0.5 s over 1,000 runs
    assert cpu["scheduler"] == 1.5
    assert cpu["total"] == 2.0
    assert cpu["cores"] == 1.0  # 2 s of CPU in 2 s of wall time


def test_sample_reads_this_process() -> None:
    groups = fleet_groups(os.getpid())
    assert groups == {"etcd": [os.getpid()], "benchmark": [os.getpid()]}
    first = sample(groups)
    sum(i * i for i in range(300_000))  # burn a little CPU
    assert sample(groups).seconds["benchmark"] >= first.seconds["benchmark"]


def test_etcd_counters_are_read_from_its_metrics_page() -> None:
    page = "\n".join(
        [
            "# HELP etcd_mvcc_put_total Total number of puts seen by this member.",
            "# TYPE etcd_mvcc_put_total counter",
            "etcd_mvcc_put_total 1500",
            "etcd_mvcc_txn_total 30",
            'grpc_server_handled_total{grpc_code="OK"} 7',
            "etcd_debugging_mvcc_events_total 900",
        ]
    )
    before = parse_counters(page)
    assert before == {"puts": 1500.0, "txns": 30.0, "watch events": 900.0}
    after = {"puts": 2500.0, "txns": 40.0, "watch events": 2900.0}
    assert per_unit(before, after, 100) == {"puts": 10.0, "txns": 0.1, "watch events": 20.0}


def test_a_run_names_the_commit_it_ran_from(tmp_path: Path) -> None:
    assert source_commit(tmp_path) == ""  # not a checkout: nothing claimed
    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        return  # an sdist or a copy without history
    commit = source_commit(repo / "etcdsched")
    assert commit.removesuffix("+dirty")
    assert version_line({"etcdsched": "0.1.0", "commit": commit}) == f"0.1.0 (commit {commit})"
    assert version_line({"etcdsched": "0.1.0"}) == "0.1.0"


def test_the_background_counters_are_read_from_the_same_page() -> None:
    page = (
        "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_sum 42\n"
        "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count 3\n"
        "go_gc_duration_seconds_count 17\n"
        'go_gc_duration_seconds{quantile="0.5"} 0.001\n'
        "etcd_debugging_snap_save_total_duration_seconds_count 2\n"
        "etcd_mvcc_put_total 9\n"
    )
    assert parse_counters(page, BACKGROUND) == {
        "compactions": 3.0,
        "compaction ms": 42.0,
        "gc cycles": 17.0,
        "snapshots": 2.0,
    }
