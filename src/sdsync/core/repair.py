"""SDS-R: asking the group to rebroadcast what we miss, and answering such requests.

Theory of operation
-------------------
Two time-ordered buffers, both O(log n) per operation:

* *requests we will send* — each missing dependency gets a request time
  ``T_req = now + hash(pid + mid) mod (T_max - T_min) + T_min``; once due, up to three
  ride on our next content or sync message. If the message still has not arrived by
  ``T_max`` later, it becomes eligible again (js-waku asks only once).
* *responses we owe* — when a peer asks for a message we hold and we are in its response
  group, we schedule ``T_resp = now + (hash(pid) XOR hash(sender)) * hash(mid) mod T_max``
  so the original sender answers first and others only if nobody did.

Seeing the message cancels both our request and our response; seeing someone else's
request for it defers ours by ``T_max`` (in case their repair fails too).

A peer can also ask without knowing it: a gap that no message it received ever named —
with a causal history of 2-3 ids, one lost message and the few that named it — is never
requested. Its sync messages still show the gap, as an id missing from their bloom
filter. Such *implied requests* are answered exactly like explicit ones (response groups,
``T_resp``, cancelled by anyone's rebroadcast), at most once per ``T_min`` per message,
so a peer's next sync, sent before the rebroadcast reached it, does not trigger another.

The hash is the first 8 bytes of sha256 as a big-endian integer, as in js-waku, so mixed
groups agree on who answers when.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from sortedcontainers import SortedList

from sdsync.core.config import RepairConfig
from sdsync.core.journal import Journal
from sdsync.wire import HistoryEntry


def repair_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def request_time(config: RepairConfig, participant_id: str, message_id: str, now_ms: int) -> int:
    span = config.t_max_ms - config.t_min_ms
    return now_ms + repair_hash(participant_id + message_id) % span + config.t_min_ms


def response_time(
    config: RepairConfig, participant_id: str, sender_id: str, message_id: str, now_ms: int
) -> int:
    distance = repair_hash(participant_id) ^ repair_hash(sender_id)
    return now_ms + (distance * repair_hash(message_id)) % config.t_max_ms


def in_response_group(
    config: RepairConfig, participant_id: str, sender_id: str, message_id: str
) -> bool:
    groups = config.response_groups
    if groups <= 1:
        return True
    mine = repair_hash(participant_id + message_id) % groups
    return mine == repair_hash(sender_id + message_id) % groups


@dataclass(slots=True)
class _Scheduled:
    entry: HistoryEntry
    due_ms: int


class _TimedBuffer:
    """Entries keyed by message id, ordered by due time; full ⇒ evict the latest-due."""

    __slots__ = ("_by_id", "_order", "capacity", "touched")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_id: dict[str, _Scheduled] = {}
        self._order: SortedList = SortedList()
        # Ids added or removed, for durable storage (None: nobody is recording).
        self.touched: set[str] | None = None

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def add(self, entry: HistoryEntry, due_ms: int) -> bool:
        if entry.message_id in self._by_id:
            return False
        if len(self._by_id) >= self.capacity:
            _, evicted = self._order.pop()
            del self._by_id[evicted]
            self._touch(evicted)
        self._by_id[entry.message_id] = _Scheduled(entry, due_ms)
        self._order.add((due_ms, entry.message_id))
        self._touch(entry.message_id)
        return True

    def _touch(self, message_id: str) -> None:
        if self.touched is not None:
            self.touched.add(message_id)

    def get(self, message_id: str) -> tuple[HistoryEntry, int] | None:
        item = self._by_id.get(message_id)
        return (item.entry, item.due_ms) if item is not None else None

    def ids(self) -> list[str]:
        return list(self._by_id)

    def entry(self, message_id: str) -> HistoryEntry | None:
        item = self._by_id.get(message_id)
        return item.entry if item is not None else None

    def remove(self, message_id: str) -> None:
        item = self._by_id.pop(message_id, None)
        if item is not None:
            self._order.remove((item.due_ms, message_id))
            self._touch(message_id)

    def pop_due(self, now_ms: int, limit: int | None = None) -> list[HistoryEntry]:
        out: list[HistoryEntry] = []
        while self._order and (limit is None or len(out) < limit):
            due_ms, message_id = self._order[0]
            if due_ms > now_ms:
                break
            self._order.pop(0)
            out.append(self._by_id.pop(message_id).entry)
            self._touch(message_id)
        return out

    def next_due(self) -> int | None:
        # _by_id and _order always hold the same ids; a dict's length is the cheaper test.
        return self._order[0][0] if self._by_id else None


class RepairState:
    """Both SDS-R buffers of one participant in one channel."""

    def __init__(self, config: RepairConfig, participant_id: str) -> None:
        self.config = config
        self.participant_id = participant_id
        self.requests = _TimedBuffer(config.buffer_size)
        self.responses = _TimedBuffer(config.buffer_size)
        # When we last rebroadcast each message (recent ones; not worth storing).
        self._answered: OrderedDict[str, int] = OrderedDict()

    def attach_journal(self, journal: Journal) -> None:
        self.requests.touched = journal.repair_requests
        self.responses.touched = journal.repair_responses

    def restore(
        self,
        requests: Iterable[tuple[HistoryEntry, int]],
        responses: Iterable[tuple[HistoryEntry, int]],
    ) -> None:
        for entry, due_ms in requests:
            self.requests.add(entry, due_ms)
        for entry, due_ms in responses:
            self.responses.add(entry, due_ms)

    def mark_missing(self, entry: HistoryEntry, now_ms: int) -> None:
        due = request_time(self.config, self.participant_id, entry.message_id, now_ms)
        self.requests.add(entry, due)

    def request_again(self, entries: Iterable[HistoryEntry], now_ms: int) -> None:
        """Schedule requests for gaps that have none (dropped while the buffer was full)."""
        requests = self.requests
        for entry in entries:
            if len(requests) >= requests.capacity:
                return
            if entry.message_id not in requests:
                self.mark_missing(entry, now_ms)

    def mark_received(self, message_id: str) -> None:
        self.requests.remove(message_id)
        self.responses.remove(message_id)

    def defer_request(self, message_id: str, now_ms: int) -> None:
        """Someone else asked for what we miss: hold back, ask ourselves only if that fails.

        js-waku forgets the request here, so a lost response leaves the gap forever.
        """
        entry = self.requests.entry(message_id)
        if entry is not None:
            self.requests.remove(message_id)
            self.requests.add(entry, now_ms + self.config.t_max_ms)

    def take_requests(self, now_ms: int) -> list[HistoryEntry]:
        """Due requests to attach to the next outgoing message; re-armed for later."""
        due = self.requests.pop_due(now_ms, self.config.max_requests_per_message)
        for entry in due:
            self.requests.add(entry, now_ms + self.config.t_max_ms)
        return due

    def put_back(self, taken: Iterable[HistoryEntry], now_ms: int) -> None:
        """Requests taken for a message that did not carry them: due now again."""
        for entry in taken:
            self.requests.remove(entry.message_id)
            self.requests.add(entry, now_ms)

    def schedule_response(self, request: HistoryEntry, now_ms: int) -> bool:
        """Queue a rebroadcast if we are in the request's response group."""
        sender = request.sender_id
        if not sender or not in_response_group(
            self.config, self.participant_id, sender, request.message_id
        ):
            return False
        due = response_time(self.config, self.participant_id, sender, request.message_id, now_ms)
        return self.responses.add(request, due)

    def answer_implied(self, entries: Iterable[HistoryEntry], now_ms: int) -> None:
        """Schedule rebroadcasts of messages a peer's bloom filter shows it lacks."""
        for entry in entries:
            answered = self._answered.get(entry.message_id)
            if answered is None or now_ms - answered >= self.config.t_min_ms:
                self.schedule_response(entry, now_ms)

    def take_responses(self, now_ms: int) -> list[HistoryEntry]:
        due = self.responses.pop_due(now_ms)
        for entry in due:
            self._answered[entry.message_id] = now_ms
            self._answered.move_to_end(entry.message_id)
        while len(self._answered) > self.config.buffer_size:
            self._answered.popitem(last=False)
        return due

    def set_participant_count(self, participants: int) -> RepairConfig:
        self.config = replace(self.config, response_groups=max(1, participants // 128))
        return self.config
