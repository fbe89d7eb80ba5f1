"""The ``bench`` click command. Cheap to import: everything heavy (the
scenarios, the etcd client, matplotlib) is imported when it runs."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click

from etcdsched.bench import SCENARIOS


class _Duration(click.ParamType):  # type: ignore[type-arg]
    """``30s``, ``5m``, ``1h`` or seconds; the value is seconds as a float."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            return value
        from etcdsched.model.durations import parse_duration

        try:
            return parse_duration(value).total_seconds()
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _IntList(click.ParamType):  # type: ignore[type-arg]
    """``10000,100000`` (``k``/``M`` suffixes allowed: ``10k,100k``)."""

    name = "n,n,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        try:
            return tuple(_count(part) for part in str(value).split(",") if part.strip())
        except ValueError:
            self.fail(f"not a comma-separated list of counts: {value!r}", param, ctx)


def _count(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


DURATION = _Duration()
COUNTS = _IntList()
_OPTIONS = [
    click.option("--scenario", "scenarios", multiple=True, type=click.Choice(SCENARIOS),
                 help="Run only these (repeatable). Default: all."),
    click.option("--smoke", is_flag=True, help="Tiny sizes: checks the code paths in minutes."),
    click.option("--fsync/--unsafe-no-fsync", default=True, show_default=True,
                 help="etcd's fsync: on, as a user runs it; off only for a labelled tuned run."),
    click.option("--out-dir", type=click.Path(path_type=Path), help="JSON results directory."),
    click.option("--docs", type=click.Path(path_type=Path), help="Report (Markdown) path."),
    click.option("--data-dir", type=click.Path(path_type=Path),
                 help="Where etcd and agent logs live (default: a temporary directory)."),
    click.option("--report-from", type=click.Path(exists=True, path_type=Path),
                 help="Only re-render the report from this results JSON."),
    click.option("--partitions", type=click.IntRange(1, 1000)),
    click.option("--lease-ttl", type=click.IntRange(2, 300), help="Seconds (all agents)."),
    click.option("--lookahead-ms", type=click.IntRange(min=0)),
    click.option("--worker-slots", type=click.IntRange(min=1), help="Capacity per worker."),
    click.option("--noop-worker-slots", type=click.IntRange(min=1),
                 help="throughput: capacity per worker with the noop executor."),
    click.option("--drain-timeout", type=DURATION, help="Longest wait for runs to finish."),
    click.option("--raw-seconds", type=DURATION, help="raw: length of each measurement."),
    click.option("--raw-value-bytes", type=click.IntRange(1, 1_000_000)),
    click.option("--duration", type=DURATION, help="throughput: sustained load (>= 60s)."),
    click.option("--rate", type=click.IntRange(min=1),
                 help="throughput: offered slots/s (noop executor)."),
    click.option("--process-rate", type=click.IntRange(min=1),
                 help="throughput: offered slots/s (process executor)."),
    click.option("--executors", type=click.Choice(["noop", "process", "noop,process"]),
                 help="throughput: executors to measure."),
    click.option("--schedulers", type=click.IntRange(min=1), help="throughput: processes."),
    click.option("--workers", type=click.IntRange(min=1), help="throughput: processes."),
    click.option("--idle-jobs", type=click.IntRange(min=1)),
    click.option("--idle-every", type=DURATION),
    click.option("--idle-duration", type=DURATION),
    click.option("--idle-executor", type=click.Choice(["noop", "process"])),
    click.option("--idle-rounds", type=click.IntRange(min=1),
                 help="idle-lag: repeats; the target uses the median round."),
    click.option("--busy-every", type=DURATION,
                 help="idle-lag: one more round at this interval (0: none), not judged."),
    click.option("--busy-duration", type=DURATION),
    click.option("--burst-sizes", type=COUNTS, help="burst: e.g. 10k,100k."),
    click.option("--burst-lead", type=DURATION, help="burst: submitted this long ahead."),
    click.option("--burst-workers", type=click.IntRange(min=1)),
    click.option("--burst-shape", type=click.Choice(["defaults", "tuned"]),
                 help="burst: defaults = one worker with N slots and the default lookahead,"
                 " as `etcdsched up` runs; tuned = lookahead = lead, workers hold the burst."),
    click.option("--burst-executor", type=click.Choice(["noop", "process"])),
    click.option("--midnight-jobs", type=COUNTS, help="midnight: N jobs, e.g. 100k or 1M."),
    click.option("--midnight-capacity", type=click.FloatRange(min=0.0001, max=10.0),
                 help="midnight: worker slots as a share of N (default 0.5)."),
    click.option("--midnight-jitter", type=DURATION,
                 help="midnight: the 90% class's start tolerance (default 10m)."),
    click.option("--midnight-lead", type=DURATION, help="midnight: written this long ahead."),
    click.option("--scan-sizes", type=COUNTS, help="scan: stored jobs, e.g. 10k,1M."),
    click.option("--scan-due", type=click.IntRange(min=1), help="scan: due slots per pass."),
    click.option("--scan-passes", type=click.IntRange(min=1)),
    click.option("--memory-jobs", type=COUNTS, help="memory: stored jobs, e.g. 1M."),
    click.option("--memory-settle", type=DURATION, help="memory: sampling time per phase."),
    click.option("--memory-due-jobs", type=click.IntRange(min=0)),
    click.option("--failover-rounds", type=click.IntRange(min=1)),
    click.option("--soak-runs", type=click.IntRange(min=1), help="soak: runs in all (10,000)."),
    click.option("--soak-jobs", type=click.IntRange(min=1), help="soak: jobs sharing them."),
    click.option("--soak-interval", type=DURATION, help="soak: each job's interval (>= 1s)."),
    click.option("--soak-keep", type=click.IntRange(1, 100_000), help="soak: keep_last."),
    click.option("--soak-sample", type=DURATION, help="soak: sampling period."),
    click.option("--soak-log-grace", type=DURATION,
                 help="soak: the scheduler's log delete grace (default: its own, 120 s)."),
    click.option("--batch-jobs", type=COUNTS,
                 help="batch: jobs per batch configuration, e.g. 100k (default)."),
    click.option("--batch-size", type=click.IntRange(1, 1000),
                 help="batch: items per POST /v1/jobs:batch (1000)."),
    click.option("--batch-apis", type=click.IntRange(1, 16),
                 help="batch: API processes (default 2); 1 is measured too."),
    click.option("--batch-in-flight", type=click.IntRange(min=1),
                 help="batch: batch requests at once per API process (2)."),
    click.option("--batch-single", type=click.IntRange(min=1),
                 help="batch: jobs created one per request, for comparison (2000)."),
    click.option("--batch-single-in-flight", type=click.IntRange(min=1),
                 help="batch: single creates at once (16; one at a time is measured too)."),
    click.option("--ui-jobs", type=COUNTS, help="ui: stored jobs, e.g. 10k (default)."),
    click.option("--ui-requests", type=click.IntRange(min=1),
                 help="ui: measured GETs of each dashboard page (30)."),
]  # fmt: skip


def _with_options(fn: Any) -> Any:
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


@click.command("bench")
@_with_options
def bench(smoke: bool, report_from: Path | None, **flags: Any) -> None:
    """Benchmark etcdsched against its own embedded etcd and write the report.

    Results go to bench-results/<timestamp>.json and docs/benchmarks.md
    (figures beside it). Use --smoke first: a full run takes about an hour and a
    half (the soak alone 17 minutes).
    """
    from etcdsched.bench.options import build_options

    if flags.get("executors"):
        flags["executors"] = tuple(flags["executors"].split(","))
    if flags.get("memory_jobs"):
        flags["memory_jobs"] = max(flags["memory_jobs"])
    for counted in ("midnight_jobs", "batch_jobs", "ui_jobs"):
        if flags.get(counted):
            flags[counted] = max(flags[counted])
    flags["command_line"] = _command_line()
    options = build_options(smoke, flags)
    if report_from is not None:
        from etcdsched.bench.report import render_file

        click.echo(render_file(report_from, options.docs))
        return
    from etcdsched.bench.runner import main

    sys.exit(main(options))


def _command_line() -> str:
    argv = sys.argv[1:]
    entry = sys.argv[0].replace("\\", "/")
    if entry.endswith("bench/__main__.py"):
        program = "python -m etcdsched.bench"
    elif entry.endswith("__main__.py"):
        program = "python -m etcdsched"
    else:
        program = "etcdsched"
    if program != "python -m etcdsched.bench" and argv[:1] != ["bench"]:
        argv = ["bench", *argv]
    return " ".join([program, shlex.join(argv)]).strip()
