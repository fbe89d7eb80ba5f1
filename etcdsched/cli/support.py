"""Helpers of the CLI: where the API and token come from, building a job
spec from flags, and printing tables."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import BaseModel

from etcdsched.client import DEFAULT_URL
from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.records import JobRecord, RunRecord, SkipRecord
from etcdsched.model.triggers import AfterTrigger, AtTrigger, describe, next_slot

LOCAL_TOKEN = Path(".etcdsched") / "admin.token"


def config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "etcdsched" / "config.yaml"


def _file_settings() -> dict[str, str]:
    path = config_file()
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise click.ClickException(f"{path} must be a mapping with 'url' and 'token'")
    return {str(k): str(v) for k, v in data.items() if v is not None}


@dataclass(frozen=True)
class Connection:
    """Where the API is and the token to call it with, both from one place."""

    url: str
    token: str | None
    source: str
    """Where they came from, said in errors."""


LOOKED_AT = (
    "--url/--token, ETCDSCHED_URL/ETCDSCHED_TOKEN, ~/.config/etcdsched/config.yaml,"
    " ./.etcdsched/admin.token"
)


def resolve_connection(url: str | None, token: str | None) -> Connection:
    """One rule, the first that says anything wins and gives both halves:

    1. ``--url``/``--token`` (or ``ETCDSCHED_URL``/``ETCDSCHED_TOKEN``);
    2. the config file (``~/.config/etcdsched/config.yaml``: ``url``, ``token``);
    3. ``./.etcdsched/admin.token`` (left by ``etcdsched up``), with the
       local URL, only when no URL was configured above.

    A URL never pairs with a token from another place, so a token found in
    the current directory cannot be sent to a configured remote API."""
    if url or token:
        return Connection(url or DEFAULT_URL, token, "--url/--token or ETCDSCHED_URL/_TOKEN")
    settings = _file_settings()
    if settings.get("url") or settings.get("token"):
        url_ = settings.get("url", DEFAULT_URL)
        return Connection(url_, settings.get("token"), str(config_file()))
    if LOCAL_TOKEN.is_file():
        local = LOCAL_TOKEN.read_text().strip() or None
        return Connection(DEFAULT_URL, local, f"./{LOCAL_TOKEN}")
    return Connection(DEFAULT_URL, None, f"nowhere (looked at {LOOKED_AT})")


# -- job specs from flags ----------------------------------------------------
def job_document(data: object) -> tuple[str | None, dict[str, Any]]:
    """One job of a job file: ``{id?, spec}`` or a bare spec."""
    if not isinstance(data, dict):
        raise click.BadParameter("the job file must hold a mapping", param_hint="--file")
    if "spec" in data:
        extra = set(data) - {"id", "spec"}
        if extra:
            raise click.BadParameter(f"unknown keys {sorted(extra)}", param_hint="--file")
        return data.get("id"), dict(data["spec"])
    return None, data


def trigger_from_flags(flags: dict[str, Any]) -> dict[str, Any] | None:
    """The trigger the flags name (taken out of ``flags``), or None."""
    cron, tz, every, at, now = (flags.pop(name) for name in ("cron", "tz", "every", "at", "now"))
    after, on = flags.pop("after"), flags.pop("on")
    chosen = [name for name, value in (("cron", cron), ("every", every), ("at", at)) if value]
    chosen += ["now"] if now else []
    chosen += ["after"] if after else []
    if len(chosen) > 1:
        raise click.UsageError(
            f"choose one of --cron, --every, --at, --now, --after (got {chosen})"
        )
    if tz and not cron:
        raise click.UsageError("--tz goes with --cron")
    if on and not after:
        raise click.UsageError("--on goes with --after")
    if cron:
        return {"kind": "cron", "expr": cron, "tz": tz or "UTC"}
    if every:
        return {"kind": "interval", "every": every}
    if at:
        return {"kind": "at", "at": at}
    if after:
        return {"kind": "after", "jobs": list(after), "on": on or "success"}
    return {"kind": "now"} if now else None


def apply_flags(spec: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """Flags given on the command line override the file."""
    if flags["trigger"] is not None:
        spec["trigger"] = flags["trigger"]
    if flags["command"]:
        spec["execution"] = {"argv": list(flags["command"]), "shell": flags["shell"]}
    for name in ("timeout", "tenant", "description"):
        if flags[name] is not None:
            spec[name] = flags[name]
    if flags["depends_on"]:
        spec["depends_on"] = [*spec.get("depends_on", []), *flags["depends_on"]]
    if flags["retries"] is not None:
        spec["retry"] = {**spec.get("retry", {}), "max_attempts": flags["retries"] + 1}
    if flags["labels"]:
        spec["labels"] = {**spec.get("labels", {}), **parse_pairs(flags["labels"], "--label")}
    return spec


def parse_pairs(values: Iterable[str], hint: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not key=value", param_hint=hint)
        pairs[key] = val
    return pairs


# -- output ------------------------------------------------------------------
def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return ms_to_utc(ms).isoformat(timespec="seconds").replace("+00:00", "Z")


def when_ms(ms: int | None) -> str:
    """RFC 3339 UTC to the millisecond, ``2026-12-07T04:38:17.123Z``: what
    tells apart the events of one run (an attempt lost, the next started),
    which are often within the same second."""
    if ms is None:
        return "-"
    return ms_to_utc(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Plain aligned columns."""
    cells = [list(headers), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def fields(pairs: Sequence[tuple[str, object]]) -> str:
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name + ':':<{width + 1}} {value}" for name, value in pairs)


def emit(output: str, model: BaseModel, human: str) -> None:
    click.echo(model.model_dump_json(indent=2) if output == "json" else human)


def job_rows(jobs: Iterable[JobRecord]) -> str:
    rows = (
        (
            job.id,
            job.spec.tenant,
            job.state,
            describe(job.spec.trigger),
            ",".join(f"{k}={v}" for k, v in job.spec.labels.items()) or "-",
        )
        for job in jobs
    )
    return table(("ID", "TENANT", "STATE", "TRIGGER", "LABELS"), rows)


def job_fields(job: JobRecord, next_slot_ms: int | None = None, *, created: bool = False) -> str:
    """A job's fields; just ``created``, with its first slot too: by the
    time the view is read, a first slot due at once (an interval's, a
    ``now``) may have fired and the next one be the second."""
    execution = job.spec.execution
    what = " ".join(execution.argv) if execution.kind == "command" else execution.image
    first = [("first slot", when(first_slot_ms(job)))] if created else []
    return fields(
        [
            ("id", job.id),
            ("tenant", job.spec.tenant),
            ("state", job.state),
            ("version", job.version),
            ("trigger", describe(job.spec.trigger)),
            ("runs", what),
            *first,
            ("next slot", when(next_slot_ms)),
            ("created", when(job.created_ms)),
        ]
    )


def first_slot_ms(job: JobRecord) -> int | None:
    """The slot a new job was scheduled for when it was created (none for
    an ``after`` job: its runs come when its upstream jobs end)."""
    trigger = job.spec.trigger
    if isinstance(trigger, AfterTrigger):
        return None
    if isinstance(trigger, AtTrigger):
        return trigger.at_ms
    return next_slot(trigger, job.created_ms - 1, job.anchor_ms)


def run_rows(runs: Iterable[RunRecord]) -> str:
    rows = (
        (r.id, r.state, when(r.slot_ms), r.attempt, _last_worker(r), r.reason or "-") for r in runs
    )
    return table(("RUN", "STATE", "SLOT", "ATTEMPT", "WORKER", "REASON"), rows)


def _last_worker(run: RunRecord) -> str:
    """The worker of the run's current or last attempt (a finished run has
    none of its own any more)."""
    last = run.worker or (run.current.worker if run.current is not None else None)
    return last or "-"


def skip_rows(skips: Iterable[SkipRecord]) -> str:
    rows = ((when(s.first_slot_ms), when(s.last_slot_ms), s.count, s.reason) for s in skips)
    return table(("FIRST", "LAST", "COUNT", "REASON"), rows)


class Rfc3339(click.ParamType[datetime]):
    """An instant as RFC 3339: with ``Z`` or an offset (``+00:00``), or
    naive and then read as UTC. ``click.DateTime`` knew neither suffix."""

    name = "rfc3339"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        try:
            parsed = datetime.fromisoformat(str(value))
        except ValueError:
            self.fail(
                f"{value!r} is not an RFC 3339 instant (e.g. 2026-12-01T00:00:00Z)", param, ctx
            )
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
