"""``etcdsched run wait``: follow a run until it ends, with a progress line.

A long wait shows elapsed time, state and attempt on one refreshing stderr
line (only when stderr is a terminal; otherwise one line per state change),
so scripts can use it too: the exit status is 0 only if the run succeeded.

A wait outlives a restart of the API or a failover of etcd: while the API
cannot be reached (or answers that its store is unavailable) it keeps
polling until its timeout, and says so once, then in summaries
(:class:`~etcdsched.cli.warnings.RepeatedWarnings`), not once per poll.
"""

from __future__ import annotations

import asyncio
import sys
import time

import aiohttp
import click

from etcdsched.api.schemas import RunView
from etcdsched.cli.warnings import RepeatedWarnings
from etcdsched.client import Client
from etcdsched.model.errors import StoreUnavailable
from etcdsched.model.states import RunState

SPINNER = "|/-\\"
TERMINAL = {state.value for state in RunState if state.terminal}
TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, StoreUnavailable)
"""Failures a later poll may not meet: the API restarting, etcd failing over."""


async def wait_for_run(
    client: Client,
    run_id: str,
    timeout: float,
    poll: float = 0.5,
    warnings: RepeatedWarnings | None = None,
) -> RunView:
    """Poll the run until it is terminal or ``timeout`` seconds pass. An
    API still unreachable at the timeout raises its last error."""
    started = time.monotonic()
    progress = _Progress(run_id, sys.stderr.isatty())
    warnings = warnings or RepeatedWarnings(progress.warning)
    while True:
        elapsed = time.monotonic() - started
        view = await _read(client, run_id, warnings, last=elapsed >= timeout)
        if view is not None:
            progress.show(view, elapsed)
            if str(view.state) in TERMINAL or elapsed >= timeout:
                progress.close()
                return view
        await asyncio.sleep(poll)


async def _read(
    client: Client, run_id: str, warnings: RepeatedWarnings, last: bool
) -> RunView | None:
    """The run; None after a transient failure (warned), which raises if
    this is the ``last`` try."""
    try:
        view = await client.get_run(run_id)
    except TRANSIENT as exc:
        warnings.warn(f"warning: cannot reach the API, retrying: {_said(exc)}")
        if last:
            warnings.clear()
            raise
        return None
    if warnings.active:
        warnings.clear()
        click.echo("the API answers again", err=True)
    return view


class _Progress:
    """The state line: redrawn in place on a terminal, else printed when
    it changes."""

    def __init__(self, run_id: str, interactive: bool) -> None:
        self.run_id = run_id
        self.interactive = interactive
        self.last_line = ""
        self.tick = 0

    def show(self, view: RunView, elapsed: float) -> None:
        line = f"{self.run_id}: {view.state}, attempt {view.attempt}"
        if self.interactive:
            spin = SPINNER[self.tick % len(SPINNER)]
            click.echo(f"\r{spin} {line} ({elapsed:.0f}s)\x1b[K", err=True, nl=False)
        elif line != self.last_line:
            click.echo(line, err=True)
        self.last_line, self.tick = line, self.tick + 1

    def warning(self, line: str) -> None:
        """A warning on a line of its own (over the spinner's, on a terminal)."""
        click.echo(f"\r{line}\x1b[K" if self.interactive else line, err=True)

    def close(self) -> None:
        if self.interactive:
            click.echo("", err=True)


def _said(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(message).split())
