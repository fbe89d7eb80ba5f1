"""What an attempt may use of the worker that runs it.

The attempt code (:mod:`etcdsched.worker.attempt`, :mod:`etcdsched.worker.start`,
:mod:`etcdsched.worker.report`) needs a handful of the worker's parts: its
store, clock, identity, executor, watchdog and report window. It names them
here, as a protocol that :class:`etcdsched.worker.service.WorkerService`
satisfies, instead of importing the service that imports it: the dependency
points one way, from the service down to the attempts.
"""

from __future__ import annotations

from typing import Protocol

from etcdsched.logs.store import LogStore
from etcdsched.model.spec import Resources
from etcdsched.runtime.clock import Clock
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Store
from etcdsched.store.runs import RunOps
from etcdsched.worker.admission import StartAdmission
from etcdsched.worker.executor import Executor
from etcdsched.worker.gather import GatherWindow
from etcdsched.worker.starter import Starter
from etcdsched.worker.watchdog import Watchdog


class WorkerHost(Protocol):
    """The worker as its attempts see it."""

    gated: int
    """Attempts prepared behind their gate right now (bounded by the start path)."""
    admission: StartAdmission
    """Turns through the start path (claim to start), in due order."""

    @property
    def member_id(self) -> str: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def store(self) -> Store: ...
    @property
    def keys(self) -> Keys: ...
    @property
    def runs(self) -> RunOps: ...
    @property
    def logs(self) -> LogStore: ...
    @property
    def executor(self) -> Executor: ...
    @property
    def watchdog(self) -> Watchdog: ...
    @property
    def starter(self) -> Starter: ...
    @property
    def report_window(self) -> GatherWindow: ...

    def report_may_wait(self, need: Resources) -> bool:
        """Whether a finished attempt's report may wait for the report window."""

    def observe_start(self, lag_ms: int) -> None:
        """Record an attempt's start lag."""
