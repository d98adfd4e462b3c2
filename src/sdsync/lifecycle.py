"""``async with`` for the objects that hold tasks, threads, connections or files.

Entering the block starts the object, leaving it closes the object, however the block
ends: one definition for the channel, the transports and the store client.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class AsyncLifecycle(ABC):
    """``async with obj:`` awaits ``obj.start()`` on entry and ``obj.close()`` on exit."""

    @abstractmethod
    async def start(self) -> None:
        """Start whatever the object runs (tasks, a thread)."""

    @abstractmethod
    async def close(self) -> None:
        """Release whatever the object holds."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
