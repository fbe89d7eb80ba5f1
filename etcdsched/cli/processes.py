"""The CLI commands that run etcdsched itself rather than talk to its API:
``etcdsched up`` (embedded etcd plus an agent with every role) and
``etcdsched agent`` (a long-running process with the given roles)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import click


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@click.command()
@click.option(
    "--data-dir", type=click.Path(path_type=Path), default=Path(".etcdsched"), show_default=True
)
@click.option("--etcd", help="Use this etcd cluster (host:port,...) instead of an embedded one.")
@click.option("--host", default="127.0.0.1", show_default=True, help="API listen address.")
@click.option("--port", type=int, default=8080, show_default=True, help="API port.")
@click.option("--log-level", default="info", show_default=True)
def up(data_dir: Path, etcd: str | None, host: str, port: int, log_level: str) -> None:
    """Embedded etcd plus one agent with every role (API on 127.0.0.1:8080)."""
    from etcdsched.agent import run_up
    from etcdsched.config import Config

    _setup_logging(log_level)
    config = Config(api_host=host, api_port=port)
    asyncio.run(run_up(config, data_dir, etcd))


@click.command()
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    type=click.Choice(["scheduler", "worker", "api"]),
    help="Repeatable.",
)
@click.option("--etcd", help="etcd endpoints host:port,... (default: ETCDSCHED_ETCD).")
@click.option("--log-level", default="info", show_default=True)
def agent(roles: tuple[str, ...], etcd: str | None, log_level: str) -> None:
    """A long-running process with the given roles (settings from ETCDSCHED_*)."""
    from etcdsched.agent import run_agent
    from etcdsched.config import Config

    _setup_logging(log_level)
    config = Config() if etcd is None else Config(etcd=etcd)
    asyncio.run(run_agent(config, set(roles)))
