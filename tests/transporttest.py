"""What the tests of real transports share: bounded waits around hosts on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

# Liveness bounds only: everything here normally happens within a second or two.
PATIENCE_S = 30.0

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 4 * PATIENCE_S))


async def take(items: AsyncIterator[T], n: int) -> list[T]:
    """The next ``n`` of ``items``."""
    out: list[T] = []
    async with asyncio.timeout(PATIENCE_S):
        async for item in items:
            out.append(item)
            if len(out) == n:
                break
    return out


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(PATIENCE_S):
        while not condition():
            await asyncio.sleep(0.02)


async def nothing_more(items: AsyncIterator[T], within_s: float = 0.5) -> bool:
    """True if ``items`` yields nothing more within ``within_s``."""
    try:
        async with asyncio.timeout(within_s):
            await anext(items)
    except TimeoutError:
        return True
    return False
