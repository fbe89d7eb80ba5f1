"""The CLI commands that run etcdsched itself rather than talk to its API:
``etcdsched up`` (embedded etcd plus an agent with every role) and
``etcdsched agent`` (a long-running process with the given roles)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from etcdsched.config import Config


def tls_options(command: Callable[..., None]) -> Callable[..., None]:
    """--tls-cert/--tls-key: the API over HTTPS (ETCDSCHED_API_TLS_CERT/_KEY)."""
    cert = click.option("--tls-cert", type=click.Path(path_type=Path), help="API certificate.")
    key = click.option("--tls-key", type=click.Path(path_type=Path), help="API private key.")
    return cert(key(command))


FLAG_SETTINGS = {
    "host": "api_host",
    "port": "api_port",
    "etcd": "etcd",
    "tls_cert": "api_tls_cert",
    "tls_key": "api_tls_key",
    "reserved": "worker_reserved",
}
"""Flags and the settings they set. One rule for every setting: a flag
given wins over the environment (``ETCDSCHED_*``), which wins over the default."""


def _config(flags: dict[str, Any]) -> Config:
    from etcdsched.config import Config

    given = {FLAG_SETTINGS[name]: value for name, value in flags.items() if value is not None}
    return Config(**given)


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
@click.option("--host", help="API listen address (default: ETCDSCHED_API_HOST, or 127.0.0.1).")
@click.option("--port", type=int, help="API port (default: ETCDSCHED_API_PORT, or 8080).")
@tls_options
@click.option("--log-level", default="info", show_default=True)
def up(data_dir: Path, etcd: str | None, log_level: str, **flags: Any) -> None:
    """Embedded etcd plus one agent with every role (API on 127.0.0.1:8080)."""
    from etcdsched.agent import run_up

    _setup_logging(log_level)
    asyncio.run(run_up(_config(flags), data_dir, etcd))


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
@click.option(
    "--reserved",
    is_flag=True,
    default=None,
    help="Worker: take only runs whose selector matches this worker's labels"
    " (default: ETCDSCHED_WORKER_RESERVED).",
)
@tls_options
@click.option("--log-level", default="info", show_default=True)
def agent(roles: tuple[str, ...], log_level: str, **flags: Any) -> None:
    """A long-running process with the given roles (settings from ETCDSCHED_*)."""
    from etcdsched.agent import run_agent

    _setup_logging(log_level)
    asyncio.run(run_agent(_config(flags), set(roles)))
