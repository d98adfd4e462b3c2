"""Discrete-event simulation of an SDS group on a virtual clock.

Theory of operation
-------------------
One heap of timed events drives everything. Each event is one small frozen class that
carries what it needs (the union :data:`Event`): a participant publishing
(:class:`Publish`), a packet copy arriving (:class:`Arrival`), a participant's driver
waking up (:class:`Wake`), a store's answer (:class:`StoreReply`) or a catch-up's listing
(:class:`Listed`) reaching a participant, and the faults: a participant leaving or coming
back (:class:`Churn`), a store going down or back up (:class:`StoreChurn`), the group
splitting or healing (:class:`Partition`). The heap orders ``(time, rank, sequence,
event)`` tuples: events due at the same time run by their class's ``rank`` (faults first,
then copies arriving, store answers, listings, publishes, wake-ups), and then in the order
they were scheduled, so the event itself is never compared. :meth:`Simulation.run`
dispatches with ``match``, so each handler takes its own event class. Every random choice
comes from one ``random.Random(seed)``, so the same seed replays the same run bit for bit.

Participants run the real engine: a :class:`~sdsync.core.MessageChannel` wrapped in the
runtime's :class:`~sdsync.runtime.ChannelDriver`, exactly as the live runtime does; the
simulator only carries out the driver's actions (broadcast bytes, query a store) and keeps
ground truth to check the outcome. A broadcast is decoded once and the immutable message
shared by all receivers, which is what lets one core process a million receives quickly.

Store nodes archive every copy they hear (by retrieval hint, by message id, and in time
order per channel) and answer queries for missing dependencies after a round trip, unless
they are in an outage. A driver's store catch-up (:class:`~sdsync.runtime.CatchUp`) runs
in two phases, as the runtime's does. First the window is listed from the archive as it
stands when asked: the hashes of the messages sent in it, without their data, in pages of
``store_catchup_page_size`` (at most 100), one round trip each. When the last page would
arrive the participant keeps the hashes its driver has not seen (it remembers every
envelope it received or sent, :meth:`~sdsync.runtime.ChannelDriver.saw`), and fetches
those by hash, at most 100 per query, one round trip each; everything fetched reaches it
together when the last answer would arrive. With no store online (or the listing's store
gone by the fetch) the driver hears of the failure after one round trip, and retries the
window at its next interval. A participant coming back online catches up at once, as a
restarted runtime does. Every store exchange is counted in round trips and in the bytes of
its StoreQueryRequest and StoreQueryResponse as the libp2p store protocol encodes them
(``store_query_bytes``; ``bytes_on_wire`` stays the relay's copies).

Every broadcast travels as a WakuMessage: the SDS bytes are its payload, the channel has
its own content topic, and its timestamp is the virtual send time on a fixed epoch.  The
retrieval hint is that envelope's deterministic Waku message hash, as on a real network,
so a store's archive is exactly what a Waku store node would hold (and what the Spark
pipeline reconciles).
"""

from __future__ import annotations

import bisect
import heapq
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, assert_never

from sdsync.core import BloomParams, ChannelConfig, MessageChannel, RepairConfig
from sdsync.runtime import CatchUp, ChannelDriver, QueryStore, RuntimeConfig, Step, Transmit
from sdsync.sim.config import SimConfig, participant_name
from sdsync.sim.record import Recorder
from sdsync.waku.store.rpc import (
    MAX_STORE_PAGE_SIZE,
    StoreQueryRequest,
    StoreQueryResponse,
    WakuMessageKeyValue,
)
from sdsync.wire import Message, decode, message_hash
from sdsync.wire.waku import WakuMessage

CHECK_EVERY_MS = 5_000

PUBSUB_TOPIC = "/waku/2/default-waku/proto"
EPOCH_NS = 1_735_689_600 * 10**9
"""Virtual time 0 as Unix time in nanoseconds (2025-01-01T00:00:00Z), for Waku timestamps."""


@dataclass(slots=True)
class Participant:
    index: int
    name: str
    drivers: list[ChannelDriver]
    online: bool = True
    wake_at: int = -1
    burst_bad: bool = False  # Gilbert–Elliott state of this receiver


@dataclass(slots=True)
class SimulatedStore:
    index: int
    online: bool = True
    by_hint: dict[bytes, bytes] = field(default_factory=dict)
    # (channel, message id) -> the retrieval hint of the latest copy archived
    by_id: dict[tuple[int, str], bytes] = field(default_factory=dict)
    # per channel, in the order heard (so by send time): send times and retrieval hints
    sent_ms: dict[int, list[int]] = field(default_factory=dict)
    sent_hints: dict[int, list[bytes]] = field(default_factory=dict)

    def archive(self, channel: int, hint: bytes, data: bytes, now_ms: int) -> None:
        if hint not in self.by_hint:
            self.sent_ms.setdefault(channel, []).append(now_ms)
            self.sent_hints.setdefault(channel, []).append(hint)
        self.by_hint[hint] = data

    def between(self, channel: int, start_ms: int, end_ms: int) -> list[bytes]:
        """The hints of the messages sent on ``channel`` in [start_ms, end_ms], in order."""
        times = self.sent_ms.get(channel, [])
        low = bisect.bisect_left(times, start_ms)
        high = bisect.bisect_right(times, end_ms)
        return self.sent_hints[channel][low:high] if high > low else []


ChannelFactory = Callable[[str, str, int, ChannelConfig], MessageChannel]


def default_channel_factory(
    channel_id: str, participant_id: str, now_ms: int, config: ChannelConfig
) -> MessageChannel:
    return MessageChannel(channel_id, participant_id, now_ms=now_ms, config=config)


def content_topic(channel_id: str) -> str:
    return f"/sdsync/1/{channel_id}/proto"


def waku_timestamp(now_ms: int) -> int:
    return EPOCH_NS + now_ms * 1_000_000


def retrieval_hint(data: bytes, topic: str, now_ms: int) -> bytes:
    """The Waku message hash of ``data`` broadcast on content topic ``topic`` at ``now_ms``."""
    return message_hash(PUBSUB_TOPIC, data, topic, b"", waku_timestamp(now_ms))


_Packet = tuple[int, Message, bytes, bytes, int]
"""A broadcast as every receiver gets it: channel, the decoded message, its bytes, its
retrieval hint, and its size (one int object that every receive row of the event table
shares)."""

_ARRIVAL_TIMES_KEPT = 4_096
"""Arrival times remembered for sharing (a broadcast's copies land within a second)."""

# The ranks of the events due at the same time, in the order they run: a fault takes
# effect before what else happens at that instant, and a participant wakes up last, once
# everything that reached it then is in.
_CHURN, _OUTAGE, _ARRIVE, _STORE_REPLY, _LISTED, _PUBLISH, _WAKE = range(7)


@dataclass(frozen=True, slots=True)
class Arrival:
    """A copy of a broadcast reaches a participant."""

    rank: ClassVar[int] = _ARRIVE
    participant: int
    packet: _Packet


@dataclass(frozen=True, slots=True)
class Wake:
    """A participant's drivers are due; skipped if a sooner wake-up superseded it."""

    rank: ClassVar[int] = _WAKE
    participant: int


@dataclass(frozen=True, slots=True)
class Publish:
    """A participant sends the workload's message ``number``."""

    rank: ClassVar[int] = _PUBLISH
    participant: int
    number: int


@dataclass(frozen=True, slots=True)
class StoreReply:
    """A store's answer reaches a participant: the (hint, bytes) found, the catch-up it
    answers (None: a query by hint), and whether a store answered at all."""

    rank: ClassVar[int] = _STORE_REPLY
    participant: int
    channel: int
    found: list[tuple[bytes, bytes]]
    window: CatchUp | None
    answered: bool = True


@dataclass(frozen=True, slots=True)
class Listed:
    """A catch-up's listing reaches a participant: the store that answered and the
    hashes it listed in the window."""

    rank: ClassVar[int] = _LISTED
    participant: int
    channel: int
    window: CatchUp
    store: SimulatedStore
    hints: list[bytes]


@dataclass(frozen=True, slots=True)
class Churn:
    """A participant goes offline (losing its volatile state or not) or comes back."""

    rank: ClassVar[int] = _CHURN
    participant: int
    online: bool
    lose_state: bool = False


@dataclass(frozen=True, slots=True)
class StoreChurn:
    """A store node goes down or comes back (a store outage starts or ends)."""

    rank: ClassVar[int] = _OUTAGE
    store: int
    online: bool


@dataclass(frozen=True, slots=True)
class Partition:
    """The group splits: the members of each of ``groups`` hear only each other, and
    everyone in none of them forms one more group. No groups: the partition heals."""

    rank: ClassVar[int] = _OUTAGE
    groups: tuple[tuple[int, ...], ...]


Event = Arrival | Wake | Publish | StoreReply | Listed | Churn | StoreChurn | Partition

_REQUEST_ID = "0" * 32
"""As long as the uuid4 hex a client sends."""


_EMPTY_RESPONSE = len(StoreQueryResponse(_REQUEST_ID, 200, "OK").to_bytes())
_HASH_ENTRY = (
    len(
        StoreQueryResponse(
            _REQUEST_ID, 200, "OK", messages=(WakuMessageKeyValue(bytes(32)),)
        ).to_bytes()
    )
    - _EMPTY_RESPONSE
)
"""The bytes a hash-only entry (a listing's) adds to a StoreQueryResponse."""


def _entry_size(hint: bytes, data: bytes, topic: str, sent_ms: int) -> int:
    """The bytes one archived message adds to a StoreQueryResponse (entries are a
    repeated field: each adds the same bytes whatever else the page holds)."""
    message = WakuMessage(data, topic, timestamp=waku_timestamp(sent_ms))
    entry = WakuMessageKeyValue(hint, message, PUBSUB_TOPIC)
    page = StoreQueryResponse(_REQUEST_ID, 200, "OK", messages=(entry,))
    return len(page.to_bytes()) - _EMPTY_RESPONSE


def _bloom_field_size(message: Message) -> int:
    """The bytes of ``message``'s bloom-filter field as encoded: one tag byte (field 12),
    the length as a varint, the filter."""
    bloom = message.bloom_filter
    if bloom is None:
        return 0
    return 1 + max(1, (len(bloom).bit_length() + 6) // 7) + len(bloom)


class Simulation:
    def __init__(
        self,
        config: SimConfig,
        *,
        record_events: bool = True,
        channel_factory: ChannelFactory = default_channel_factory,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.now = 0
        self.recorder = Recorder(config, record_events)
        self._progress = progress
        self._heap: list[tuple[int, int, int, Event]] = []
        self._seq = 0
        proto = config.protocol
        self.channel_config = ChannelConfig(
            causal_history_size=proto.causal_history,
            bloom=BloomParams(proto.bloom_capacity, proto.bloom_error_rate),
            possible_acks_threshold=proto.possible_acks_threshold,
            lost_timeout_ms=proto.lost_timeout_ms,
            # The checker reads every log from memory: the whole run must fit the window.
            max_log_entries=max(ChannelConfig().max_log_entries, config.workload.messages),
            # The spec's G = max(1, n / 128) follows from the group's size, which every
            # driver is told (ChannelDriver's participants), as an application does.
            repair=RepairConfig(
                enabled=proto.repair, t_min_ms=proto.repair_t_min_ms, t_max_ms=proto.repair_t_max_ms
            ),
        )
        self.runtime_config = RuntimeConfig(
            sync_interval_ms=proto.sync_interval_ms,
            sync_ms_per_participant=proto.sync_ms_per_participant,
            resend_interval_ms=proto.resend_interval_ms,
            resend_possibly_acknowledged_ms=proto.resend_possibly_acknowledged_ms,
            max_attempts=proto.max_attempts,
            store_catchup=proto.store_catchup,
            store_catchup_interval_ms=proto.store_catchup_interval_ms,
            store_catchup_margin_ms=proto.store_catchup_margin_ms,
            store_catchup_page_size=proto.store_catchup_page_size,
            store_catchup_seen_hashes=proto.store_catchup_seen_hashes,
            defer_owed_acknowledgements=proto.defer_owed_acknowledgements,
        )
        self.channel_ids = [f"channel-{c}" for c in range(config.channels)]
        self.content_topics = [content_topic(c) for c in self.channel_ids]
        self._factory = channel_factory
        self.participants = [self._new_participant(i) for i in range(config.participants)]
        self.stores = [SimulatedStore(i) for i in range(config.stores)]
        # retrieval hint -> (send time, channel) of every broadcast a store heard: what an
        # archive needs besides the bytes to rebuild each WakuMessage.
        self.envelopes: dict[bytes, tuple[int, int]] = {}
        # retrieval hint -> size of its entry in a StoreQueryResponse, once asked for
        self._entry_bytes: dict[bytes, int] = {}
        self._arrival_times: dict[int, int] = {}
        self._partition_of: list[int] = [0] * config.participants
        # The run may stop early once consistent, but never before the last scheduled fault:
        # a scenario whose participant goes offline after the workload must see it happen.
        self._fault_ends: list[int] = []
        self._schedule_faults()
        self._schedule_workload()
        for p in self.participants:
            self._rearm(p)

    # ------------------------------------------------------------------ setup

    def _new_participant(self, index: int) -> Participant:
        name = participant_name(index)
        drivers = [
            ChannelDriver(
                self._factory(cid, name, self.now, self.channel_config),
                self.runtime_config,
                self.rng,
                self.now,
                query_stores=self.config.stores > 0,
                participants=self.config.participants,
            )
            for cid in self.channel_ids
        ]
        return Participant(index, name, drivers)

    def _push(self, at: int, event: Event) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, event.rank, self._seq, event))

    def _schedule_workload(self) -> None:
        work = self.config.workload
        n = self.config.participants
        for i in range(work.total_messages(self.config.participants)):
            at = int(self.rng.uniform(0, work.duration_ms))
            if work.hot_senders and self.rng.random() < work.hot_senders:
                sender = 0
            else:
                sender = self.rng.randrange(n)
            self._push(at, Publish(sender, i))

    def _schedule_faults(self) -> None:
        config = self.config
        self._fault_ends = (
            [c.end_ms for c in config.churn]
            + [o.end_ms for o in config.store_outages]
            + [p.heal_ms for p in config.partitions]
        )
        for churn in config.churn:
            offline = Churn(churn.participant, online=False, lose_state=churn.lose_volatile_state)
            self._push(churn.start_ms, offline)
            self._push(churn.end_ms, Churn(churn.participant, online=True))
        for outage in config.store_outages:
            self._push(outage.start_ms, StoreChurn(outage.store, online=False))
            self._push(outage.end_ms, StoreChurn(outage.store, online=True))
        halves = (tuple(range(config.participants // 2)),)
        for part in config.partitions:
            self._push(part.start_ms, Partition(part.groups or halves))
            self._push(part.heal_ms, Partition(()))

    # -------------------------------------------------------------------- run

    def run(self) -> None:
        work = self.config.workload
        # Quiescence is only worth checking once nothing more is scheduled to happen.
        settle_from = max([work.duration_ms, *self._fault_ends])
        # A fault that ends within the run is given the whole drain after it (one that
        # ended at workload + drain would be judged the moment it healed); one that
        # outlasts the run is the scenario's point, and is reported (offline at the end).
        planned = work.duration_ms + self.config.drain_ms
        healed = max((end for end in self._fault_ends if end <= planned), default=0)
        deadline = max(planned, healed + self.config.drain_ms)
        next_check = 0
        heap = self._heap
        while heap:
            at, _, _, event = heap[0]
            if at > deadline:
                break
            if at >= next_check:
                next_check = at + CHECK_EVERY_MS
                if self._progress is not None:
                    self._progress(at, deadline)
                if at >= settle_from and self._quiescent():
                    break
            heapq.heappop(heap)
            self.now = at
            match event:  # the commonest first: each case is one isinstance check
                case Arrival():
                    self._arrive(event)
                case Wake():
                    self._wake(event)
                case Publish():
                    self._publish(event)
                case StoreReply():
                    self._store_reply(event)
                case Listed():
                    self._listed(event)
                case Churn():
                    self._churn(event)
                case StoreChurn():
                    self.stores[event.store].online = event.online
                case Partition():
                    self._partition(event)
                case _:
                    assert_never(event)
        self.recorder.finish(
            self.now,
            [p.online for p in self.participants],
            [[driver.channel for driver in p.drivers] for p in self.participants],
        )

    def _quiescent(self) -> bool:
        """Everything sent is in every log and nothing waits to be acknowledged."""
        sent = self.recorder.sent_per_channel
        for p in self.participants:
            if not p.online:
                return False
            for c, driver in enumerate(p.drivers):
                chan = driver.channel
                if chan.log.total < sent[c]:
                    return False
                if chan.outgoing_ids():
                    return False
        return True

    # ---------------------------------------------------------------- actions

    def _publish(self, event: Publish) -> None:
        p = self.participants[event.participant]
        number = event.number
        if not p.online:
            return  # an offline participant writes nothing
        channel = number % self.config.channels
        payload = f"{p.name} #{number} ".encode().ljust(self.config.workload.payload_bytes, b".")
        published = p.drivers[channel].publish(payload, self.now)
        self.recorder.published(p.index, channel, published.message_id)
        self._carry_out(p, channel, published.whole())

    def _wake(self, event: Wake) -> None:
        p = self.participants[event.participant]
        if not p.online or self.now != p.wake_at:
            return
        p.wake_at = -1
        for channel, driver in enumerate(p.drivers):
            if driver.next_due() <= self.now:
                self._carry_out(p, channel, driver.tick(self.now))
        self._rearm(p)

    def _rearm(self, p: Participant) -> None:
        drivers = p.drivers  # after every step: one channel needs no generator
        earliest = (
            drivers[0].next_due() if len(drivers) == 1 else min(d.next_due() for d in drivers)
        )
        due = max(self.now, earliest)
        if p.wake_at < 0 or due < p.wake_at:
            p.wake_at = due
            self._push(due, Wake(p.index))

    def _carry_out(self, p: Participant, channel: int, step: Step) -> None:
        self.recorder.events(p.index, channel, step.events, self.now)
        for action in step.actions:
            if isinstance(action, Transmit):
                self._broadcast(p, channel, action)
            elif isinstance(action, QueryStore):
                self._query_store(p, channel, action)
            elif isinstance(action, CatchUp):
                self._catch_up(p, channel, action)
        self._rearm(p)

    def _broadcast(self, sender: Participant, channel: int, action: Transmit) -> None:
        data = action.data
        hint = retrieval_hint(data, self.content_topics[channel], self.now)
        driver = sender.drivers[channel]
        if action.kind == "content":
            driver.channel.set_retrieval_hint(action.message_id, hint)
        driver.saw(hint)  # a catch-up need not fetch what this participant sent
        message = decode(data, self.channel_config.limits)
        packet: _Packet = (channel, message, data, hint, len(data))
        self.recorder.transmitted(sender.index, channel, action, hint, self.now)
        net = self.config.network
        rng = self.rng
        partition_of = self._partition_of
        group = partition_of[sender.index]
        on_wire = 0
        # The event table keeps every receive's time: equal times share one int object.
        times = self._arrival_times
        if len(times) > _ARRIVAL_TIMES_KEPT:
            times.clear()
        for p in self.participants:
            if p is sender:
                continue
            if partition_of[p.index] != group:
                # Recorded (not counted as a copy on the wire) so a pipeline sees the cut.
                self.recorder.dropped_copy(
                    p.index, channel, message.message_id, "partition", self.now
                )
                continue
            on_wire += 1
            reason = self._lost(p, net.loss)
            if reason is not None:
                self.recorder.dropped_copy(p.index, channel, message.message_id, reason, self.now)
                continue
            copies = 2 if net.duplicate and rng.random() < net.duplicate else 1
            for _ in range(copies):
                latency = self._latency(self._link_factor(sender.index, p.index))
                at = self.now + latency
                self._push(times.setdefault(at, at), Arrival(p.index, packet))
        self.recorder.on_wire(action.kind, len(data), _bloom_field_size(message), on_wire)
        for store in self.stores:
            if store.online and not (net.store_loss and rng.random() < net.store_loss):
                store.archive(channel, hint, data, self.now)
                store.by_id[(channel, message.message_id)] = hint
                self.envelopes[hint] = (self.now, channel)

    def _lost(self, p: Participant, loss: float) -> str | None:
        """Why this copy to ``p`` is lost ("burst" or "loss"), or None if it gets through."""
        net = self.config.network
        rng = self.rng
        if net.burst_enter:
            if p.burst_bad:
                p.burst_bad = rng.random() >= net.burst_exit
            else:
                p.burst_bad = rng.random() < net.burst_enter
            if p.burst_bad and rng.random() < net.burst_loss:
                return "burst"
        return "loss" if loss and rng.random() < loss else None

    def _link_factor(self, sender: int, receiver: int) -> float:
        spread = self.config.network.link_spread
        if not spread:
            return 1.0
        key = f"{self.config.seed}:{sender}:{receiver}".encode()
        return 1.0 + spread * (2.0 * zlib.crc32(key) / 0xFFFFFFFF - 1.0)

    def _latency(self, factor: float = 1.0) -> int:
        net = self.config.network
        mean = net.latency_ms * factor
        delay = self.rng.gauss(mean, net.jitter_ms) if net.jitter_ms else mean
        if net.reorder and self.rng.random() < net.reorder:
            delay += net.reorder_delay_ms
        return max(1, int(delay))

    def _arrive(self, event: Arrival) -> None:
        index = event.participant
        p = self.participants[index]
        channel, message, data, hint, size = event.packet
        if not p.online:
            self.recorder.dropped_copy(index, channel, message.message_id, "offline", self.now)
            return
        self.recorder.receive_events += 1
        step = p.drivers[channel].receive_message(message, self.now, retrieval_hint=hint, data=data)
        self.recorder.received(p.index, channel, message, size, self.now)
        self._carry_out(p, channel, step)

    def _query_store(self, p: Participant, channel: int, query: QueryStore) -> None:
        online = [s for s in self.stores if s.online]
        self.recorder.store_queries += 1
        if not online:
            return
        store = online[self.rng.randrange(len(online))]
        found = []
        for entry in query.entries:
            hint = entry.retrieval_hint
            if hint is None or hint not in store.by_hint:
                hint = store.by_id.get((channel, entry.message_id))
            if hint is not None:
                found.append((hint, store.by_hint[hint]))
        hashes = tuple(e.retrieval_hint for e in query.entries if e.retrieval_hint is not None)
        request = StoreQueryRequest(
            _REQUEST_ID, include_data=True, message_hashes=hashes[:MAX_STORE_PAGE_SIZE]
        )
        self._count_exchange(request, None, self._data_entries(channel, found))
        rtt = self._latency() + self._latency()
        self._push(self.now + rtt, StoreReply(p.index, channel, found, window=None))

    def _catch_up(self, p: Participant, channel: int, window: CatchUp) -> None:
        """Phase one: list the window's hashes, page by page."""
        online = [s for s in self.stores if s.online]
        if not online:  # refused or timed out: the driver hears it after a round trip
            self._catch_up_failed(p, channel, window)
            return
        store = online[self.rng.randrange(len(online))]
        hints = store.between(channel, window.start_ms, window.end_ms)
        size = min(self.runtime_config.store_catchup_page_size, MAX_STORE_PAGE_SIZE)
        at = self.now
        for start in range(0, max(1, len(hints)), size):
            entries = min(size, len(hints) - start)
            last = start + size >= len(hints)
            request = StoreQueryRequest(
                _REQUEST_ID,
                include_data=False,
                content_topics=(self.content_topics[channel],),
                time_start=waku_timestamp(window.start_ms),
                time_end=waku_timestamp(window.end_ms),
                pagination_cursor=None if start == 0 else hints[start - 1],
                pagination_forward=True,
                pagination_limit=size,
            )
            cursor = None if last else hints[start + size - 1]
            self._count_exchange(request, cursor, entries * _HASH_ENTRY)
            at += self._latency() + self._latency()
        self._push(at, Listed(p.index, channel, window, store, hints))

    def _listed(self, listing: Listed) -> None:
        """Phase two: fetch by hash what the participant has not seen, 100 per query."""
        p = self.participants[listing.participant]
        channel, window, store = listing.channel, listing.window, listing.store
        if not p.online:
            p.drivers[channel].catch_up_failed(self.now)
            return
        if not store.online:
            self._catch_up_failed(p, channel, window)
            return
        unseen = p.drivers[channel].unseen(listing.hints)
        found = [(hint, store.by_hint[hint]) for hint in unseen]
        at = self.now
        for start in range(0, len(unseen), MAX_STORE_PAGE_SIZE):
            batch = found[start : start + MAX_STORE_PAGE_SIZE]
            request = StoreQueryRequest(
                _REQUEST_ID,
                include_data=True,
                message_hashes=tuple(unseen[start : start + MAX_STORE_PAGE_SIZE]),
            )
            self._count_exchange(request, None, self._data_entries(channel, batch))
            at += self._latency() + self._latency()
        self.recorder.catch_ups += 1
        self.recorder.catch_up_fetched += len(found)
        self._push(at, StoreReply(p.index, channel, found, window))

    def _catch_up_failed(self, p: Participant, channel: int, window: CatchUp) -> None:
        failed = StoreReply(p.index, channel, [], window, answered=False)
        self._push(self.now + self._latency() + self._latency(), failed)

    def _count_exchange(
        self, request: StoreQueryRequest, cursor: bytes | None, entries: int
    ) -> None:
        """One round trip to a store: its request's bytes and its response's, whose
        entries take ``entries`` bytes."""
        response = StoreQueryResponse(_REQUEST_ID, 200, "OK", pagination_cursor=cursor)
        self.recorder.store_round_trips += 1
        self.recorder.store_query_bytes += (
            len(request.to_bytes()) + len(response.to_bytes()) + entries
        )

    def _data_entries(self, channel: int, found: list[tuple[bytes, bytes]]) -> int:
        """The bytes ``found``'s messages, with their data, add to a StoreQueryResponse."""
        sizes = self._entry_bytes
        total = 0
        for hint, data in found:
            entry = sizes.get(hint)
            if entry is None:
                sent_ms = self.envelopes[hint][0]
                entry = _entry_size(hint, data, self.content_topics[channel], sent_ms)
                sizes[hint] = entry
            total += entry
        return total

    def _store_reply(self, reply: StoreReply) -> None:
        index = reply.participant
        p = self.participants[index]
        channel, found, window = reply.channel, reply.found, reply.window
        driver = p.drivers[channel]
        if not p.online:
            for _, data in found:
                mid = decode(data, self.channel_config.limits).message_id
                self.recorder.dropped_copy(index, channel, mid, "offline", self.now)
            if window is not None:
                driver.catch_up_failed(self.now)
            return
        limits = self.channel_config.limits
        messages = [decode(data, limits) for _, data in found]
        unnamed: set[str] = set()
        if window is not None:
            # Judged before any is taken: an id only a fetched message names was not learnt.
            never_named = self.recorder.never_named
            unnamed = {
                m.message_id
                for m in messages
                if never_named(index, channel, m.message_id, driver.channel)
            }
        for (hint, data), message in zip(found, messages, strict=True):
            if window is None:
                step = driver.receive_message(message, self.now, retrieval_hint=hint, data=data)
            else:
                mid = message.message_id
                step = driver.receive_found(message, self.now, retrieval_hint=hint, data=data)
                if not step.events:
                    continue  # held already: not a receive
                self.recorder.caught_up(index, channel, mid, unnamed=mid in unnamed)
            self.recorder.received(p.index, channel, message, len(data), self.now, store=True)
            self._carry_out(p, channel, step)
        if window is not None:
            if reply.answered:
                self._carry_out(p, channel, driver.caught_up(window, self.now))
            else:
                self._carry_out(p, channel, driver.catch_up_failed(self.now))

    # ------------------------------------------------------------------ faults

    def _churn(self, event: Churn) -> None:
        p = self.participants[event.participant]
        p.online = online = event.online
        self.recorder.churned(p.index, online, self.now)
        if online:
            for driver in p.drivers:
                driver.back_online(self.now)
            p.wake_at = -1
            self._rearm(p)
        elif event.lose_state:
            for driver in p.drivers:
                driver.channel.drop_volatile_state()

    def _partition(self, event: Partition) -> None:
        self._partition_of = [0] * self.config.participants
        for g, members in enumerate(event.groups, start=1):
            for member in members:
                self._partition_of[member] = g
