"""Warnings that repeat, printed once and then counted, on the CLI's stderr.

A loop that retries while the API (or etcd) is down meets the same failure
every half second; one line per retry buries the one line that matters
(what failed) and scrolls everything else away. The rule is the agent's
(:class:`~etcdsched.runtime.ratelimited_log.RateLimitedLog`): the first
occurrence in full, identical ones counted, one summary line per 30 s
(``... (repeated 12 times in the last 30 s)``) and one when the message
changes or the trouble is over. Here the lines go to stderr, not to a log,
through a private logger that no logging configuration can silence or
redirect.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from etcdsched.runtime.ratelimited_log import WINDOW_S, RateLimitedLog


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _Lines(logging.Handler):
    """Each record's message, as a line, to ``emit``."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self._emit = emit

    def emit(self, record: logging.LogRecord) -> None:
        self._emit(record.getMessage())


class RepeatedWarnings:
    """Prints warnings through ``emit`` (default: stderr), each run of
    identical ones as its first line and then summaries."""

    def __init__(
        self,
        emit: Callable[[str], None] = _stderr,
        window: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        lines = logging.Logger("etcdsched.cli.warnings", logging.WARNING)  # not in the registry
        lines.propagate = False
        lines.addHandler(_Lines(emit))
        self._log = RateLimitedLog(lines, clock, window)
        self.active = False
        """Whether a warning was printed and the trouble not yet over."""

    def warn(self, message: str) -> None:
        self._log.log(message, "%s", message)
        self.active = True

    def clear(self) -> None:
        """The trouble is over (the API answered): print the repeats not
        yet said; the warning, if it comes back, is printed in full."""
        self._log.flush()
        self.active = False
