"""The soak scenario's flatness rule and its disk walk: a verdict of "flat"
is worth something only if the same rule says "growing" for a leak."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from etcdsched.bench import soak
from etcdsched.bench.options import SMOKE, BenchOptions
from etcdsched.bench.soak_measure import FLAT_RATIO, ArchiveLines, disk_usage, flatness
from etcdsched.scheduler.retention import LOG_DELETE_GRACE_MS

TIMES = [float(t) for t in range(100)]
RUNS = [10.0 * t for t in TIMES]


def test_a_series_that_stopped_growing_after_the_warm_up_is_flat() -> None:
    values = [min(t, 20.0) * 5 + (t % 3) for t in TIMES]  # a plateau with a small saw-tooth
    flat = flatness(TIMES, RUNS, values, warm_up_s=30)
    assert flat is not None and flat.flat
    assert flat.ratio == pytest.approx(1.0)
    assert flat.per_1000_runs is not None and abs(flat.per_1000_runs) < 1


def test_a_series_growing_with_the_runs_is_not_flat() -> None:
    flat = flatness(TIMES, RUNS, [t * 5 for t in TIMES], warm_up_s=30)
    assert flat is not None and not flat.flat
    assert flat.ratio > FLAT_RATIO
    assert flat.per_1000_runs == pytest.approx(500)


def test_growth_during_the_warm_up_alone_is_not_judged() -> None:
    values = [t * 100 if t < 30 else 3000.0 for t in TIMES]
    flat = flatness(TIMES, RUNS, values, warm_up_s=30)
    assert flat is not None and flat.flat and flat.first == 3000.0


def test_no_verdict_from_too_few_samples_after_the_warm_up() -> None:
    assert flatness(TIMES, RUNS, TIMES, warm_up_s=95) is None


def _log(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_the_walk_counts_logs_and_archives_apart(tmp_path: Path) -> None:
    _log(tmp_path / "job-a" / "1" / "attempt-1.log", 80)
    _log(tmp_path / "job-a" / "2" / "attempt-1.log", 80)
    _log(tmp_path / "job-a" / "2" / "attempt-2.log", 80)
    _log(tmp_path / "job-a" / "archive.jsonl", 10_000)
    _log(tmp_path / "job-b" / "7" / "attempt-1.log", 80)
    usage = disk_usage(tmp_path)
    assert (usage.log_files, usage.run_dirs) == (4, 3)
    assert usage.run_dirs_per_job == {"job-a": 2, "job-b": 1}
    archive = os.stat(tmp_path / "job-a" / "archive.jsonl").st_blocks * 512
    assert usage.archive_bytes == archive
    assert usage.log_bytes >= 4 * 80  # whole blocks, directories included


def test_the_walk_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert disk_usage(tmp_path / "none").log_files == 0


def test_archived_runs_are_counted_incrementally_and_a_cut_is_noticed(tmp_path: Path) -> None:
    archive = tmp_path / "job-a" / "archive.jsonl"
    archive.parent.mkdir()
    archive.write_text("{}\n{}\n")
    lines = ArchiveLines()
    assert lines.count(tmp_path) == 2
    with archive.open("a") as file:
        file.write("{}\n")
    assert lines.count(tmp_path) == 3 and not lines.cut
    archive.write_text("{}\n")  # cut back to its newest lines
    assert lines.count(tmp_path) == 1 and lines.cut


def test_the_grace_is_the_schedulers_own_unless_asked_and_settable() -> None:
    assert soak.grace_ms(BenchOptions()) == (LOG_DELETE_GRACE_MS, "the scheduler's default")
    asked = BenchOptions(soak_log_grace=2.0)
    grace, why = soak.grace_ms(asked)
    if soak.GRACE_SETTING in soak.Config.model_fields:
        assert grace == 2000
    else:  # the setting is not in this version: said, not silently ignored
        assert grace == LOG_DELETE_GRACE_MS and "ignored" in why


def test_a_soak_too_short_to_judge_says_so_and_still_shows_its_figures() -> None:
    series = {key: [1.0, 2.0] for key, *_ in soak.SERIES} | {"t_s": [0.0, 1.0], "runs": [0, 3]}
    table, targets = soak.judge(series, warm_up=30)
    assert all(row[-1] == "too short to judge" for row in table.rows)
    assert all(t.met is None and "warm-up" in t.why_missing for t in targets)
    assert table.rows[1][3:5] == [2.0, 2.0]  # log files: last and max of the whole soak


def test_the_smoke_soak_is_a_reduced_run() -> None:
    smoke = BenchOptions(**{k: v for k, v in SMOKE.items() if k.startswith("soak_")})
    assert any(d.startswith("soak_runs=") for d in smoke.deviations())
