"""The report's figures (matplotlib, optional extra ``etcdsched[bench]``).

Every figure carries a footer naming the command line, the versions
(etcdsched, etcd server, Python) and the machine, so a figure copied out of
the report still says where it came from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from etcdsched.bench.describe import Figures, machine_line, version_line
from etcdsched.bench.measure import STAGES
from etcdsched.bench.results import ScenarioResult


def footer(meta: dict[str, Any]) -> str:
    ver = meta.get("versions", {})
    how = meta.get("fsync_off_by") or "--unsafe-no-fsync"
    fsync = "fsync on" if meta.get("fsync") else f"fsync off: {how}"
    smoke = "SMOKE RUN (reduced sizes) · " if meta.get("reduced") else ""
    return (
        f"{smoke}$ {meta.get('command', '')}\n"
        f"etcdsched {version_line(ver)} · etcd {ver.get('etcd', '?')} ({fsync}) · "
        f"Python {ver.get('python', '?')} · {machine_line(meta)} · {meta.get('started', '')}"
    )


def _new(title: str, ylabel: str, xlabel: str) -> tuple[Figure, Any]:
    fig, ax = plt.subplots(figsize=(10, 5.6))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Figure, meta: dict[str, Any], path: Path) -> None:
    fig.text(0.01, 0.01, footer(meta), fontsize=7, family="monospace", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _trim(counts: list[int]) -> list[int]:
    end = len(counts)
    while end > 1 and counts[end - 1] == 0:
        end -= 1
    return counts[:end]


def _rates(ax: Any, series: dict[str, list[int]], offset_s: int = 0) -> None:
    length = max(len(_trim(series[s])) for s in STAGES)
    for stage in STAGES:
        counts = series[stage][:length]
        ax.plot([offset_s + i for i in range(len(counts))], counts, label=f"{stage}/s")
    ax.legend()


def _cdf(ax: Any, curve: list[list[float]], label: str) -> None:
    if curve:
        ax.plot([v for _, v in curve], [f * 100 for f, _ in curve], label=label)


def _lag_axes(title: str) -> tuple[Figure, Any]:
    fig, ax = _new(title, "runs started within (%)", "start lag (ms, symlog)")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_ylim(0, 100.5)
    return fig, ax


def draw_throughput(meta: dict[str, Any], result: ScenarioResult, out: Path) -> list[Path]:
    paths = []
    for executor, data in result.series.items():
        fig, ax = _new(f"throughput, {executor} executor: runs per second by stage",
                       "runs per second", "seconds since the first slot")  # fmt: skip
        _rates(ax, data["per_second"])
        start, end = data["window"]
        ax.axvspan(start, end, color="grey", alpha=0.1, label="steady window")
        paths.append(out / f"throughput-{executor}.png")
        _save(fig, meta, paths[-1])
    fig, ax = _lag_axes("throughput: start lag distribution")
    for executor, data in result.series.items():
        _cdf(ax, data["lag_curve"], f"{executor} executor")
    ax.legend()
    paths.append(out / "throughput-lag.png")
    _save(fig, meta, paths[-1])
    return paths


def draw_burst(meta: dict[str, Any], result: ScenarioResult, out: Path) -> list[Path]:
    paths = []
    for size, data in result.series.items():
        fig, ax = _new(f"burst of {int(size):,} slots due at T: runs per second by stage",
                       "runs per second", "seconds after T")  # fmt: skip
        _rates(ax, data["per_second"], data.get("t0_offset_s", 0))
        ax.axvline(0, color="black", linewidth=0.8)
        paths.append(out / f"burst-{size}.png")
        _save(fig, meta, paths[-1])
    fig, ax = _lag_axes("burst: start lag distribution")
    for size, data in result.series.items():
        _cdf(ax, data["lag_curve"], f"{int(size):,} slots")
    ax.legend()
    paths.append(out / "burst-lag.png")
    _save(fig, meta, paths[-1])
    return paths


def draw_idle(meta: dict[str, Any], result: ScenarioResult, out: Path) -> list[Path]:
    fig, ax = _lag_axes("idle cluster: start lag distribution")
    _cdf(ax, result.series.get("lag_curve", []), "recurring jobs")
    ax.axvline(50, color="red", linewidth=0.8, label="target p99 50 ms")
    ax.legend()
    path = out / "idle-lag.png"
    _save(fig, meta, path)
    return [path]


def draw_memory(meta: dict[str, Any], result: ScenarioResult, out: Path) -> list[Path]:
    fig, ax = _new("agent resident memory (VmRSS)", "MB", "seconds of sampling")
    for stored, phase in result.series.get("samples", {}).items():
        for role, samples in phase.items():
            ax.plot([s[0] for s in samples], [s[1] for s in samples],
                    label=f"{role}, {int(stored):,} stored jobs")  # fmt: skip
    ax.legend()
    path = out / "memory.png"
    _save(fig, meta, path)
    return [path]


SOAK_PANELS = (
    ("disk, MiB", (("log_bytes", "run logs (du)"), ("archive_bytes", "archives")), 2**20),
    ("log files and run directories", (("log_files", "files"), ("run_dirs", "run dirs")), 1),
    ("run records in etcd", (("records", "all jobs"), ("records_job_max", "busiest job")), 1),
    ("etcd DB, MiB", (("db_bytes", "file"), ("db_in_use", "in use")), 2**20),
)


def draw_soak(meta: dict[str, Any], result: ScenarioResult, out: Path) -> list[Path]:
    """Four panels over the runs ended; the warm-up (log delete grace) shaded."""
    series = result.series
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.4), sharex=True)
    runs = series.get("runs", [])
    warm = [r for t, r in zip(series.get("t_s", []), runs, strict=False)
            if t < series.get("warm_up_s", 0)]  # fmt: skip
    for ax, (title, lines, scale) in zip(axes.flat, SOAK_PANELS, strict=True):
        for key, label in lines:
            ax.plot(runs, [v / scale for v in series.get(key, [])], label=label)
        if warm:
            ax.axvspan(0, warm[-1], color="grey", alpha=0.15, label="warm-up")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("runs ended")
    fig.suptitle(f"soak: {result.title.removeprefix('Soak: ')}")
    path = out / "soak.png"
    _save(fig, meta, path)
    return [path]


DRAWERS = {
    "throughput": draw_throughput,
    "burst": draw_burst,
    "idle-lag": draw_idle,
    "memory": draw_memory,
    "soak": draw_soak,
}


def draw_all(
    meta: dict[str, Any], results: list[ScenarioResult], out: Path, relative_to: Path
) -> Figures:
    """Draw every figure; returns per scenario ``(caption, path relative to the report)``."""
    figures: Figures = {}
    for result in results:
        drawer = DRAWERS.get(result.name)
        if drawer is None or result.error:
            continue
        paths = drawer(meta, result, out)
        figures[result.name] = [
            (p.stem.replace("-", " "), os.path.relpath(p, relative_to)) for p in paths
        ]
    return figures
