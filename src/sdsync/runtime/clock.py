"""The wall clock, for the few callers that read one: the core is sans-I/O and only takes
``now_ms``, so reading the time of day belongs here, where time is scheduled."""

from __future__ import annotations

import time


def system_clock_ms() -> int:
    """Unix time in milliseconds."""
    return time.time_ns() // 1_000_000
