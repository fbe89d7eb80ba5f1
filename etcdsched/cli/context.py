"""What every ``etcdsched`` command gets: where the API is, with which
token, and how to print (``-o``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from etcdsched.cli import support as out
from etcdsched.client import Client, SyncClient

T = TypeVar("T")


@dataclass
class Cli:
    url: str | None
    token: str | None
    output: str

    def connection(self) -> out.Connection:
        return out.resolve_connection(self.url, self.token)

    def call(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        conn = self.connection()
        return SyncClient(conn.url, conn.token).call(fn)

    def stream(self, fn: Callable[[Client], Any], sink: Callable[[bytes], None]) -> None:
        conn = self.connection()
        SyncClient(conn.url, conn.token).stream(fn, sink)


pass_cli = click.make_pass_decorator(Cli)
