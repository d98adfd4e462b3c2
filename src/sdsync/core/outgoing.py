"""The outgoing buffer's entries, and where their wire bytes are kept.

Theory of operation
-------------------
A resend must repeat the original bytes exactly (a Waku store or relay recognises a copy
by its hash, and the retrieval hint other participants hold is that hash), so the bytes
of every unacknowledged message must stay reachable until it is acknowledged or given up.
They are also the largest thing the core holds: with js-waku's defaults each one carries
an 18.7 kB bloom filter and 200 causal-history entries, about 38 kB. So an
:class:`OutgoingEntry` keeps only what acknowledgement and resend scheduling need (id,
Lamport timestamp, content, bloom positions, attempts, possible ackers, retrieval hint)
and the bytes live in a :class:`WireStore`: a dict by default, or the durable state,
which holds the messages anyway (see :mod:`sdsync.runtime.state`), so that a long stream
of unacknowledged messages costs memory per entry, not per byte sent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from sdsync.core.bloom import Position


class OutgoingState(enum.Enum):
    UNACKNOWLEDGED = "unacknowledged"
    POSSIBLY_ACKNOWLEDGED = "possibly_acknowledged"


@dataclass(slots=True)
class OutgoingEntry:
    """One of our content messages awaiting acknowledgement."""

    message_id: str
    lamport_timestamp: int
    content: bytes
    positions: tuple[Position, ...]
    first_sent_ms: int
    last_sent_ms: int
    attempts: int = 1
    possible_ackers: set[str] = field(default_factory=set)
    # The transport's retrieval hint, carried into the log when the message enters it.
    retrieval_hint: bytes | None = None

    @property
    def state(self) -> OutgoingState:
        if self.possible_ackers:
            return OutgoingState.POSSIBLY_ACKNOWLEDGED
        return OutgoingState.UNACKNOWLEDGED


class WireStore(Protocol):
    """The wire bytes of the outgoing buffer's messages, by message id."""

    def __getitem__(self, message_id: str) -> bytes: ...

    def __setitem__(self, message_id: str, data: bytes) -> None: ...

    def __delitem__(self, message_id: str) -> None: ...

    def __contains__(self, message_id: object) -> bool: ...


class MemoryWireStore(dict[str, bytes]):
    """Keeps the bytes in memory: the default when nothing durable is attached."""
