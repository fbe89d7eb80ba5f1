"""Warnings that repeat, said once and then counted.

A process that cannot reach etcd retries every quarter second, and each
failed retry used to log a warning: four identical lines a second per
session, hiding the one line that said what changed. :class:`RateLimitedLog`
logs the first occurrence of a warning at once, counts identical ones for a
window (30 s), and then logs one summary line::

    session 1a2b: renewal failed: etcd unavailable (repeated 119 times in the last 30 s)

"Identical" is decided by a *key* the caller chooses, not by the text: an
error's text often carries what differs every time (a timestamp, a
connection id), while the key names what the operator cares about (the
operation and the kind of error). A different key, or :meth:`flush` (the
trouble is over: a renewal succeeded), writes the pending summary at once,
so a count is never lost and never attributed to the wrong warning.

The clock is a parameter (a :class:`~etcdsched.runtime.clock.Clock`'s
``monotonic``), so tests drive the window with a fake one. Safe to use from
several threads: one lock guards the state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 30.0


@dataclass
class _Pending:
    """The warning being counted: its key, its first text, the window start,
    its latest occurrence and how many repeats were not written."""

    key: str
    text: str
    since: float
    last: float
    repeats: int = 0


class RateLimitedLog:
    """One logger's repeating warnings; see the module docstring."""

    def __init__(
        self,
        logger: logging.Logger,
        monotonic: Callable[[], float] = time.monotonic,
        window_s: float = WINDOW_S,
        level: int = logging.WARNING,
    ) -> None:
        self._logger = logger
        self._monotonic = monotonic
        self._window_s = window_s
        self._level = level
        self._pending: _Pending | None = None
        self._lock = threading.Lock()

    def log(self, key: str, message: str, *args: object) -> None:
        """Log ``message % args`` now if ``key`` is new, or had stopped for a
        window; else count it, and once its window has ended write the
        summary (this occurrence then opens the next window, counted)."""
        now = self._monotonic()
        with self._lock:
            pending = self._pending
            if pending is not None and pending.key == key and now - pending.last < self._window_s:
                pending.last = now
                if now - pending.since < self._window_s:
                    pending.repeats += 1
                    return
                self._summarise(pending, now)
                self._pending = _Pending(key, pending.text, now, now, repeats=1)
                return
            if pending is not None:  # another warning, or this one after a quiet window
                self._summarise(pending, pending.last)
            text = message % args if args else message
            self._logger.log(self._level, "%s", text)
            self._pending = _Pending(key, text, now, now)

    def flush(self) -> None:
        """The trouble is over: write the pending summary now (if any
        repeats were counted), and forget the warning, so its next
        occurrence is written in full."""
        with self._lock:
            if self._pending is not None:
                self._summarise(self._pending, self._pending.last)
            self._pending = None

    def _summarise(self, pending: _Pending, until: float) -> None:
        """The summary of ``pending``'s window, ended at ``until``."""
        if pending.repeats == 0:
            return
        seconds = max(1, round(until - pending.since))
        self._logger.log(
            self._level,
            "%s (repeated %d times in the last %d s)",
            pending.text,
            pending.repeats,
            seconds,
        )
