"""Giving the memory a load has freed back to the operating system.

Theory of operation
-------------------
The node's budgets bound what an attack makes it hold (answers nobody reads, a relay
flood's messages, Store Sync snapshots), but once the attack ends and Python frees those
objects the memory stays the process's, and a node that took one such load keeps its
peak for good:

* glibc's malloc keeps freed chunks for reuse, in one arena per thread that allocated
  (up to eight per core: the archive's threads, the relay host's, the event loop's), and
  gives back on its own only the top of the main heap;
* SQLite keeps the pages it read in each connection's page cache (up to
  :data:`~sdsync.store.sqlite.CACHE_KIB` a connection), and every archive thread has its
  connection, so eight threads that answered the same full pages each cache a copy.

:class:`MemoryReturn` looks every :data:`CHECK_S` (on an archive thread: reading is
cheap, giving back takes milliseconds) at the process's resident memory (RSS) and at the
bytes malloc has handed out and not got back (``mallinfo2``), and gives memory back when

* RSS grew by ``slack_bytes`` since it last did: a load is under way, and trimming as it
  goes lowers its peak (its caches are left: it is using them);
* malloc's bytes in use fell by ``slack_bytes`` from their highest since then: a load
  ended, and what it freed is held, not used;
* or ``settle_s`` after either, once: what a load held to its end and freed without
  moving malloc's count by the slack (a relay flood's last messages, the caches it
  filled).

Giving back is ``malloc_trim(0)``, which returns the free pages of every arena, not only
the heap's top, after (but while a load grows) emptying the archive's caches
(:meth:`~sdsync.store.archive.Archive.release_memory`: SQLite's ``PRAGMA shrink_memory``
on every connection). Each return and the bytes it gave back are counted
(``sdsync_store_memory_returns_total``, ``sdsync_store_memory_returned_bytes_total``).

:func:`limit_arenas` caps malloc's arenas at :data:`ARENAS` (``mallopt(M_ARENA_MAX)``)
for ``sdsync store serve``, before its threads exist, unless ``MALLOC_ARENA_MAX`` says
otherwise: freed memory trims back only where whole pages are free, and chunks of a few
arenas shared by all threads leave fewer pages pinned by a stray live allocation. The
threads hold the GIL for most of what they allocate, so they seldom contend.

Measured on ``sdsync store serve`` (RSS a minute after each attack of
``tests/store/test_hostile_node.py``, over where it started): 100 unread full-page store
answers +185 MB before, -13 MB now; a relay flood +114 MB, +6 MB; four RIBLT sessions
never read +278 MB, -51 MB. Trimming alone left +222 and +58 MB of the first two,
trimming with the caches emptied +69 and +5 MB; two arenas took the answers to -14 MB and
the RIBLT sessions from +183 to -51 MB. A full garbage collection, which would free what
reference cycles hold, takes 120-200 ms of the event loop on this node: not done here.

Only glibc (2.33 and later, for ``mallinfo2``) on Linux: elsewhere :func:`allocator`
raises :class:`UnsupportedAllocatorError`, saying why, and the node runs without it
(other allocators, such as musl's or macOS's, return memory in their own way).
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable
from typing import Protocol

logger = logging.getLogger("sdsync.store.memory")

__all__ = [
    "ARENAS",
    "CHECK_S",
    "SETTLE_S",
    "SLACK_BYTES",
    "Allocator",
    "Glibc",
    "MemoryReturn",
    "UnsupportedAllocatorError",
    "allocator",
    "limit_arenas",
    "resident_bytes",
]

CHECK_S = 5.0
"""How often the node looks at its memory."""
SLACK_BYTES = 32 * 2**20
"""How far RSS may grow, or malloc's bytes in use fall, before memory is given back."""
SETTLE_S = 15.0
"""Memory is given back once more this long after a load last moved it by the slack."""
ARENAS = 2
"""malloc arenas for ``sdsync store serve`` (:func:`limit_arenas`)."""
_M_ARENA_MAX = -8  # mallopt's parameter, from glibc's malloc.h


class UnsupportedAllocatorError(Exception):
    """This platform's allocator cannot be told to give memory back (the reason)."""


class Allocator(Protocol):
    """What :class:`MemoryReturn` asks of malloc."""

    def in_use(self) -> int:
        """Bytes handed out and not freed (not counting chunks of their own mappings,
        which go back to the system when freed)."""
        ...

    def trim(self) -> None:
        """Give the free pages of every arena back to the system."""
        ...


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class Glibc:
    """glibc's malloc, through ctypes."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._libc = libc
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]

    def in_use(self) -> int:
        return int(self._libc.mallinfo2().uordblks)

    def trim(self) -> None:
        self._libc.malloc_trim(0)

    def limit_arenas(self, count: int) -> bool:
        return bool(self._libc.mallopt(_M_ARENA_MAX, count))


def allocator() -> Glibc:
    """This process's malloc, if it can give memory back on request; else
    :class:`UnsupportedAllocatorError`."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):  # no such name: not glibc
        libc = ""
    if not libc.startswith("glibc ") or not os.path.exists("/proc/self/statm"):
        raise UnsupportedAllocatorError(
            "not glibc on Linux: its allocator returns memory in its own way"
        )
    found = ctypes.CDLL("libc.so.6")
    if not hasattr(found, "mallinfo2"):
        raise UnsupportedAllocatorError(f"{libc} lacks mallinfo2 (glibc 2.33 and later have it)")
    return Glibc(found)


def resident_bytes() -> int:
    """This process's resident memory (RSS), in bytes."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def limit_arenas(count: int = ARENAS) -> None:
    """Cap malloc's arenas at ``count`` for the threads to come (see the module), unless
    ``MALLOC_ARENA_MAX`` is set; logged either way."""
    if "MALLOC_ARENA_MAX" in os.environ:
        logger.info("malloc arenas: MALLOC_ARENA_MAX=%s", os.environ["MALLOC_ARENA_MAX"])
        return
    try:
        glibc = allocator()
    except UnsupportedAllocatorError as exc:
        logger.info("malloc arenas not capped: %s", exc)
        return
    if glibc.limit_arenas(count):
        logger.info("malloc arenas capped at %d", count)
    else:
        logger.warning("malloc arenas not capped: mallopt refused")


class MemoryReturn:
    """Gives memory back when a load grew RSS or freed malloc's bytes by ``slack_bytes``
    since it last did, and once more ``settle_s`` after (see the module); :meth:`check`
    does it, on a worker thread."""

    def __init__(
        self,
        malloc: Allocator,
        release_caches: Callable[[], None],
        *,
        slack_bytes: int = SLACK_BYTES,
        settle_s: float = SETTLE_S,
        rss: Callable[[], int] = resident_bytes,
        clock: Callable[[], float] = time.monotonic,
        counted: Callable[[int], None] = lambda returned: None,
    ) -> None:
        """``release_caches`` empties the caches that hold memory (the archive's);
        ``counted`` is told of each return, with the bytes it gave back."""
        self._malloc = malloc
        self._release_caches = release_caches
        self._slack = slack_bytes
        self._settle_s = settle_s
        self._rss = rss
        self._clock = clock
        self._counted = counted
        self._rss_mark = rss()
        self._in_use_high = malloc.in_use()
        self._settled_at: float | None = None

    def check(self) -> int | None:
        """Give memory back if due; the resident bytes it gave back, None if not due."""
        rss, in_use, now = self._rss(), self._malloc.in_use(), self._clock()
        self._in_use_high = max(self._in_use_high, in_use)
        growing = rss - self._rss_mark >= self._slack
        ended = self._in_use_high - in_use >= self._slack
        settled = self._settled_at is not None and now >= self._settled_at
        if not (growing or ended or settled):
            return None
        if not growing:  # what the load left in the caches is not needed now
            self._release_caches()
        self._malloc.trim()
        self._settled_at = None if settled and not (growing or ended) else now + self._settle_s
        self._rss_mark = self._rss()
        self._in_use_high = self._malloc.in_use()
        returned = max(0, rss - self._rss_mark)
        self._counted(returned)
        logger.debug(
            "gave back %.0f MB: RSS %.0f MB, malloc in use %.0f MB",
            returned / 2**20,
            self._rss_mark / 2**20,
            self._in_use_high / 2**20,
        )
        return returned
