"""``docs/benchmarks.md``: setup, targets (met or missed, by how much), and
per scenario its parameters, tables, figures and notes. Figures go to a
folder beside the report (``docs/benchmarks/``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from etcdsched.bench.results import ScenarioResult, Target, read_results

DASH = "\u2013"  # en dash: an empty cell
Figures = dict[str, list[tuple[str, str]]]


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
    fsync = "on" if meta.get("fsync") else "**off** (`--unsafe-no-fsync`: a crash loses data)"
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


def version_line(ver: dict[str, str]) -> str:
    """etcdsched's version, and the commit when the run recorded one."""
    version, commit = ver.get("etcdsched", "?"), ver.get("commit")
    return f"{version} (commit {commit})" if commit else version


def machine_line(meta: dict[str, Any]) -> str:
    machine = meta.get("machine", {})
    return (
        f"{machine.get('cpus', '?')} CPUs ({machine.get('cpu_model', '?')}), "
        f"{machine.get('memory_gib', '?')} GiB, Linux {machine.get('kernel', '?')}"
    )


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


def render(meta: dict[str, Any], results: list[ScenarioResult], docs: Path) -> Path:
    """Write the report (and its figures, if matplotlib is installed)."""
    figures: Figures = {}
    fig_dir = docs.parent / docs.stem
    try:
        from etcdsched.bench.plots import draw_all
    except ImportError:
        plots_note = "Figures skipped: matplotlib is missing (`pip install 'etcdsched[bench]'`)."
    else:
        figures = draw_all(meta, results, fig_dir, docs.parent)
        plots_note = ""
    lines = ["# etcdsched benchmarks", ""]
    lines += _banner(meta)
    lines += ["Produced by `etcdsched bench` (`python -m etcdsched.bench`); raw results in "
              "`bench-results/`. Re-render with `--report-from <results.json>`.", ""]  # fmt: skip
    lines += ["## Setup", "", *setup_lines(meta), ""]
    lines += ["## Targets", "", *targets_lines(results), ""]
    if plots_note:
        lines += [plots_note, ""]
    for result in results:
        lines += scenario_lines(result, figures.get(result.name, []))
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text("\n".join(lines).rstrip() + "\n")
    return docs


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
    meta, results = read_results(results_json)
    return render(meta, results, docs)
