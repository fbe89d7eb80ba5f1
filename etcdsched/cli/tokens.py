"""``etcdsched token``: create, list and revoke API tokens through the API,
and ``bootstrap`` the first admin token of a cluster straight in etcd."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from etcdsched.api.auth import ROLE_RANK, Role, bootstrap_admin_token
from etcdsched.cli import support as out
from etcdsched.cli.context import Cli, pass_cli
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.etcd import EtcdOptions, EtcdStore
from etcdsched.store.keys import Keys

ROLES = sorted(ROLE_RANK, key=ROLE_RANK.__getitem__)


@click.group()
def token() -> None:
    """API tokens: roles viewer < editor < tenant-admin < admin."""


@token.command("create")
@click.option("--name", required=True, help="Who or what holds the token.")
@click.option("--tenant", help="Default: your own tenant.")
@click.option("--role", type=click.Choice(ROLES), default="editor", show_default=True)
@click.option("--expires-in", help="e.g. 30d, 12h (default: never).")
@pass_cli
def token_create(
    cli: Cli, name: str, tenant: str | None, role: Role, expires_in: str | None
) -> None:
    """Create a token; the secret is printed once, and kept nowhere."""
    created = cli.call(lambda c: c.create_token(name, tenant, role, expires_in))
    out.emit(cli.output, created, created.token)


@token.command("ls")
@pass_cli
def token_ls(cli: Cli) -> None:
    """Tokens you may manage (never their secrets)."""
    tokens = cli.call(lambda c: c.list_tokens())
    rows = (
        (t.id[:16], t.tenant, t.role, t.name, out.when(t.created_ms), out.when(t.expires_ms),
         out.when(t.last_used_ms or None))
        for t in tokens.items
    )  # fmt: skip
    headers = ("ID", "TENANT", "ROLE", "NAME", "CREATED", "EXPIRES", "LAST USED")
    out.emit(cli.output, tokens, out.table(headers, rows))


@token.command("revoke")
@click.argument("token_id")
@pass_cli
def token_revoke(cli: Cli, token_id: str) -> None:
    """Revoke a token by its id (from ``token ls``, the full 64 digits)."""
    cli.call(lambda c: c.revoke_token(token_id))
    click.echo(f"revoked {token_id}")


@token.command("bootstrap")
@click.option("--etcd", envvar="ETCDSCHED_ETCD", required=True, help="host:port,...")
@click.option("--etcd-user", envvar="ETCDSCHED_ETCD_USER")
@click.option(
    "--etcd-password-file", envvar="ETCDSCHED_ETCD_PASSWORD_FILE", type=click.Path(path_type=Path)
)
@click.option("--etcd-ca-cert", envvar="ETCDSCHED_ETCD_CA_CERT", type=click.Path(path_type=Path))
@click.option("--etcd-cert", envvar="ETCDSCHED_ETCD_CERT", type=click.Path(path_type=Path))
@click.option("--etcd-key", envvar="ETCDSCHED_ETCD_KEY", type=click.Path(path_type=Path))
@click.option("--prefix", envvar="ETCDSCHED_PREFIX", default="/etcdsched/", show_default=True)
@click.option("--name", default="bootstrap", show_default=True)
def token_bootstrap(
    etcd: str,
    etcd_user: str | None,
    etcd_password_file: Path | None,
    etcd_ca_cert: Path | None,
    etcd_cert: Path | None,
    etcd_key: Path | None,
    prefix: str,
    name: str,
) -> None:
    """The cluster's first admin token, written straight into etcd and
    printed once. Refused if an admin token exists or one was bootstrapped."""
    password = etcd_password_file.read_text().strip() if etcd_password_file else None
    options = EtcdOptions(
        endpoints=tuple(e.strip() for e in etcd.split(",") if e.strip()),
        ca_cert=etcd_ca_cert,
        cert=etcd_cert,
        key=etcd_key,
        username=etcd_user,
        password=password,
    )
    click.echo(asyncio.run(_bootstrap(options, Keys(prefix), name)))


async def _bootstrap(options: EtcdOptions, keys: Keys, name: str) -> str:
    store = await EtcdStore.connect(options)
    try:
        return await bootstrap_admin_token(store, keys, SystemClock().now_ms(), name)
    finally:
        await store.close()
