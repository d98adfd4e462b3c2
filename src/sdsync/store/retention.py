"""Retention policies, with nwaku's meanings and spelling.

Theory of operation
-------------------
``time:N`` drops messages older than N seconds, ``capacity:N`` keeps the newest N
messages, ``size:N[KB|MB|GB|KiB|MiB|GiB]`` keeps the archive under N bytes on disk.
A node may apply several; each is a pure function of the archive and the clock, run
periodically by the node and on demand through the admin API.

Size is only known after the fact, so the size policy deletes the oldest share of
messages that should bring the archive under the limit (plus a 10 % margin so it does
not run again at once), and repeats while the archive is still too large and still
shrinking: PostgreSQL returns space only when whole hourly partitions go, so within
the last hour it can do no better and stops.

A size policy run every retention interval (30 min) lets a flood fill the disk in
between (one relay peer brought 98 GB/h).  So the node also enforces it as the
archive grows (:class:`ByteBudget`, the archive's ``size_watch``): every
``check_bytes`` of payload inserted (1 % of the limit, at least 1 MiB) it measures the
archive and, if over, deletes the oldest messages as the policy would, counting them
in ``deleted``.  One check runs at a time; an insert that finds one running goes on.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass
from typing import Literal

from sdsync.errors import LocalProtocolError
from sdsync.store.archive import Archive

logger = logging.getLogger("sdsync.store.retention")

DEFAULT_POLICY = "time:172800"  # nwaku's default: two days
SIZE_MARGIN = 0.1
MAX_SIZE_ROUNDS = 8
MIN_CHECK_BYTES = 2**20
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SPEC = re.compile(r"(time|capacity|size):(\d+)\s*([a-zA-Z]*)")

Kind = Literal["time", "capacity", "size"]


@dataclass(frozen=True)
class RetentionPolicy:
    kind: Kind
    limit: int
    """Seconds (time), messages (capacity) or bytes (size)."""

    @classmethod
    def parse(cls, spec: str) -> RetentionPolicy:
        match = _SPEC.fullmatch(spec.strip())
        unit = match.group(3).lower() if match else ""
        if match is None or unit not in _UNITS or (unit and match.group(1) != "size"):
            raise LocalProtocolError(
                f"bad retention policy {spec!r}: expected time:SECONDS, capacity:MESSAGES "
                "or size:BYTES[KB|MB|GB|KiB|MiB|GiB]"
            )
        kind: Kind = match.group(1)  # type: ignore[assignment]  # the regex allows no other
        return cls(kind, int(match.group(2)) * _UNITS[unit])

    def apply(self, archive: Archive, now_ns: int) -> int:
        """Enforce the policy; returns how many messages were deleted."""
        if self.kind == "time":
            return archive.delete_before(now_ns - self.limit * 10**9)
        if self.kind == "capacity":
            return archive.delete_oldest(archive.count() - self.limit)
        return self._shrink(archive)

    def _shrink(self, archive: Archive) -> int:
        deleted = 0
        size = archive.size_bytes()
        for _ in range(MAX_SIZE_ROUNDS):
            count = archive.count()
            if size <= self.limit or count == 0:
                break
            share = min(1.0, (size - self.limit) / size + SIZE_MARGIN)
            deleted += archive.delete_oldest(math.ceil(count * share))
            smaller = archive.size_bytes()
            if smaller >= size:
                break
            size = smaller
        return deleted

    def __str__(self) -> str:
        return f"{self.kind}:{self.limit}"


class ByteBudget:
    """A size policy enforced as the archive grows (see the module): an archive's
    :class:`~sdsync.store.archive.SizeWatch`."""

    def __init__(self, policy: RetentionPolicy) -> None:
        if policy.kind != "size":
            raise LocalProtocolError(f"a byte budget needs a size policy, not {policy}")
        self.policy = policy
        self.check_bytes = max(MIN_CHECK_BYTES, policy.limit // 100)
        self.deleted = 0
        self._since = 0
        self._counting = threading.Lock()
        self._checking = threading.Lock()

    def inserted(self, archive: Archive, payload_bytes: int) -> None:
        with self._counting:
            self._since += payload_bytes
            if self._since < self.check_bytes:
                return
            self._since = 0
        if not self._checking.acquire(blocking=False):
            return  # another insert is checking: this one's bytes are on disk for it
        try:
            deleted = self.policy.apply(archive, 0)
            self.deleted += deleted
        finally:
            self._checking.release()
        if deleted:
            logger.warning("archive over %s: deleted the %d oldest messages", self.policy, deleted)
