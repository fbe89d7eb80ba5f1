"""The ``etcdsched`` command: client commands over the HTTP API (``job``,
``run``, ``status``, ``token``, ``tenant``) and the long-running ``up`` and
``agent`` commands.

The API URL and token come from ``--url``/``--token``, then
``ETCDSCHED_URL``/``ETCDSCHED_TOKEN``, then ``./.etcdsched/admin.token``,
then ``~/.config/etcdsched/config.yaml`` (keys ``url`` and ``token``).
Human-readable tables by default; ``--output json`` for scripts.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TextIO

import aiohttp
import click

from etcdsched.bench.command import bench
from etcdsched.cli import job_batch, run_view, yaml_io
from etcdsched.cli import support as out
from etcdsched.cli.context import Cli, pass_cli
from etcdsched.cli.job_edit import job_edit
from etcdsched.cli.job_set import job_set
from etcdsched.cli.processes import agent, up
from etcdsched.cli.tokens import token
from etcdsched.cli.webhooks import run_deliveries, webhook
from etcdsched.client import Client
from etcdsched.model.errors import EtcdschedError, Unauthorized


class _Main(click.Group):
    """Turns API errors into one line on stderr and exit status 1, and
    takes ``-o``/``--output`` anywhere on the line (before ``--``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_output(args))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EtcdschedError as exc:
            where = f" (field: {exc.field})" if exc.field else ""
            click.echo(f"error: {exc.code}: {exc.message}{where}", err=True)
            if isinstance(exc, Unauthorized) and isinstance(ctx.obj, Cli):
                conn = ctx.obj.connection()
                click.echo(f"the URL and token came from {conn.source} ({conn.url})", err=True)
            ctx.exit(1)
        except aiohttp.ClientError as exc:
            click.echo(f"error: cannot reach the API: {exc}", err=True)
            ctx.exit(1)


def hoist_output(args: list[str]) -> list[str]:
    """``args`` with every ``-o X``, ``-oX``, ``--output X`` and
    ``--output=X`` moved to the front, where the group reads it; nothing
    after ``--`` (a job's own command) is touched."""
    head: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg in ("-o", "--output") and i + 1 < len(args):
            head += args[i : i + 2]
            i += 2
            continue
        (head if arg.startswith(("--output=", "-o")) and arg != "-o" else rest).append(arg)
        i += 1
    return head + rest


@click.group(cls=_Main)
@click.option("--url", envvar="ETCDSCHED_URL", help="API base URL.")
@click.option("--token", envvar="ETCDSCHED_TOKEN", help="Bearer token.")
@click.option(
    "--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_context
def main(ctx: click.Context, url: str | None, token: str | None, output: str) -> None:
    """etcdsched: a distributed job scheduler whose state lives in etcd."""
    ctx.obj = Cli(url, token, output)


# -- jobs ----------------------------------------------------------------------
@main.group()
def job() -> None:
    """Create, list and change jobs."""


@job.command("create")
@click.option(
    "-f",
    "--file",
    "file",
    type=click.File("r"),
    help="YAML/JSON: one job ({id?, spec}) or many (a list, {items: [...]}, several YAML"
    " documents); '-' reads stdin.",
)
@click.option("--id", "job_id", help="Job id (default: generated).")
@click.option("--cron", help="Cron expression, e.g. '*/5 * * * *'.")
@click.option("--tz", help="Time zone of --cron (IANA name).")
@click.option("--every", help="Interval, e.g. 30s, 5m.")
@click.option("--at", help="Once at an RFC 3339 instant.")
@click.option("--now", is_flag=True, help="Once, now.")
@click.option("--after", multiple=True, help="Each time these jobs have run (repeatable).")
@click.option("--on", type=click.Choice(["success", "completion"]), help="With --after.")
@click.option("--depends-on", multiple=True, help="Upstream job of each slot (repeatable).")
@click.option("--timeout", help="Per-attempt timeout, e.g. 10m.")
@click.option("--retries", type=click.IntRange(0, 99), help="Retries after the first attempt.")
@click.option("--tenant")
@click.option("--description")
@click.option("--label", "labels", multiple=True, help="k=v (repeatable).")
@click.option("--shell", is_flag=True, help="Run the command through /bin/sh -c.")
@click.option("--idempotency-key", help="Retry-safe creation key (many jobs: KEY/<index>).")
@click.argument("command", nargs=-1)
@pass_cli
def job_create(cli: Cli, /, file: TextIO | None, job_id: str | None, **flags: Any) -> None:
    """Create a job: from -f FILE and/or flags, with the command after '--'.

    A file of many jobs creates them all, up to 1000 per request, with the
    flags applied to each: it prints a summary and every failed item, and
    exits 1 if any failed."""
    documents = yaml_io.read_documents(file.read(), yaml_io.name_of(file)) if file else []
    flags["trigger"] = out.trigger_from_flags(flags)
    key = flags.pop("idempotency_key")
    many = job_batch.many_jobs(documents)
    if many is not None:
        _create_many(cli, many, job_id, flags, key)
        return
    file_id, spec = out.job_document(documents[0] if documents else None) if file else (None, {})
    spec = out.apply_flags(spec, flags)
    created = cli.call(lambda c: c.create_job(spec, job_id or file_id, key))
    view = cli.call(lambda c: c.get_job(created.id))  # the view carries the next slot
    out.emit(cli.output, created, out.job_fields(created, view.next_slot_ms, created=True))


def _create_many(
    cli: Cli, documents: list[Any], job_id: str | None, flags: dict[str, Any], key: str | None
) -> None:
    if job_id:
        raise click.UsageError("--id names one job; give each job in the file its own id")
    if not documents:
        raise click.BadParameter("the file holds no jobs", param_hint="--file")
    items = [job_batch.batch_item(doc, index, flags, key) for index, doc in enumerate(documents)]
    tally = job_batch.Tally()
    try:
        cli.call(lambda c: job_batch.send_all(c, items, job_batch.Progress(len(items)), tally))
    except (EtcdschedError, aiohttp.ClientError):
        job_batch.report(cli.output, tally)
        click.echo(
            f"items[{len(tally.results)}] and after: not known to be created (the request"
            " failed); with --idempotency-key, running the same file again is safe",
            err=True,
        )
        raise
    job_batch.report(cli.output, tally)
    if tally.failures:
        raise SystemExit(1)


@job.command("ls")
@click.option("--tenant")
@click.option("--state", type=click.Choice(["active", "paused"]))
@click.option("--label", "labels", multiple=True, help="k=v (repeatable, ANDed).")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--cursor")
@pass_cli
def job_ls(
    cli: Cli,
    tenant: str | None,
    state: str | None,
    labels: tuple[str, ...],
    limit: int,
    cursor: str | None,
) -> None:
    """List jobs."""
    pairs = out.parse_pairs(labels, "--label")
    page = cli.call(
        lambda c: c.list_jobs(tenant=tenant, state=state, labels=pairs, cursor=cursor, limit=limit)
    )
    out.emit(cli.output, page, out.job_rows(page.items))
    if page.next_cursor and cli.output == "table":
        click.echo(f"(more: --cursor {page.next_cursor})", err=True)


@job.command("get")
@click.argument("job_id")
@pass_cli
def job_get(cli: Cli, job_id: str) -> None:
    """Show a job."""
    view = cli.call(lambda c: c.get_job(job_id))
    out.emit(cli.output, view, out.job_fields(view, view.next_slot_ms))


@job.command("pause")
@click.argument("job_id")
@pass_cli
def job_pause(cli: Cli, job_id: str) -> None:
    """Stop scheduling new slots."""
    result = cli.call(lambda c: c.pause_job(job_id))
    out.emit(cli.output, result, f"{job_id} paused")


@job.command("resume")
@click.argument("job_id")
@click.option("--catch-up", type=click.Choice(["skip", "run_once"]), default="skip")
@pass_cli
def job_resume(cli: Cli, job_id: str, catch_up: str) -> None:
    """Schedule again; slots missed while paused are skipped or run once."""
    result = cli.call(lambda c: c.resume_job(job_id, catch_up))
    out.emit(cli.output, result, f"{job_id} resumed")


@job.command("trigger")
@click.argument("job_id")
@click.option("--force", is_flag=True, help="Even if the overlap policy is 'skip'.")
@pass_cli
def job_trigger(cli: Cli, job_id: str, force: bool) -> None:
    """Run a job now."""
    run = cli.call(lambda c: c.trigger_job(job_id, force))
    out.emit(cli.output, run, run.id)


@job.command("rm")
@click.argument("job_id")
@click.option("--cancel-active", is_flag=True, help="Also cancel its active runs.")
@pass_cli
def job_rm(cli: Cli, job_id: str, cancel_active: bool) -> None:
    """Delete a job (its run history stays until retention)."""
    result = cli.call(lambda c: c.delete_job(job_id, cancel_active))
    human = f"{job_id} deleted"
    if result.active_runs:
        human += f"; active runs: {len(result.active_runs)}, cancelled: {len(result.cancelled)}"
    out.emit(cli.output, result, human)


@job.command("backfill")
@click.argument("job_id")
@click.option("--start", required=True, type=out.Rfc3339(), help="RFC 3339 (UTC if naive).")
@click.option("--end", required=True, type=out.Rfc3339(), help="RFC 3339 (UTC if naive).")
@pass_cli
def job_backfill(cli: Cli, job_id: str, start: datetime, end: datetime) -> None:
    """Create runs for the slots in [start, end] that have none."""
    result = cli.call(lambda c: c.backfill_job(job_id, start, end))
    out.emit(cli.output, result, "\n".join(result.created) or "no new runs")


@job.command("runs")
@click.argument("job_id")
@click.option("--state", "states", multiple=True, help="Only these states (repeatable).")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--cursor")
@pass_cli
def job_runs(
    cli: Cli, job_id: str, states: tuple[str, ...], limit: int, cursor: str | None
) -> None:
    """List a job's runs, newest first."""
    page = cli.call(lambda c: c.list_runs(job_id, states=list(states), limit=limit, cursor=cursor))
    out.emit(cli.output, page, out.run_rows(page.items))


@job.command("skips")
@click.argument("job_id")
@pass_cli
def job_skips(cli: Cli, job_id: str) -> None:
    """List a job's skipped slots and why."""
    page = cli.call(lambda c: c.list_skips(job_id))
    out.emit(cli.output, page, out.skip_rows(page.items))


# -- runs ----------------------------------------------------------------------
@main.group()
def run() -> None:
    """Inspect and cancel runs, read their logs."""


@run.command("get")
@click.argument("run_id")
@pass_cli
def run_get(cli: Cli, run_id: str) -> None:
    """Show a run, its attempts, and why it waits."""
    view = cli.call(lambda c: c.get_run(run_id))
    reason = view.explain.pending_reason if view.explain else None
    out.emit(cli.output, view, run_view.run_fields(view, reason))


@run.command("cancel")
@click.argument("run_id")
@click.option("--reason", default="")
@pass_cli
def run_cancel(cli: Cli, run_id: str, reason: str) -> None:
    """Cancel a run (a running one is stopped by its worker)."""
    result = cli.call(lambda c: c.cancel_run(run_id, reason))
    human = f"{run_id}: {'cancel requested' if result.cancel_requested else result.state}"
    out.emit(cli.output, result, human)


@run.command("logs")
@click.argument("run_id")
@click.option("--attempt", type=click.IntRange(min=1), help="Default: the latest.")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming while it runs.")
@pass_cli
def run_logs(cli: Cli, run_id: str, attempt: int | None, follow: bool) -> None:
    """Print a run's log."""

    def write(data: bytes) -> None:
        click.echo(data, nl=False)

    if follow:
        cli.stream(lambda c: c.follow_log(run_id, attempt), write)
        return

    async def read_all(client: Client) -> None:
        offset = 0
        while True:
            chunk = await client.read_log(run_id, attempt, offset)
            write(chunk.data)
            if not chunk.data:
                return
            offset = chunk.next_offset

    cli.call(read_all)


@run.command("wait")
@click.argument("run_id")
@click.option("--timeout", type=float, default=3600, show_default=True, help="Seconds.")
@pass_cli
def run_wait(cli: Cli, run_id: str, timeout: float) -> None:
    """Wait until a run ends (progress on stderr); exit 0 only if it succeeded."""
    from etcdsched.cli.wait import wait_for_run

    view = cli.call(lambda c: wait_for_run(c, run_id, timeout))
    out.emit(cli.output, view, run_view.run_fields(view, None))
    if str(view.state) != "succeeded":
        raise SystemExit(1)


# -- cluster and admin -----------------------------------------------------------
@main.command()
@pass_cli
def status(cli: Cli) -> None:
    """Schedulers, workers, partition owners and queue depth."""
    view = cli.call(lambda c: c.cluster())
    owned: dict[str, int] = {}
    for owner in view.owners:
        owned[owner.scheduler] = owned.get(owner.scheduler, 0) + 1
    workers = out.table(
        ("WORKER", "SLOTS", "CPU", "MEMORY_MB", "GPU", "TENANTS", "LABELS"),
        (
            (
                w.id,
                w.capacity.slots,
                w.capacity.cpu,
                w.capacity.memory_mb,
                w.capacity.gpu,
                ",".join(w.tenants) or "-",
                ",".join(f"{k}={v}" for k, v in w.labels.items()) or "-",
            )
            for w in view.workers
        ),
    )
    schedulers = out.table(
        ("SCHEDULER", "PARTITIONS"), ((s.id, owned.get(s.id, 0)) for s in view.schedulers)
    )
    summary = (
        f"partitions: {view.partitions} ({len(view.unowned)} unowned)\n"
        f"queue depth: {view.queue_depth}"
    )
    out.emit(cli.output, view, f"{summary}\n\n{schedulers}\n\n{workers}")


@main.group()
def tenant() -> None:
    """Tenant limits (admin)."""


@tenant.command("set")
@click.argument("name")
@click.option("--max-jobs", type=click.IntRange(min=0))
@click.option("--max-active-runs", type=click.IntRange(min=0))
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="Submissions/second.")
@click.option(
    "--allow-loader-env", is_flag=True, help="Jobs may set LD_*, PYTHONPATH, BASH_ENV, ..."
)
@pass_cli
def tenant_set(
    cli: Cli,
    name: str,
    max_jobs: int | None,
    max_active_runs: int | None,
    rate: float | None,
    allow_loader_env: bool,
) -> None:
    """Set a tenant's limits (the whole set: unset ones become unlimited, and
    loader variables forbidden unless --allow-loader-env)."""
    limits = {
        "max_jobs": max_jobs,
        "max_active_runs": max_active_runs,
        "submissions_per_second": rate,
        "loader_env": allow_loader_env,
    }
    view = cli.call(lambda c: c.set_tenant(name, limits))
    out.emit(cli.output, view, out.fields(list(view.limits.model_dump().items())))


# -- commands of their own modules, processes, the benchmark ---------------------
job.add_command(job_edit)
job.add_command(job_set)
main.add_command(up)
main.add_command(token)
main.add_command(webhook)
run.add_command(run_deliveries)
main.add_command(agent)
main.add_command(bench)  # etcdsched.bench.command imports only click; the rest is lazy
