"""What a hostile-peer test measures while its attack runs: the attacked process's memory
and how an honest peer fares.

Theory of operation
-------------------
An attack on a node is judged by two figures taken *during* it: how far the node's
resident memory rises, and whether an honest peer is still served, and how fast.
:class:`Watch` is an async context manager around the attack. On entry it reads the
process's RSS; while it is open one task samples the RSS every ``sample_s`` and another
runs the honest ``probe`` coroutine again and again, ``every_s`` apart, each within
``timeout_s`` (returning normally: served; raising or timing out: failed), timing each.
On exit the probe under way is let finish (its deadline bounds the wait), so a probe
started during the attack is always counted, and the figures are frozen into
:attr:`Watch.result`, a :class:`Watched` whose ``str`` is one line for a test's output.

Sampling can miss a spike between two samples; the kernel's high-water mark (``VmHWM``)
cannot, so the peak is the larger of the samples and, if the high-water mark rose while
watching, that mark. Figures are reported, never raced: a test asserts them against
generous budgets and liveness bounds it states, never against a measured speed.

:func:`process_cpu_s` reads what CPU a process has used, for a test that sets what one
kind of request costs the node against another's, both measured in the same run.

Once an attack ends the node must give back what it took (:mod:`sdsync.store.memory`):
:func:`given_back` reads the process's RSS every half second from then on, until it is
within :data:`KEPT_BUDGET` of where it was before the attack or :data:`GIVE_BACK_S` have
passed, and says what it last read and when (a :class:`GivenBack`), which
:func:`assert_given_back` holds to the budget. Under ``SDSYNC_GIVE_BACK_WHOLE=1`` it
reads on to the end of :data:`GIVE_BACK_S` whatever it reads first: the issue's figure,
"RSS a minute after the attack" (``bench/hostile_attacks.py`` sets it).
:func:`load_average` is the machine's 1-minute load average, printed beside every
figure: the attacks share the CPU with whatever else runs.

:func:`soak_scale` picks an attack's size: the small one for ``make test``, the large
one under ``SDSYNC_SOAK=1`` (``make soak``). Linux only (``/proc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TypeVar

__all__ = [
    "GIVE_BACK_S",
    "KEPT_BUDGET",
    "GivenBack",
    "Watch",
    "Watched",
    "assert_given_back",
    "given_back",
    "load_average",
    "process_cpu_s",
    "process_rss",
    "soak_scale",
]

T = TypeVar("T")
_MB = 2**20


def _status_bytes(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/PID/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no {field} for process {pid}")


def process_rss(pid: int) -> int:
    """The resident memory of process ``pid`` (VmRSS), in bytes."""
    return _status_bytes(pid, "VmRSS")


def process_cpu_s(pid: int) -> float:
    """The CPU time process ``pid`` has used, user and system (utime + stime), in seconds."""
    # /proc/PID/stat: the fields after the command's closing parenthesis, from state on.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> float:
    """The machine's load average over the last minute (/proc/loadavg)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def soak_scale(small: T, large: T) -> T:
    """``large`` under ``SDSYNC_SOAK=1`` (``make soak``), else ``small``."""
    return large if os.environ.get("SDSYNC_SOAK") == "1" else small


@dataclass(frozen=True)
class Watched:
    """What a :class:`Watch` saw: RSS in bytes, probe latencies in seconds."""

    rss_before: int
    rss_peak: int
    probes: int
    failures: int
    latency_p50_s: float
    latency_max_s: float
    first_failure: str = ""

    @property
    def rss_growth(self) -> int:
        return self.rss_peak - self.rss_before

    def __str__(self) -> str:
        failed = f" ({self.first_failure})" if self.first_failure else ""
        return (
            f"RSS {self.rss_before / _MB:.0f} -> {self.rss_peak / _MB:.0f} MB "
            f"(+{self.rss_growth / _MB:.0f}); honest probes {self.probes}, "
            f"failed {self.failures}{failed}; latency p50 {self.latency_p50_s:.2f} s, "
            f"max {self.latency_max_s:.2f} s"
        )


class Watch:
    """Samples process ``pid``'s RSS and runs ``probe`` repeatedly while open (see the
    module); :attr:`result` once closed."""

    def __init__(
        self,
        pid: int,
        probe: Callable[[], Awaitable[object]],
        *,
        every_s: float = 0.5,
        timeout_s: float = 30.0,
        sample_s: float = 0.1,
    ) -> None:
        self.pid = pid
        self.probe = probe
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.sample_s = sample_s
        self._latencies: list[float] = []
        self._failures: list[str] = []
        self._peak = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._result: Watched | None = None

    @property
    def result(self) -> Watched:
        if self._result is None:
            raise RuntimeError("the watch is still open")
        return self._result

    async def __aenter__(self) -> Watch:
        self._rss_before = self._peak = process_rss(self.pid)
        self._hwm_before = _status_bytes(self.pid, "VmHWM")
        self._tasks = [asyncio.create_task(self._sample()), asyncio.create_task(self._probe())]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        sampler, prober = self._tasks
        sampler.cancel()
        if exc is not None:
            prober.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(sampler, prober)
        self._take_sample()
        hwm = _status_bytes(self.pid, "VmHWM")
        peak = max(self._peak, hwm) if hwm > self._hwm_before else self._peak
        latencies = self._latencies
        self._result = Watched(
            rss_before=self._rss_before,
            rss_peak=peak,
            probes=len(latencies),
            failures=len(self._failures),
            latency_p50_s=statistics.median(latencies) if latencies else 0.0,
            latency_max_s=max(latencies, default=0.0),
            first_failure=self._failures[0] if self._failures else "",
        )

    def _take_sample(self) -> None:
        self._peak = max(self._peak, process_rss(self.pid))

    async def _sample(self) -> None:
        while True:
            self._take_sample()
            await asyncio.sleep(self.sample_s)

    async def _probe(self) -> None:
        """Probes until stopped; the one under way when the watch closes finishes."""
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self.probe()
            except Exception as exc:  # a failed probe is a figure, not an error here
                self._failures.append(f"{type(exc).__name__}: {exc}"[:200])
            self._latencies.append(time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.every_s):
                    await self._stop.wait()


#: What an attack may leave the node holding once it ends: its RSS comes back within this
#: of where it was before the attack (the issue's bound) ...
KEPT_BUDGET = 50 * _MB
#: ... within this of the attack's end (a liveness bound: the node looks at its memory
#: every 5 s, and once more 30 s after a load, sdsync.store.memory).
GIVE_BACK_S = 60.0


@dataclass(frozen=True)
class GivenBack:
    """What :func:`given_back` read: RSS over where it was before the attack, in bytes,
    ``after_s`` seconds after the attack's end; ``within_s``, when it first came within
    the budget (None: not within ``GIVE_BACK_S``)."""

    kept: int
    after_s: float
    within_s: float | None

    def __str__(self) -> str:
        came = "never" if self.within_s is None else f"{self.within_s:.1f} s"
        return (
            f"{self.kept / _MB:+.0f} MB kept {self.after_s:.0f} s after"
            f" (within {KEPT_BUDGET / _MB:.0f} MB: {came})"
        )


def given_back(pid: int, rss_before: int) -> GivenBack:
    """Process ``pid``'s RSS over ``rss_before``, read every half second from now (the
    attack's end) until it is within :data:`KEPT_BUDGET` or :data:`GIVE_BACK_S` have
    passed; under ``SDSYNC_GIVE_BACK_WHOLE=1``, until they have passed (see the module)."""
    whole = os.environ.get("SDSYNC_GIVE_BACK_WHOLE") == "1"
    started = time.monotonic()
    within: float | None = None
    while True:
        kept, after = process_rss(pid) - rss_before, time.monotonic() - started
        if within is None and kept <= KEPT_BUDGET:
            within = after
            if not whole:
                break
        if after >= GIVE_BACK_S:
            break
        time.sleep(0.5)
    return GivenBack(kept, after, within)


def assert_given_back(back: GivenBack, watched: Watched) -> None:
    """Raise AssertionError unless the node gave back what the attack ``watched`` saw took:
    its RSS within :data:`KEPT_BUDGET` of where it was before (``back``, from
    :func:`given_back`)."""
    if back.kept > KEPT_BUDGET:
        raise AssertionError(f"not given back: {back}; {watched}")
