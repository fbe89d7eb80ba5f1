"""Starters open a prepared job's gate at its instant (ADR 0008).

The gate here is a real :class:`~etcdsched.worker.executor.Prepared` around a pipe
and no process: what the read end holds says whether the job would have run
(``b"go\\n"``), was let go without running (end-of-file) or still waits.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from etcdsched.runtime.clock import FakeClock
from etcdsched.worker.executor import Prepared
from etcdsched.worker.process_group import ExitStatus
from etcdsched.worker.starter import LoopStarter, StartTicket, ThreadStarter

START_MS = 1_767_225_600_000
SETTLE = 5.0  # generous bound for "it happens"; never a timing claim


class _NoProcess:
    """Stands in for the gated process; the starters never touch it."""

    pid: int | None = None
    pgid: int | None = None

    async def wait(self) -> ExitStatus:
        return ExitStatus(0, None)

    def ended(self) -> ExitStatus | None:
        return None

    async def stop(self, grace: float) -> None:
        return None

    def kill_now(self) -> None:
        return None


class Gate:
    """A pipe standing in for the gate shell's stdin."""

    def __init__(self) -> None:
        self._read_fd, write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self.prepared = Prepared(_NoProcess(), write_fd)

    def received(self) -> bytes | None:
        """``b"go\\n"`` once opened, ``b""`` once closed unopened (the gate
        shell would exit 125), None while the gate still waits."""
        try:
            return os.read(self._read_fd, 64)
        except BlockingIOError:
            return None

    def break_pipe(self) -> None:
        """The gated process died (killed): nobody reads the gate any more."""
        os.close(self._read_fd)
        self._read_fd = -1

    def close(self) -> None:
        self.prepared.abort()  # closes the write end if still open
        if self._read_fd >= 0:
            os.close(self._read_fd)


@pytest.fixture
def gates() -> Iterator[Callable[[], Gate]]:
    made: list[Gate] = []

    def make() -> Gate:
        gate = Gate()
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.close()


def always() -> bool:
    return True


def never() -> bool:
    return False


def recording(order: list[str], name: str) -> Callable[[], bool]:
    """A ``may_start`` that says yes and notes when it was asked."""

    def may_start() -> bool:
        order.append(name)
        return True

    return may_start


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


async def resolved(ticket: StartTicket) -> int | None:
    return await asyncio.wait_for(asyncio.shield(ticket.started), SETTLE)


# --- LoopStarter, on a fake clock -------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_ms=START_MS)


@pytest.fixture
def loop_starter(clock: FakeClock) -> Iterator[LoopStarter]:
    starter = LoopStarter(clock)
    yield starter
    starter.close()


async def until_sleeping(clock: FakeClock, sleepers: int = 1) -> None:
    """Let the freshly created start tasks reach their sleep on the clock."""
    for _ in range(10):
        if clock.sleepers >= sleepers:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"expected {sleepers} sleeper(s), got {clock.sleepers}")


async def test_loop_ticket_waits_for_its_instant_then_opens_on_the_clock(
    clock: FakeClock, loop_starter: LoopStarter, gates: Callable[[], Gate]
) -> None:
    gate = gates()
    at_ms = START_MS + 250
    ticket = loop_starter.schedule(gate.prepared, at_ms, always)
    await until_sleeping(clock)

    await clock.advance(0.249)
    assert not ticket.started.done()
    assert gate.received() is None

    await clock.advance(0.051)
    assert await resolved(ticket) == at_ms  # the clock's ms at the instant, not after
    assert gate.received() == b"go\n"
    assert gate.prepared.gate_fd is None


async def test_loop_ticket_whose_instant_passed_opens_at_once(
    clock: FakeClock, loop_starter: LoopStarter, gates: Callable[[], Gate]
) -> None:
    gate = gates()
    ticket = loop_starter.schedule(gate.prepared, START_MS - 1_000, always)
    assert await resolved(ticket) == START_MS  # the clock never moved
    assert gate.received() == b"go\n"


async def test_loop_ticket_asks_may_start_at_the_instant_and_refuses_without_opening(
    clock: FakeClock, loop_starter: LoopStarter, gates: Callable[[], Gate]
) -> None:
    """``may_start`` is asked when the instant comes, not when scheduled:
    a session lost in between refuses the start."""
    gate = gates()
    holds = [True]
    asked: list[int] = []

    def may_start() -> bool:
        asked.append(clock.now_ms())
        return holds[0]

    ticket = loop_starter.schedule(gate.prepared, START_MS + 100, may_start)
    await until_sleeping(clock)
    holds[0] = False
    await clock.advance(0.2)

    assert await resolved(ticket) is None
    assert asked == [START_MS + 100]
    assert gate.received() is None  # not opened: the caller aborts it
    assert gate.prepared.holds_process
    assert not ticket.withdraw()  # the starter decided


async def test_loop_ticket_withdrawn_before_its_instant_is_never_opened(
    clock: FakeClock, loop_starter: LoopStarter, gates: Callable[[], Gate]
) -> None:
    gate = gates()
    ticket = loop_starter.schedule(gate.prepared, START_MS + 100, always)
    await until_sleeping(clock)
    await clock.advance(0.05)

    assert ticket.withdraw()
    assert not ticket.withdraw()  # decided once
    await clock.advance(1)  # well past the instant: the start task has run

    assert clock.sleepers == 0
    assert not ticket.started.done()
    assert gate.received() is None
    assert gate.prepared.holds_process


async def test_loop_ticket_cannot_be_withdrawn_once_opened(
    clock: FakeClock, loop_starter: LoopStarter, gates: Callable[[], Gate]
) -> None:
    gate = gates()
    ticket = loop_starter.schedule(gate.prepared, START_MS + 100, always)
    await until_sleeping(clock)
    await clock.advance(0.1)

    assert await resolved(ticket) == START_MS + 100
    assert not ticket.withdraw()
    assert gate.received() == b"go\n"


async def test_loop_tickets_open_in_instant_order(
    clock: FakeClock, loop_starter: LoopStarter, gates: Callable[[], Gate]
) -> None:
    order: list[str] = []

    offsets = {"c": 300, "a": 100, "b": 200}
    tickets = {
        name: loop_starter.schedule(gates().prepared, START_MS + offset, recording(order, name))
        for name, offset in offsets.items()
    }
    await until_sleeping(clock, 3)
    await clock.advance(1)

    assert order == ["a", "b", "c"]
    assert {name: await resolved(t) for name, t in tickets.items()} == {
        name: START_MS + offset for name, offset in offsets.items()
    }


async def test_loop_starter_close_leaves_pending_tickets_undecided(
    clock: FakeClock, loop_starter: LoopStarter, gates: Callable[[], Gate]
) -> None:
    gate = gates()
    ticket = loop_starter.schedule(gate.prepared, START_MS + 100, always)
    await until_sleeping(clock)
    loop_starter.close()
    await clock.advance(1)

    assert not ticket.started.done()
    assert gate.received() is None
    assert ticket.withdraw()  # the attempt takes it back and aborts it


# --- ThreadStarter, in real time --------------------------------------------


@pytest.fixture
def thread_starter() -> Iterator[ThreadStarter]:
    starter = ThreadStarter()
    yield starter
    starter.close()


def starter_thread(starter: ThreadStarter) -> threading.Thread:
    thread = starter._thread
    assert thread is not None, "the thread starts with the first ticket"
    return thread


async def test_thread_ticket_opens_at_or_after_its_instant(
    thread_starter: ThreadStarter, gates: Callable[[], Gate]
) -> None:
    gate = gates()
    at_ms = wall_ms() + 100
    ticket = thread_starter.schedule(gate.prepared, at_ms, always)

    stamp = await resolved(ticket)
    assert stamp is not None and stamp >= at_ms
    assert wall_ms() >= at_ms
    assert gate.received() == b"go\n"
    assert not ticket.withdraw()


async def test_thread_ticket_whose_instant_passed_opens_at_once(
    thread_starter: ThreadStarter, gates: Callable[[], Gate]
) -> None:
    gate = gates()
    at_ms = wall_ms() - 1_000
    ticket = thread_starter.schedule(gate.prepared, at_ms, always)
    stamp = await resolved(ticket)
    assert stamp is not None and stamp >= at_ms + 1_000
    assert gate.received() == b"go\n"


async def test_thread_tickets_open_in_instant_order_whatever_the_scheduling_order(
    thread_starter: ThreadStarter, gates: Callable[[], Gate]
) -> None:
    """The order is what ``may_start`` saw (it is asked just before each
    gate opens, on the starter thread), so it does not depend on stamps
    that may coincide when the thread runs late."""
    order: list[str] = []

    base = wall_ms()
    at = {"late": base + 200, "early": base + 50, "middle": base + 120, "tie": base + 120}
    tickets = {
        name: thread_starter.schedule(gates().prepared, at_ms, recording(order, name))
        for name, at_ms in at.items()
    }
    stamps = {name: await resolved(ticket) for name, ticket in tickets.items()}

    assert order == ["early", "middle", "tie", "late"]  # equal instants: scheduling order
    for name, stamp in stamps.items():
        assert stamp is not None and stamp >= at[name], name
    assert [stamps[name] for name in order] == sorted(stamps[name] or 0 for name in order)


async def test_thread_ticket_is_refused_when_the_session_is_lost(
    thread_starter: ThreadStarter, gates: Callable[[], Gate]
) -> None:
    gate = gates()
    ticket = thread_starter.schedule(gate.prepared, wall_ms() + 50, never)

    assert await resolved(ticket) is None
    assert gate.received() is None  # not opened
    assert not ticket.withdraw()
    gate.prepared.abort()  # what the attempt does next
    assert gate.received() == b""


async def test_thread_ticket_withdrawn_before_its_instant_is_never_opened(
    thread_starter: ThreadStarter, gates: Callable[[], Gate]
) -> None:
    """A later ticket on the same thread is the proof that the withdrawn
    one's instant came and went: tickets are taken in instant order."""
    gate, later = gates(), gates()
    at_ms = wall_ms() + 150
    ticket = thread_starter.schedule(gate.prepared, at_ms, always)
    sentinel = thread_starter.schedule(later.prepared, at_ms + 50, always)

    assert ticket.withdraw()
    assert await resolved(sentinel) is not None

    assert not ticket.started.done()
    assert gate.received() is None
    assert gate.prepared.holds_process
    assert later.received() == b"go\n"


async def test_thread_starter_close_stops_the_thread_and_leaves_tickets_undecided(
    thread_starter: ThreadStarter, gates: Callable[[], Gate]
) -> None:
    first, pending, after = gates(), gates(), gates()
    assert await resolved(thread_starter.schedule(first.prepared, wall_ms(), always)) is not None
    thread = starter_thread(thread_starter)
    waiting = thread_starter.schedule(pending.prepared, wall_ms() + 60_000, always)

    thread_starter.close()
    await asyncio.to_thread(thread.join, SETTLE)
    assert not thread.is_alive()

    late = thread_starter.schedule(after.prepared, wall_ms() - 1, always)
    assert starter_thread(thread_starter) is thread  # not restarted
    await asyncio.sleep(0)
    for ticket, gate in ((waiting, pending), (late, after)):
        assert not ticket.started.done()
        assert gate.received() is None
        assert ticket.withdraw()  # nobody decided: the attempt takes it back
    thread_starter.close()  # idempotent


async def test_thread_starter_closed_before_any_ticket_never_opens_one(
    gates: Callable[[], Gate],
) -> None:
    starter = ThreadStarter()
    starter.close()
    gate = gates()
    ticket = starter.schedule(gate.prepared, wall_ms() - 1, always)
    await asyncio.to_thread(starter_thread(starter).join, SETTLE)

    assert not starter_thread(starter).is_alive()
    assert not ticket.started.done()
    assert gate.received() is None
    assert ticket.withdraw()


async def test_a_gate_that_cannot_be_opened_fails_its_ticket_and_not_the_starter(
    thread_starter: ThreadStarter, gates: Callable[[], Gate]
) -> None:
    dead, healthy = gates(), gates()
    dead.break_pipe()
    broken = thread_starter.schedule(dead.prepared, wall_ms() + 50, always)
    fine = thread_starter.schedule(healthy.prepared, wall_ms() + 100, always)

    with pytest.raises(OSError):  # the attempt fails it: "could not start"
        await asyncio.wait_for(asyncio.shield(broken.started), 2)
    assert await asyncio.wait_for(asyncio.shield(fine.started), 2) is not None
    assert healthy.received() == b"go\n"
