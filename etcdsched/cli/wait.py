"""``etcdsched run wait``: follow a run until it ends, with a progress line.

A long wait shows elapsed time, state and attempt on one refreshing stderr
line (only when stderr is a terminal; otherwise one line per state change),
so scripts can use it too: the exit status is 0 only if the run succeeded.
"""

from __future__ import annotations

import asyncio
import sys
import time

import click

from etcdsched.api.schemas import RunView
from etcdsched.client import Client

SPINNER = "|/-\\"
TERMINAL = {"succeeded", "failed", "timed_out", "lost", "cancelled", "skipped"}


async def wait_for_run(client: Client, run_id: str, timeout: float, poll: float = 0.5) -> RunView:
    """Poll the run until it is terminal or ``timeout`` seconds pass."""
    started = time.monotonic()
    interactive = sys.stderr.isatty()
    last_line = ""
    tick = 0
    while True:
        view = await client.get_run(run_id)
        state = str(view.state)
        line = f"{run_id}: {state}, attempt {view.attempt}"
        elapsed = time.monotonic() - started
        if interactive:
            spin = SPINNER[tick % len(SPINNER)]
            click.echo(f"\r{spin} {line} ({elapsed:.0f}s)\x1b[K", err=True, nl=False)
        elif line != last_line:
            click.echo(line, err=True)
        last_line, tick = line, tick + 1
        if state in TERMINAL or elapsed >= timeout:
            if interactive:
                click.echo("", err=True)
            return view
        await asyncio.sleep(poll)
