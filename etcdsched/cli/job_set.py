"""``etcdsched job set ID --FLAG ...``: the common changes to a job without
a file or an editor.

The job is read, the flags change its spec, and the spec is saved with
``If-Match`` of the version read, so a change made meanwhile by someone
else is refused, not silently undone. ``--pause``/``--resume`` go through
their own routes (pausing is not a spec change and has no version), after
the spec is saved.
"""

from __future__ import annotations

from typing import Any

import click

from etcdsched.cli import support as out
from etcdsched.cli.context import Cli, pass_cli
from etcdsched.cli.job_edit import is_stale, save_spec, spec_data
from etcdsched.cli.yaml_io import CliFailure
from etcdsched.model.errors import EtcdschedError
from etcdsched.model.records import JobRecord

SPEC_FLAGS = ("cron", "tz", "every", "at", "timeout", "retries", "priority", "description")
_KEPT_BY_EVERY_TRIGGER = ("start_at", "end_at", "max_runs")


def new_trigger(
    old: dict[str, Any], cron: str | None, tz: str | None, every: str | None, at: str | None
) -> dict[str, Any] | None:
    """The trigger the flags ask for, None if they name none. The same kind
    keeps its other settings (``--cron`` keeps the zone, ``--tz`` alone
    changes only the zone of a cron job); a new kind keeps the bounds every
    kind has (``start_at``, ``end_at``, ``max_runs``)."""
    chosen = [name for name, value in (("cron", cron), ("every", every), ("at", at)) if value]
    if len(chosen) > 1:
        raise click.UsageError(f"choose one of --cron, --every, --at (got {chosen})")
    kind = old["kind"]
    if tz and not cron and kind != "cron":
        raise click.UsageError("--tz goes with --cron, or changes a cron job's zone")
    bounds = {k: old[k] for k in _KEPT_BY_EVERY_TRIGGER if old.get(k) is not None}
    if cron or tz:
        base = old if kind == "cron" else {"kind": "cron", **bounds, "tz": "UTC"}
        return {**base, "expr": cron or old.get("expr"), **({"tz": tz} if tz else {})}
    if every:
        base = old if kind == "interval" else {"kind": "interval", **bounds}
        return {**base, "every": every}
    if at:
        base = old if kind == "at" else {"kind": "at", **bounds}
        return {**base, "at": at}
    return None


def changed_spec(spec: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (JSON data, not changed) with the flags applied."""
    spec = {**spec}
    trigger = new_trigger(spec["trigger"], *(flags[k] for k in ("cron", "tz", "every", "at")))
    if trigger is not None:
        spec["trigger"] = trigger
    if flags["timeout"] is not None:
        spec["timeout"] = None if flags["timeout"].lower() in ("none", "") else flags["timeout"]
    if flags["retries"] is not None:
        spec["retry"] = {**spec["retry"], "max_attempts": flags["retries"] + 1}
    for name in ("priority", "description"):
        if flags[name] is not None:
            spec[name] = flags[name]
    if flags["labels"]:
        spec["labels"] = _relabelled(spec["labels"], flags["labels"])
    return spec


def _relabelled(labels: dict[str, str], changes: tuple[str, ...]) -> dict[str, str]:
    """``k=v`` sets a label, ``k-`` removes it (as ``kubectl label`` does)."""
    labels = {**labels}
    for change in changes:
        if change.endswith("-") and "=" not in change:
            labels.pop(change[:-1], None)
        else:
            labels.update(out.parse_pairs([change], "--label"))
    return labels


@click.command("set")
@click.argument("job_id")
@click.option("--cron", help="A new cron expression (keeps the zone of a cron job).")
@click.option("--tz", help="The cron zone (IANA name).")
@click.option("--every", help="A new interval, e.g. 30s, 5m.")
@click.option("--at", help="Once, at this RFC 3339 instant.")
@click.option("--timeout", help="Per-attempt timeout, e.g. 10m; 'none' removes it.")
@click.option("--retries", type=click.IntRange(0, 99), help="Retries after the first attempt.")
@click.option("--priority", type=click.IntRange(0, 999), help="Higher is placed first.")
@click.option("--description")
@click.option("--label", "labels", multiple=True, help="k=v sets, k- removes (repeatable).")
@click.option("--pause/--resume", "pause", default=None, help="Stop or restart scheduling.")
@click.option(
    "--catch-up",
    type=click.Choice(["skip", "run_once"]),
    help="With --resume: slots missed while paused are skipped (default) or run once.",
)
@pass_cli
def job_set(
    cli: Cli, /, job_id: str, pause: bool | None, catch_up: str | None, **flags: Any
) -> None:
    """Change a few settings of a job: its trigger, timeout, retries,
    priority, description, labels, paused or not.

    The change is saved only if nobody changed the job since it was read."""
    if catch_up and pause is not False:
        raise click.UsageError("--catch-up goes with --resume")
    asked = any(flags[name] is not None for name in SPEC_FLAGS) or flags["labels"]
    if not asked and pause is None:
        raise click.UsageError("nothing to change: give at least one option (see --help)")
    view = cli.call(lambda c: c.get_job(job_id))
    current = spec_data(view.spec)
    spec = changed_spec(current, flags)
    job: JobRecord = view
    if spec != current:
        try:
            job = save_spec(cli, job_id, spec, view.version)
        except EtcdschedError as exc:
            if not is_stale(exc):
                raise
            raise CliFailure(
                f"job {view.id} changed since it was read (version {view.version});"
                " nothing was saved: try again"
            ) from None
    if pause is not None:
        job = cli.call(
            lambda c: c.pause_job(job_id) if pause else c.resume_job(job_id, catch_up or "skip")
        )
    unchanged = spec == current and pause is None
    human = f"{job.id}: version {job.version}, {job.state}" + (" (no changes)" if unchanged else "")
    out.emit(cli.output, job, human)
