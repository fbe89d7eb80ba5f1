from __future__ import annotations

import asyncio

from etcdsched.runtime.clock import FakeClock


async def test_fake_clock_wakes_sleepers_in_order() -> None:
    clock = FakeClock(start_ms=0)
    woke: list[tuple[str, int]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now_ms()))

    tasks = [asyncio.create_task(sleeper("b", 2)), asyncio.create_task(sleeper("a", 1))]
    await asyncio.sleep(0)
    assert clock.sleepers == 2
    await clock.advance(1.5)
    assert woke == [("a", 1000)]
    await clock.advance(1)
    assert woke == [("a", 1000), ("b", 2000)] and clock.now_ms() == 2500
    await asyncio.gather(*tasks)


async def test_sleep_until_wall_time() -> None:
    clock = FakeClock(start_ms=10_000)
    task = asyncio.create_task(clock.sleep_until_ms(12_000))
    await asyncio.sleep(0)
    await clock.advance(2)
    await task
    assert clock.now_ms() == 12_000
