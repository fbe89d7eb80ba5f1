"""The CLI commands that run etcdsched itself rather than talk to its API:
``etcdsched up`` (embedded etcd plus an agent with every role) and
``etcdsched agent`` (a long-running process with the given roles)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Mapping
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


def config_option(command: Callable[..., None]) -> Callable[..., None]:
    """--config: the YAML file of settings (ETCDSCHED_CONFIG). No ``default=``
    and no ``envvar=``: the environment is read by ``Config`` itself, so a
    flag left out can never stand in for it."""
    return click.option(
        "--config",
        type=click.Path(path_type=Path),
        help="YAML file of settings (keys: the ETCDSCHED_* names without the prefix,"
        " lower-case); flags and the environment win over it (default: ETCDSCHED_CONFIG).",
    )(command)


FLAG_SETTINGS = {
    "config": "config",
    "host": "api_host",
    "port": "api_port",
    "etcd": "etcd",
    "tls_cert": "api_tls_cert",
    "tls_key": "api_tls_key",
    "reserved": "worker_reserved",
}
"""Flags and the settings they set. One rule for every setting: a flag given
wins over the environment (``ETCDSCHED_*``), which wins over the config file
(``--config``), which wins over the default. So these flags have no click
``default=`` (a default would be "given" and beat the environment) and no
``envvar=`` (the environment is ``Config``'s to read, after the flags)."""


def build_config(flags: Mapping[str, Any]) -> Config:
    """The settings of ``up`` or ``agent`` from their flags, the way the
    command builds them, so tests can check the precedence without starting
    anything. Flags left out are ``None`` and say nothing; an unusable
    file or value is said without a traceback, before anything starts."""
    from pydantic import ValidationError

    from etcdsched.config import Config, ConfigFileError

    given = {FLAG_SETTINGS[name]: value for name, value in flags.items() if value is not None}
    try:
        return Config(**given)
    except ConfigFileError as exc:
        raise click.ClickException(str(exc)) from exc
    except ValidationError as exc:
        raise click.ClickException(f"invalid settings: {exc}") from exc


def external_etcd(config: Config) -> str | None:
    """The etcd ``up`` uses instead of starting its own: the ``etcd`` setting
    when anything set it (``--etcd``, ``ETCDSCHED_ETCD`` or the config file),
    the same rule as every other setting; only its default means "start a
    private one"."""
    return config.etcd if "etcd" in config.model_fields_set else None


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
@click.option(
    "--etcd",
    help="Use this etcd cluster (host:port,...) instead of an embedded one"
    " (default: ETCDSCHED_ETCD, or the config file's etcd).",
)
@click.option(
    "--host", help="API listen address (default: ETCDSCHED_API_HOST, config file, 127.0.0.1)."
)
@click.option("--port", type=int, help="API port (default: ETCDSCHED_API_PORT, config file, 8080).")
@tls_options
@config_option
@click.option("--log-level", default="info", show_default=True)
def up(data_dir: Path, log_level: str, **flags: Any) -> None:
    """Embedded etcd plus one agent with every role (API on 127.0.0.1:8080)."""
    from etcdsched.agent import run_up

    config = build_config(flags)
    _setup_logging(log_level)
    asyncio.run(run_up(config, data_dir, external_etcd(config)))


@click.command()
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    type=click.Choice(["scheduler", "worker", "api"]),
    help="Repeatable.",
)
@click.option("--etcd", help="etcd endpoints host:port,... (default: ETCDSCHED_ETCD, config file).")
@click.option(
    "--reserved/--no-reserved",
    default=None,
    help="Worker: take only runs whose selector matches this worker's labels"
    " (default: ETCDSCHED_WORKER_RESERVED, config file, false).",
)
@tls_options
@config_option
@click.option("--log-level", default="info", show_default=True)
def agent(roles: tuple[str, ...], log_level: str, **flags: Any) -> None:
    """A long-running process with the given roles (settings from flags, then
    ETCDSCHED_*, then the --config file)."""
    from etcdsched.agent import run_agent

    config = build_config(flags)
    _setup_logging(log_level)
    asyncio.run(run_agent(config, set(roles)))
