"""The worker's start admission: at most a window of attempts between
claim and start, the rest in due order (earliest instant, then highest
priority), and a waiting attempt that is interrupted leaves the queue."""

from __future__ import annotations

import asyncio

from etcdsched.worker.admission import StartAdmission
from etcdsched.worker.interrupts import Interrupt


async def test_the_window_bounds_who_is_inside_and_the_rest_enter_in_due_order() -> None:
    admission = StartAdmission(window=2)
    entered: list[str] = []

    async def attempt(name: str, at_ms: int, priority: int, hold: asyncio.Event) -> None:
        turn = admission.turn(at_ms, priority)
        assert await turn.take()
        entered.append(name)
        await hold.wait()
        turn.give_back()

    release = asyncio.Event()
    first = [asyncio.create_task(attempt(n, 0, 100, release)) for n in ("a", "b")]
    await asyncio.sleep(0)
    later = [
        asyncio.create_task(attempt("late-low", 2000, 100, release)),
        asyncio.create_task(attempt("due-low", 1000, 100, release)),
        asyncio.create_task(attempt("due-high", 1000, 900, release)),
    ]
    await asyncio.sleep(0.01)
    assert entered == ["a", "b"] and admission.inside == 2 and admission.waiting == 3
    release.set()
    await asyncio.gather(*first, *later)
    assert entered == ["a", "b", "due-high", "due-low", "late-low"]
    assert admission.inside == 0


async def test_an_interrupted_waiter_leaves_without_a_turn_and_takes_no_place() -> None:
    admission = StartAdmission(window=1)
    holder = admission.turn(0, 100)
    assert await holder.take()
    shutdown = Interrupt()
    waiter = admission.turn(0, 100)
    waiting = asyncio.create_task(waiter.take(shutdown))
    await asyncio.sleep(0.01)
    shutdown.set()
    assert await waiting is False
    holder.give_back()
    assert admission.inside == 0  # the cancelled place was skipped
    third = admission.turn(0, 100)
    assert await third.take()
    third.give_back()
    third.give_back()  # idempotent
    assert admission.inside == 0
