"""The benchmark page is generated from a results JSON, except its reading,
which is written by hand in its own file: re-rendering must keep it, and say
so when it was written for another run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from etcdsched.bench.report import reading_path, render_file
from etcdsched.bench.results import ScenarioResult, Table, Target, write_results

STARTED = "2026-12-06T18:40:10+00:00"


@pytest.fixture(autouse=True)
def _no_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Render without matplotlib, as the unit tests' environment may."""
    monkeypatch.setitem(sys.modules, "etcdsched.bench.plots", None)


def _results(tmp_path: Path, started: str = STARTED) -> Path:
    burst = ScenarioResult(
        name="burst",
        title="Burst",
        tables=[Table("drain", ["slots", "lag p99 ms"], [[10_000, 15]])],
        targets=[Target("burst of 10,000: lag p99 <= 1 s", 15, 1000, "lower", " ms")],
    )
    path = tmp_path / "runs" / "run.json"
    write_results(path, {"started": started, "fsync": False}, [burst])
    return path


def _write_reading(docs: Path, text: str) -> Path:
    path = reading_path(docs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_reading_survives_re_rendering_between_the_targets_and_the_scenarios(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "benchmarks.md"
    reading = _write_reading(docs, f"<!-- run: {STARTED} -->\nBursts: p99 **15 ms**.\n")
    results = _results(tmp_path)
    render_file(results, docs)
    docs.write_text(docs.read_text().replace("Bursts", "edited in the page"))  # lost, by design
    render_file(results, docs)
    page = docs.read_text()
    assert reading.read_text() == f"<!-- run: {STARTED} -->\nBursts: p99 **15 ms**.\n"
    assert page.count("Bursts: p99 **15 ms**.") == 1
    assert page.index("## Targets") < page.index("## Reading") < page.index("(`burst`)")
    assert "<!-- run:" not in page and "Stale" not in page
    assert "benchmarks/reading.md" in page


def test_a_reading_written_for_another_run_is_marked_stale(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    _write_reading(docs, f"<!-- run: {STARTED} -->\nold numbers\n")
    render_file(_results(tmp_path, started="2027-01-01T00:00:00+00:00"), docs)
    page = docs.read_text()
    assert f"**Stale:** this reading was written for the run started {STARTED}" in page
    assert "old numbers" in page


def test_without_a_reading_the_page_is_all_generated(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    render_file(_results(tmp_path), docs)
    page = docs.read_text()
    assert "## Reading" not in page
    assert "## Targets" in page and "(`burst`)" in page


def test_a_tuned_run_is_labelled_and_the_headline_of_user_settings_comes_first(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "benchmarks.md"
    headline = reading_path(docs).parent / "headline.md"
    headline.parent.mkdir(parents=True, exist_ok=True)
    headline.write_text("Idle lag p99 **4 ms** with fsync on.\n")
    render_file(_results(tmp_path), docs)  # a run with fsync off
    page = docs.read_text()
    assert page.index("## Headline: what a user runs") < page.index("## Setup")
    assert "## Setup (tuned run: etcd fsync off)" in page
    assert "## Targets (tuned run: etcd fsync off)" in page
    assert "Idle lag p99 **4 ms** with fsync on." in page
