"""``etcdsched webhook create|ls|delete`` and ``etcdsched run deliveries``
(docs/webhooks.md). A webhook's secret is read from a file (or stdin with
``-``), never taken as a flag: flags end up in shell histories and in
every process listing of the machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from etcdsched.cli import support as out
from etcdsched.cli.context import Cli, pass_cli
from etcdsched.model.notify import EVENT_KINDS


@click.group()
def webhook() -> None:
    """A tenant's webhooks: where run outcomes are POSTed, signed."""


@webhook.command("create")
@click.argument("name")
@click.option("--tenant", required=True, help="The tenant the webhook belongs to.")
@click.option("--url", required=True, help="https://... (http:// only if an admin allows).")
@click.option(
    "--event",
    "events",
    multiple=True,
    type=click.Choice(EVENT_KINDS),
    help="Sent for every job of the tenant (repeat); none: only jobs whose notify names it.",
)
@click.option(
    "--secret-file",
    type=click.Path(path_type=Path, allow_dash=True),
    help="File holding the signing secret (first line; '-': stdin). Required to create.",
)
@click.option("--allow-http", is_flag=True, default=None, help="Admin: allow http://.")
@click.option(
    "--allow-private", is_flag=True, default=None, help="Admin: allow loopback/private targets."
)
@pass_cli
def webhook_create(
    cli: Cli,
    name: str,
    tenant: str,
    url: str,
    events: tuple[str, ...],
    secret_file: Path | None,
    allow_http: bool | None,
    allow_private: bool | None,
) -> None:
    """Create or replace a webhook (without --secret-file, the stored secret stays)."""
    body: dict[str, Any] = {"url": url, "events": list(events)}
    if secret_file is not None:
        body["secret"] = read_secret(secret_file)
    if allow_http is not None:
        body["allow_http"] = allow_http
    if allow_private is not None:
        body["allow_private"] = allow_private
    view = cli.call(lambda c: c.put_webhook(tenant, name, body))
    out.emit(cli.output, view, f"webhook {tenant}/{view.name} -> {view.url}")


def read_secret(path: Path) -> str:
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    lines = text.splitlines()
    return lines[0].strip() if lines else ""


@webhook.command("ls")
@click.option("--tenant", required=True)
@pass_cli
def webhook_ls(cli: Cli, tenant: str) -> None:
    """The tenant's webhooks (never their secrets)."""
    hooks = cli.call(lambda c: c.list_webhooks(tenant))
    rows = (
        (h.name, h.url, ",".join(h.events) or "-", _allowances(h.allow_http, h.allow_private))
        for h in hooks.items
    )
    out.emit(cli.output, hooks, out.table(("NAME", "URL", "EVENTS", "ALLOWED"), rows))


def _allowances(allow_http: bool, allow_private: bool) -> str:
    allowed = [word for word, on in (("http", allow_http), ("private", allow_private)) if on]
    return ",".join(allowed) or "-"


@webhook.command("delete")
@click.argument("name")
@click.option("--tenant", required=True)
@pass_cli
def webhook_delete(cli: Cli, tenant: str, name: str) -> None:
    """Delete a webhook; its pending deliveries then fail (no destination)."""
    cli.call(lambda c: c.delete_webhook(tenant, name))
    click.echo(f"deleted webhook {tenant}/{name}")


@click.command("deliveries")
@click.argument("run_id")
@pass_cli
def run_deliveries(cli: Cli, run_id: str) -> None:
    """A run's webhook deliveries: event, webhook, state, attempts, last answer."""
    found = cli.call(lambda c: c.run_deliveries(run_id))
    rows = (
        (
            d.event_id[:12],
            d.kind,
            d.webhook,
            d.state,
            d.attempts,
            d.last_status if d.last_status is not None else "-",
            out.when(d.ended_ms or d.last_attempt_ms),
            d.last_error or "-",
        )
        for d in found.items
    )
    headers = ("EVENT", "KIND", "WEBHOOK", "STATE", "ATTEMPTS", "STATUS", "AT", "LAST ERROR")
    out.emit(cli.output, found, out.table(headers, rows))
