"""The benchmark's CPU accounting: per unit, per group, and cores busy."""

from __future__ import annotations

import os

from etcdsched.bench.cpu import CpuSample, fleet_groups, per_unit_ms, sample


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
