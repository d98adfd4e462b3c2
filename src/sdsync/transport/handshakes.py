"""Who may be in the middle of a handshake with us: slots shared fairly between addresses.

Theory of operation
-------------------
A connection's handshake (security, then muxer negotiation) costs us a slot until it
ends, and a remote that never finishes it holds the slot until the handshake deadline.
The slots are few (``ConnectionLimits.pending``, 128; it was 64), so first come, first
served let a handful of addresses — each within its per-IP connection limit — hold them
all, and every honest dial failed meanwhile.

:class:`HandshakeSlots` gives them out by two rules.  An address holds at most
``per_ip`` slots at once (``ConnectionLimits.pending_per_ip``, far below the total), so
filling the table takes many addresses.  And when every slot is taken, a newcomer takes
the slot of a handshake that has run ``fair_age_s`` already — an honest one takes
milliseconds, so an old one is almost surely stalled — choosing among those the address
holding the most slots, then its oldest: the evicted handshake is cancelled, its
connection closed.  A newcomer is refused only while every handshake is younger than
that, so a stalled remote keeps a slot for at most ``fair_age_s`` when others are
waiting, whatever the number of addresses it has.

Nothing here does I/O: the host hands each slot a ``cancel`` callback (its trio cancel
scope's) and the clock is passed in.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["FAIR_AGE_S", "HandshakeSlots", "Slot"]

FAIR_AGE_S = 1.0
"""A handshake this old may give its slot to a newcomer when all are taken."""


@dataclass(eq=False)
class Slot:
    """One handshake in progress."""

    ip: str
    started: float
    cancel: Callable[[], None] = field(repr=False)


class HandshakeSlots:
    """The handshakes in progress, at most ``total``, at most ``per_ip`` per address but
    for ``exempt`` addresses (see the module)."""

    def __init__(
        self,
        total: int,
        per_ip: int,
        exempt: frozenset[str] = frozenset(),
        *,
        fair_age_s: float = FAIR_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.per_ip, self.exempt = total, per_ip, exempt
        self.fair_age_s = fair_age_s
        self._clock = clock
        self._slots: list[Slot] = []  # oldest first
        self._by_ip: Counter[str] = Counter()
        self.evicted = 0

    def take(self, ip: str, cancel: Callable[[], None]) -> Slot | str:
        """A slot for a handshake from ``ip``, or why there is none (the refusal's
        reason); may evict (cancel) an old handshake to make room."""
        if self.per_ip and ip not in self.exempt and self._by_ip[ip] >= self.per_ip:
            return "pending handshakes per IP"
        if len(self._slots) >= self.total:
            victim = self._victim()
            if victim is None:
                return "pending handshakes"
            self.release(victim)
            self.evicted += 1
            victim.cancel()
        slot = Slot(ip, self._clock(), cancel)
        self._slots.append(slot)
        self._by_ip[ip] += 1
        return slot

    def release(self, slot: Slot) -> None:
        """The handshake of ``slot`` ended (done, failed or evicted); idempotent."""
        if slot in self._slots:
            self._slots.remove(slot)
            self._by_ip[slot.ip] -= 1
            if not self._by_ip[slot.ip]:
                del self._by_ip[slot.ip]

    def _victim(self) -> Slot | None:
        cutoff = self._clock() - self.fair_age_s
        old = [s for s in self._slots if s.started <= cutoff]
        if not old:
            return None
        # max() keeps the first of equals, and the slots are oldest first.
        return max(old, key=lambda s: self._by_ip[s.ip])

    def __len__(self) -> int:
        return len(self._slots)

    def held_by(self, ip: str) -> int:
        return self._by_ip[ip]
