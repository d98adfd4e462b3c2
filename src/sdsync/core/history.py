"""The causal history a channel quotes, kept encoded from one message to the next.

Theory of operation
-------------------
Every message we send quotes the newest ``causal_history_size`` entries of the local
log (200 with js-waku's defaults), and between two sends the log usually gains one entry
at its end: the two histories share all but their oldest and newest entries. Turning 200
log entries into history entries and encoding each of them again is most of what a send
costs, so :class:`HistoryWindow` remembers the log entries it last quoted and the
:class:`~sdsync.wire.codec.EncodedHistory` it made of them, and builds the next one from
the entries that are new only.

The shared run is found by value, never assumed: the window compares the new tail of the
log with the one it remembers (entries are immutable, and equal entries quote the same
bytes), and reuses the longest suffix of the old tail that begins the new one. A message
slotted into the middle of the log, a retrieval hint set on a quoted entry or a restored
log shares less or nothing, and is encoded afresh: the bytes are always those of the
current tail.
"""

from __future__ import annotations

from sdsync.core.log import LocalLog, LogEntry
from sdsync.wire.codec import EncodedHistory


class HistoryWindow:
    """The newest ``size`` entries of a log, as the encoded causal history to quote."""

    __slots__ = ("_quoted", "_tail", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._tail: list[LogEntry] = []
        self._quoted = EncodedHistory()

    def quote(self, log: LocalLog) -> EncodedHistory:
        """The causal history of a message sent now."""
        tail = log.tail(self.size)
        old = self._tail
        if tail == old:
            return self._quoted
        kept = _overlap(old, tail)
        added = tuple(entry.history_entry for entry in tail[kept:])
        quoted = self._quoted.slide(len(old) - kept, added)
        self._tail, self._quoted = tail, quoted
        return quoted


def _overlap(old: list[LogEntry], new: list[LogEntry]) -> int:
    """How many entries ``new`` begins with that ``old`` ends with (0 if it does not)."""
    if not old or not new:
        return 0
    # Usually the log gained one entry since: all of new but its newest.
    kept = len(new) - 1
    if 0 < kept <= len(old) and old[len(old) - kept :] == new[:kept]:
        return kept
    first = new[0]
    for start, entry in enumerate(old):
        if entry is first:
            kept = len(old) - start
            return kept if kept <= len(new) and old[start:] == new[:kept] else 0
    return 0
