"""``docs/benchmarks.md``: setup, targets (met or missed, by how much), the
hand-written reading, and per scenario its parameters, tables, figures and
notes. Figures go to a folder beside the report (``docs/benchmarks/``).

Everything but the reading is generated from a results JSON. The reading is
kept in its own file in that folder (``docs/benchmarks/reading.md``), which
the renderer includes and never writes, so re-rendering keeps it. Its first
line may name the run it was written for (``<!-- run: <started> -->``, the
results' ``meta.started``); rendered with another run's results, the page
says that the reading is stale instead of passing it off as current."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from etcdsched.bench.describe import Figures, machine_line, version_line
from etcdsched.bench.results import ScenarioResult, Target, read_results

DASH = "\u2013"  # en dash: an empty cell
READING = "reading.md"
HEADLINE = "headline.md"
"""The hand-written reading's file name, in the folder beside the report."""
_RUN_MARK = re.compile(r"\A\s*<!--\s*run:\s*(\S+)\s*-->\s*\n?")


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isinf(value):
            return "not all started"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def md_table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return lines


def setup_lines(meta: dict[str, Any]) -> list[str]:
    machine, ver = meta.get("machine", {}), meta.get("versions", {})
    opts = meta.get("options", {})
    how = meta.get("fsync_off_by") or "--unsafe-no-fsync"
    fsync = "on" if meta.get("fsync") else f"**off** (`{how}`: a crash loses data)"
    rows = [
        ["command", f"`{meta.get('command', '')}`"],
        ["started / finished (UTC)", f"{meta.get('started', '')} / {meta.get('finished', DASH)}"],
        ["etcdsched", version_line(ver)],
        ["etcd server", f"{ver.get('etcd', '?')}, single member on loopback, fsync {fsync}"],
        ["Python", ver.get("python", "?")],
        ["machine", machine_line(meta)],
        ["load average at start", ", ".join(map(str, machine.get("load_average_at_start", [])))],
        ["partitions / lease TTL / lookahead",
         f"{opts.get('partitions')} / {opts.get('lease_ttl')} s / {opts.get('lookahead_ms')} ms"],
    ]  # fmt: skip
    return md_table(["", ""], rows)


def _verdict(target: Target) -> str:
    met = target.met
    return "n/a" if met is None else ("**met**" if met else "**missed**")


def targets_lines(results: list[ScenarioResult]) -> list[str]:
    rows = []
    for result in results:
        if result.error:
            rows.append([result.name, "(scenario failed)", DASH, "**error**", "see below"])
        for t in result.targets:
            rows.append([result.name, t.name, _value(t), _verdict(t), t.margin()])
    return md_table(["scenario", "target", "result", "verdict", "margin"], rows)


def _value(target: Target) -> str:
    if target.value is None:
        return DASH
    unit = "" if math.isinf(target.value) else target.unit
    return f"{fmt(target.value)}{unit}"


def scenario_lines(result: ScenarioResult, figures: list[tuple[str, str]]) -> list[str]:
    lines = [f"## {result.title} (`{result.name}`)", ""]
    if result.error:
        return [*lines, "The scenario failed:", "", "```", result.error.strip(), "```", ""]
    params = ", ".join(f"{k} = {fmt(v)}" for k, v in result.params.items())
    lines += [f"Parameters: {params}. Took {result.seconds:.0f} s.", ""]
    for table in result.tables:
        lines += [f"**{table.title}**", "", *md_table(table.columns, table.rows), ""]
    for t in result.targets:
        lines.append(f"- Target: {t.name} — {_value(t)}: {_verdict(t)}, {t.margin()}.")
    lines += [f"- {n}" for n in result.notes]
    lines.append("")
    for caption, path in figures:
        lines += [f"![{caption}]({path})", ""]
    return lines


def render(
    meta: dict[str, Any], results: list[ScenarioResult], docs: Path, source: Path | None = None
) -> Path:
    """Write the report (and its figures, if matplotlib is installed)."""
    figures: Figures = {}
    try:
        from etcdsched.bench.plots import draw_all
    except ImportError:
        plots_note = "Figures skipped: matplotlib is missing (`pip install 'etcdsched[bench]'`)."
    else:
        figures = draw_all(meta, results, docs.parent / docs.stem, docs.parent)
        plots_note = ""
    tuned = "" if meta.get("fsync", True) else " (tuned run: etcd fsync off)"
    lines = [*_head_lines(meta, docs, source), *headline_lines(docs)]
    lines += [f"## Setup{tuned}", "", *setup_lines(meta), ""]
    lines += [f"## Targets{tuned}", "", *targets_lines(results), ""]
    lines += reading_lines(meta, docs)
    if plots_note:
        lines += [plots_note, ""]
    for result in results:
        lines += scenario_lines(result, figures.get(result.name, []))
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text("\n".join(lines).rstrip() + "\n")
    return docs


def _head_lines(meta: dict[str, Any], docs: Path, source: Path | None) -> list[str]:
    origin = f"from {_link(source, docs)} " if source is not None else ""
    return [
        "# etcdsched benchmarks",
        "",
        *_banner(meta),
        f"Generated by `etcdsched bench` {origin}(re-render with `etcdsched bench "
        f"--report-from <results.json>`; published runs are kept in "
        f"[{docs.stem}/runs/]({docs.stem}/runs/)). Only the reading is written by hand, "
        f"in [{docs.stem}/{READING}]({docs.stem}/{READING}): the page includes it, and "
        "re-rendering never overwrites it.",
        "",
    ]


def _link(path: Path, docs: Path) -> str:
    """``path`` as a link relative to the page, or as given if outside its folder."""
    try:
        rel = path.resolve().relative_to(docs.parent.resolve()).as_posix()
    except ValueError:
        return f"`{path.as_posix()}`"
    return f"[{rel}]({rel})"


def reading_path(docs: Path) -> Path:
    """Where the hand-written reading of ``docs`` lives."""
    return docs.parent / docs.stem / READING


def headline_lines(docs: Path) -> list[str]:
    """The hand-written headline (``headline.md`` beside the reading), first
    on the page: the figures with what a user runs (fsync on, defaults),
    whichever run the generated tables below come from. Nothing if absent."""
    path = docs.parent / docs.stem / HEADLINE
    if not path.is_file():
        return []
    return ["## Headline: what a user runs (fsync on, default settings)", "",
            path.read_text().strip(), ""]  # fmt: skip


def reading_lines(meta: dict[str, Any], docs: Path) -> list[str]:
    """The reading's section: its file as written, after a warning when the
    file names another run than the one rendered. Nothing if it is absent."""
    path = reading_path(docs)
    if not path.is_file():
        return []
    text = path.read_text()
    mark = _RUN_MARK.match(text)
    lines = ["## Reading", "", "*Written by hand; the rest of the page is generated.*", ""]
    if mark and mark.group(1) != str(meta.get("started")):
        lines += [
            f"> **Stale:** this reading was written for the run started {mark.group(1)}, "
            f"not this one (started {meta.get('started')}); its figures may not match "
            "the tables. Update the reading.",
            "",
        ]
    body = text[mark.end() :] if mark else text
    return [*lines, body.strip(), ""]


def _banner(meta: dict[str, Any]) -> list[str]:
    if not meta.get("reduced"):
        return []
    why = "; ".join(meta.get("deviations", [])) or "--smoke"
    return [
        "> **SMOKE RUN — these numbers are not results.** Sizes were reduced "
        f"({why}); the targets are defined for the full sizes.",
        "",
    ]


def render_file(results_json: Path, docs: Path) -> Path:
    """Render ``docs`` again from a results JSON, keeping its reading."""
    meta, results = read_results(results_json)
    return render(meta, results, docs, source=results_json)
