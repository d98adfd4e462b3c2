"""Crash points: where a test may have this process killed, to attack a promise at a
chosen step rather than at a lucky moment.

``SDSYNC_CRASH_AT=commit:17`` makes the process SIGKILL itself the 17th time it passes
the crash point named ``commit``. The points:

* ``commit`` — a step of the reliability API was committed to the channel's state and
  nothing has heard of it yet (no callback ran, no answer was given);
* ``answer`` — a gRPC call did its work and its answer is not sent yet;
* ``event`` — an event was handed to an ``Events`` stream, before the next one.

Unset (always, outside such tests) a crash point costs one comparison.
"""

from __future__ import annotations

import os
import signal

_VARIABLE = "SDSYNC_CRASH_AT"


def _armed() -> tuple[str, int] | None:
    spec = os.environ.get(_VARIABLE)
    if not spec:
        return None
    name, _, count = spec.partition(":")
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"{_VARIABLE}={spec!r}: expected NAME:N with N >= 1")
    return name, int(count)


_ARMED = _armed()
_passes: list[int] = [0]


def crash_point(name: str) -> None:
    """Die here (SIGKILL, no cleanup) if this is the armed point's Nth pass."""
    if _ARMED is None or _ARMED[0] != name:
        return
    _passes[0] += 1
    if _passes[0] >= _ARMED[1]:
        os.kill(os.getpid(), signal.SIGKILL)
