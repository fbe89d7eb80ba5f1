"""What the API handlers are given: the services and the log reader seam.

Kept apart from :mod:`etcdsched.api.app` so route modules can import these
types without importing the application factory (which imports them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry

from etcdsched.runtime.clock import Clock
from etcdsched.runtime.metrics import REGISTRY
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Store


class LogChunkLike(Protocol):
    """One read of a run's log (``etcdsched.logs.store.LogChunk`` has this shape)."""

    @property
    def data(self) -> bytes: ...

    @property
    def next_offset(self) -> int:
        """Offset to pass to the next read."""

    @property
    def complete(self) -> bool:
        """True once the attempt's log is closed: nothing will be appended."""

    @property
    def attempt(self) -> int:
        """The attempt that was read (resolves ``attempt=None`` to the latest)."""


class LogReader(Protocol):
    """Where run logs are read from (a directory, or object storage).

    A log that does not exist (yet) raises :class:`~etcdsched.model.errors.NotFound`
    or returns an empty, incomplete chunk; the API treats both alike for runs
    that have not started.
    """

    async def read(
        self, run_id: str, attempt: int | None = None, offset: int = 0, limit: int = 1 << 20
    ) -> LogChunkLike:
        """Up to ``limit`` bytes of attempt ``attempt`` (``None``: latest) from ``offset``."""

    def follow(
        self,
        run_id: str,
        attempt: int | None = None,
        offset: int = 0,
        poll: Callable[[float], Awaitable[None]] = ...,
    ) -> AsyncIterator[bytes]:
        """New bytes as they are appended, until the log is complete.

        The API does not use this: a follow must also end when the *run*
        says the attempt is over (a vanished worker never completes its
        log), so the API polls :meth:`read` and the run record together.
        """


@dataclass
class ApiServices:
    """Everything a request handler may use; no globals."""

    store: Store
    keys: Keys
    clock: Clock
    partitions: int
    jobs: JobService
    logs: LogReader
    registry: CollectorRegistry = field(default=REGISTRY)
