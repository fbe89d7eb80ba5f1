"""The attempt's interrupt flags: set once, and one future waits on several."""

from __future__ import annotations

import asyncio

from etcdsched.worker.interrupts import Interrupt, first_of, wait_or_interrupt


async def test_a_wait_on_several_flags_ends_with_whichever_is_set_first() -> None:
    cancel, revoked = Interrupt(), Interrupt()
    waiter = first_of(cancel, revoked)
    await asyncio.sleep(0)
    assert not waiter.done()
    revoked.set()
    await asyncio.wait_for(waiter, 1)
    assert revoked.is_set() and not cancel.is_set()


async def test_a_flag_already_set_ends_the_wait_at_once_and_stays_set() -> None:
    flag = Interrupt()
    flag.set()
    flag.set()
    assert first_of(Interrupt(), flag).done()
    await asyncio.wait_for(flag.wait(), 1)
    assert flag.is_set()


async def test_a_wait_cancelled_before_the_flag_is_set_is_skipped_and_dropped() -> None:
    flag = Interrupt()
    for _ in range(100):  # waits that ended another way
        first_of(flag).cancel()
    last = first_of(flag)
    flag.set()
    assert last.done() and not last.cancelled()


async def test_wait_returns_when_the_flag_is_set_by_another_task() -> None:
    flag = Interrupt()
    waiting = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    flag.set()
    await asyncio.wait_for(waiting, 1)


async def test_wait_or_interrupt_ends_with_the_awaited_a_flag_or_the_timeout() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    done.set_result(None)
    await asyncio.wait_for(wait_or_interrupt(done, Interrupt()), 1)

    flag, pending = Interrupt(), loop.create_future()
    flag.set()
    await asyncio.wait_for(wait_or_interrupt(pending, flag), 1)
    assert not pending.done()  # left as it was

    await asyncio.wait_for(wait_or_interrupt(pending, Interrupt(), timeout=0.01), 1)
    assert not pending.done()
