"""A one-line progress indicator on stderr for the long phases.

On a terminal the line is redrawn in place; otherwise (logs, CI) a line is
printed at most every ``every`` seconds.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(
        self, label: str, total: float | None = None, unit: str = "", every: float = 5.0
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream: TextIO = sys.stderr
        self.tty = self.stream.isatty()
        self.every = 0.25 if self.tty else every
        self.started = time.monotonic()
        self._last = 0.0
        self._width = 0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def update(self, done: float, detail: str = "") -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        self._write(self._line(done, detail, now))

    def done(self, detail: str = "") -> None:
        self._write(f"{self.label}: done in {self.elapsed:.1f}s {detail}".rstrip(), final=True)

    def _line(self, done: float, detail: str, now: float) -> str:
        elapsed = now - self.started
        if self.total:
            share = min(1.0, done / self.total)
            amount = f"{done:,.0f}/{self.total:,.0f}{self.unit} ({share:4.0%})"
            if 0.02 < share < 1:
                amount += f" eta {elapsed / share - elapsed:.0f}s"
        else:
            amount = f"{done:,.0f}{self.unit}"
        return f"{self.label}: {amount} [{elapsed:.0f}s] {detail}".rstrip()

    def _write(self, line: str, final: bool = False) -> None:
        if self.tty:
            pad = " " * max(0, self._width - len(line))
            self.stream.write(f"\r{line}{pad}" + ("\n" if final else ""))
            self._width = 0 if final else len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def note(message: str) -> None:
    """A plain status line on stderr."""
    sys.stderr.write(f"bench: {message}\n")
    sys.stderr.flush()
