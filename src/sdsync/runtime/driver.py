"""ChannelDriver: everything the core leaves to its caller, decided without doing I/O.

Theory of operation
-------------------
:class:`~sdsync.core.MessageChannel` knows the protocol but not *when* to act. The driver
owns one channel plus the timing policy of a reliable channel — randomized sync backoff,
resends with exponential backoff and jitter and a distinct period for possibly
acknowledged messages, a maximum number of attempts, incoming sweeps, store queries for
missing dependencies, SDS-R request and response times — and still does no I/O: every
call takes ``now_ms`` and returns a :class:`Step` of *actions* for the caller to carry out
(transmit these bytes, query a store for these entries) and the core's *events*.

``next_due()`` says when :meth:`tick` next has work, so an asyncio runtime sleeps until
then and the simulator schedules a wake-up on its virtual clock: both run the same code.
Randomness comes from the ``rng`` the caller passes in.

With a store, the driver also *catches up*: at start and then every
``store_catchup_interval_ms`` it asks (a :class:`CatchUp` action) for every message of the
channel's topic timestamped since the last catch-up, whether or not anything is known to be
missing — a message missed together with every message naming it is never missing by id,
so only a time range finds it. The window starts ``store_catchup_margin_ms`` before the
previous one ended (clock skew, late archiving) and at most ``store_catchup_max_window_ms``
back. A catch-up is two-phase: the caller first lists the window's envelope hashes
(cheap: about 70 bytes each), keeps the :meth:`~ChannelDriver.unseen` ones — the driver
remembers the hashes of the envelopes it received or sent (:meth:`~ChannelDriver.saw`) —
and fetches only those. One catch-up runs at a time: the caller feeds what the store found to
:meth:`~ChannelDriver.receive_found` and then reports :meth:`~ChannelDriver.caught_up` or
:meth:`~ChannelDriver.catch_up_failed` (the next one is due an interval later either way;
a failed window is asked again, since the caught-up time did not move).

After every step the driver compares the channel's sync status (missing dependencies,
waiting messages, unacknowledged messages of ours, a catch-up running) with the last one
reported and adds a :class:`~sdsync.core.SyncStatus` event when it changed. Of its own
state the resend schedule and the caught-up time are worth keeping across a restart (see
:mod:`sdsync.runtime.state`): sync, sweep and store query timers simply start afresh. A
new channel counts as caught up at its creation; one whose caught-up time is unknown
(``None``) catches up the whole maximum window.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from sdsync.core import (
    Event,
    MessageChannel,
    MessageEvicted,
    MessageReceived,
    SyncReceived,
    SyncStatus,
)
from sdsync.runtime.policy import RuntimeConfig, SyncTimer
from sdsync.wire import HistoryEntry, Message, MessageKind

TransmitKind = Literal["content", "resend", "sync", "repair", "ephemeral"]


@dataclass(frozen=True, slots=True)
class Transmit:
    """Publish ``data`` on the channel's topic."""

    data: bytes
    message_id: str
    kind: TransmitKind


@dataclass(frozen=True, slots=True)
class QueryStore:
    """Ask store nodes for these messages (by retrieval hint where one is known)."""

    entries: tuple[HistoryEntry, ...]


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Ask store nodes for every message of the channel's topic timestamped in
    [``start_ms``, ``end_ms``] (the driver's clock), page by page; then report back."""

    start_ms: int
    end_ms: int


Action = Transmit | QueryStore | CatchUp


@dataclass(slots=True)
class Step:
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def extend(self, other: Step) -> None:
        self.actions.extend(other.actions)
        self.events.extend(other.events)


@dataclass(slots=True)
class Published:
    """What publishing did: ``transmit``, the content's own first transmission (the
    caller may carry it out, or hand its bytes to the application), and ``step``,
    everything else that follows."""

    transmit: Transmit
    step: Step

    @property
    def message_id(self) -> str:
        return self.transmit.message_id

    def whole(self) -> Step:
        """One step that transmits first, then does the rest."""
        return Step([self.transmit, *self.step.actions], self.step.events)


class ChannelDriver:
    def __init__(
        self,
        channel: MessageChannel,
        config: RuntimeConfig,
        rng: random.Random,
        now_ms: int,
        *,
        query_stores: bool = True,
        participants: int | None = None,
    ) -> None:
        self.channel = channel
        self.config = config
        self.rng = rng
        self.query_stores = query_stores
        if participants is not None:
            channel.set_participant_count(participants)
        self._sync = SyncTimer(
            config.sync_interval_for(participants),
            rng,
            now_ms,
            suppress=config.suppress_sync_after_received_sync,
        )
        # One resend per outgoing message: _resend_at is the truth, the heap finds the
        # earliest; heap entries that disagree with it are stale and skipped lazily.
        self._resend_at: dict[str, int] = {}
        self._resends: list[tuple[int, str]] = []
        self._rescheduled: set[str] | None = None  # recorded for durable storage
        self._next_sweep = now_ms + config.incoming_sweep_ms
        self._next_store_query = now_ms
        self.caught_up_ms: int | None = now_ms
        self._catching_up: CatchUp | None = None
        # Back online while a catch-up ran (it may be failing for the very reason we were
        # away): the next one starts when it ends, not an interval later.
        self._again = False
        catch_up = query_stores and config.store_catchup
        self._next_catch_up: int | None = now_ms if catch_up else None
        self._status: tuple[int, int, int, bool] = (0, 0, 0, False)
        # Envelope hashes heard or sent, oldest first (a dict keeps insertion order).
        self._seen: dict[bytes, None] = {}

    # ------------------------------------------------------------------ inputs

    def publish(self, payload: bytes, now_ms: int, *, message_id: str | None = None) -> Published:
        """Send application content now; resends are scheduled from here on."""
        out = self.channel.send(payload, now_ms, message_id=message_id)
        self._schedule_resend(out.message_id, 1, now_ms)
        self._sync.after_own_content(now_ms)
        transmit = Transmit(out.data, out.message_id, "content")
        return Published(transmit, self._with_status(Step([], list(out.events))))

    def publish_ephemeral(self, payload: bytes) -> Step:
        out = self.channel.send_ephemeral(payload)
        return Step([Transmit(out.data, out.message_id, "ephemeral")], [])

    def receive(self, data: bytes, now_ms: int, *, retrieval_hint: bytes | None = None) -> Step:
        """Bytes from the transport or a store. Raises RemoteProtocolError, state unchanged."""
        events = self.channel.receive(data, now_ms, retrieval_hint=retrieval_hint)
        self.saw(retrieval_hint)
        return self._after_receive(events, now_ms)

    def receive_message(
        self,
        message: Message,
        now_ms: int,
        *,
        retrieval_hint: bytes | None = None,
        data: bytes | None = None,
    ) -> Step:
        """An already decoded message (lets a simulator decode a broadcast only once)."""
        events = self.channel.receive_message(
            message, now_ms, retrieval_hint=retrieval_hint, data=data
        )
        self.saw(retrieval_hint)
        return self._after_receive(events, now_ms)

    def _owing(self) -> bool:
        """Whether an acknowledgement we owe keeps our sync due (see SyncTimer)."""
        if self.config.defer_owed_acknowledgements:
            return False
        return self.channel.acknowledgements_owed() > 0

    def _after_receive(self, events: list[Event], now_ms: int) -> Step:
        owing = self._owing()
        for event in events:
            if isinstance(event, MessageReceived):
                self._sync.after_received_content(now_ms)
            elif isinstance(event, SyncReceived):
                self._sync.after_received_sync(now_ms, owing=owing)
            elif isinstance(event, MessageEvicted) and event.retrieval_hint is not None:
                # Heard, but not kept: the next catch-up must fetch it again.
                self._seen.pop(event.retrieval_hint, None)
        if owing:
            self._sync.owe()
        return self._with_status(Step([], events))

    def receive_found(
        self,
        message: Message,
        now_ms: int,
        *,
        retrieval_hint: bytes | None = None,
        data: bytes | None = None,
    ) -> Step:
        """A message a catch-up found: new content goes the normal receive way; what the
        channel holds already (most of a window: it was heard live) and non-content (old
        syncs) changes nothing and reports nothing."""
        if message.kind is not MessageKind.CONTENT or self._holds(message):
            self.saw(retrieval_hint)
            return Step()
        return self.receive_message(message, now_ms, retrieval_hint=retrieval_hint, data=data)

    def _holds(self, message: Message) -> bool:
        channel = self.channel
        mid = message.message_id
        return (
            message.sender_id == channel.participant_id
            or mid in channel.log
            or channel.stored_incoming(mid) is not None
        )

    def saw(self, envelope_hash: bytes | None) -> None:
        """An envelope this channel received or sent: a catch-up need not fetch it.
        (Called by every receive; the caller adds the hashes of what it publishes.)"""
        if envelope_hash is None or self._next_catch_up is None:
            return  # no catch-ups: nothing to remember for
        seen = self._seen
        if envelope_hash in seen:
            return
        seen[envelope_hash] = None
        if len(seen) > self.config.store_catchup_seen_hashes:
            del seen[next(iter(seen))]

    def unseen(self, envelope_hashes: Iterable[bytes]) -> list[bytes]:
        """Those of a catch-up's hashes this channel has not seen, in their order."""
        seen = self._seen
        return [h for h in envelope_hashes if h not in seen]

    def caught_up(self, done: CatchUp, now_ms: int) -> Step:
        """Everything the store had in ``done``'s window went through :meth:`receive_found`."""
        self.caught_up_ms = done.end_ms
        return self._end_catch_up(now_ms)

    def catch_up_failed(self, now_ms: int) -> Step:
        """No store answered (all of) the running catch-up: its window is asked again."""
        return self._end_catch_up(now_ms)

    def _end_catch_up(self, now_ms: int) -> Step:
        self._catching_up = None
        wait = 0 if self._again else self.config.store_catchup_interval_ms
        self._again = False
        self._next_catch_up = now_ms + wait
        return self._with_status(Step())

    def back_online(self, now_ms: int) -> None:
        """Back from being away (offline, disconnected): catch up now, not an interval on,
        and resend now what nobody may have heard: what we published while away reached
        nobody, and its resends were backing off meanwhile (a minute, after a few)."""
        for message_id in list(self._resend_at):
            entry = self.channel.outgoing_entry(message_id)
            if entry is not None and not entry.possible_ackers:
                self._plan(message_id, now_ms)
        self.catch_up_now(now_ms)

    def catch_up_now(self, now_ms: int) -> None:
        """Catch up from the stores now (again as soon as a running one ends)."""
        if self._next_catch_up is None:
            return
        self._next_catch_up = now_ms
        self._again = self._catching_up is not None

    def restore_caught_up(self, caught_up_ms: int | None) -> None:
        """The stored caught-up time (None: unknown, catch up the whole window)."""
        self.caught_up_ms = caught_up_ms

    @property
    def sync_interval_ms(self) -> int:
        """The sync interval in force (``RuntimeConfig.sync_interval_for`` the group)."""
        return self._sync.interval_ms

    def set_participant_count(self, participants: int) -> None:
        """How many the group has (the application knows): SDS-R's response groups, and
        the sync interval from the next one on (``RuntimeConfig.sync_ms_per_participant``)."""
        self.channel.set_participant_count(participants)
        self._sync.interval_ms = self.config.sync_interval_for(participants)

    def mark_dependencies_met(self, message_ids: list[str]) -> Step:
        """The application found these itself: release whatever waited for them."""
        return self._with_status(Step([], self.channel.mark_dependencies_met(message_ids)))

    # ----------------------------------------------------------------- timers

    def next_due(self) -> int:
        """The earliest time at which :meth:`tick` has something to do."""
        # Asked after every step (a simulator: after every receive), so no list, no min().
        due = min(self._sync.due_ms, self._next_sweep)
        catch_up = self._next_catch_up
        if catch_up is not None and catch_up < due and self._catching_up is None:
            due = catch_up
        self._drop_stale_resends()
        if self._resends and self._resends[0][0] < due:
            due = self._resends[0][0]
        channel = self.channel
        request = channel.next_repair_request_due()
        if request is not None and request < due:
            due = request
        response = channel.next_repair_response_due()
        if response is not None and response < due:
            due = response
        return due

    def tick(self, now_ms: int) -> Step:
        """Do whatever is due at ``now_ms``."""
        step = Step()
        self._resend_due(now_ms, step)
        self._sync_if_due(now_ms, step)
        repair = self.channel.sweep_repair(now_ms)
        step.actions.extend(
            Transmit(data, event.message_id, "repair")
            for data, event in zip(repair.data, repair.events, strict=True)
        )
        step.events.extend(repair.events)
        if now_ms >= self._next_sweep:
            self._next_sweep = now_ms + self.config.incoming_sweep_ms
            self._sweep_incoming(now_ms, step)
        self._catch_up_if_due(now_ms, step)
        return self._with_status(step)

    def _catch_up_if_due(self, now_ms: int, step: Step) -> None:
        due = self._next_catch_up
        if due is None or now_ms < due or self._catching_up is not None:
            return
        config = self.config
        start = now_ms - config.store_catchup_max_window_ms
        if self.caught_up_ms is not None:
            start = max(start, self.caught_up_ms - config.store_catchup_margin_ms)
        self._catching_up = CatchUp(start, now_ms)
        step.actions.append(self._catching_up)

    # ----------------------------------------------------------------- status

    def sync_status(self) -> SyncStatus:
        waiting, outstanding = self.channel.buffer_sizes()
        catching_up = self._catching_up is not None
        return SyncStatus("", self.channel.missing_count(), waiting, outstanding, catching_up)

    def _with_status(self, step: Step) -> Step:
        # After every step: the status event is built only when something changed.
        channel = self.channel
        waiting, outstanding = channel.buffer_sizes()
        key = (channel.missing_count(), waiting, outstanding, self._catching_up is not None)
        if key != self._status:
            self._status = key
            step.events.append(SyncStatus("", *key))
        return step

    def _sync_if_due(self, now_ms: int, step: Step) -> None:
        request_due = self.channel.next_repair_request_due()
        repair_waiting = request_due is not None and request_due <= now_ms
        if now_ms < self._sync.due_ms and not repair_waiting:
            return
        sync = self.channel.send_sync(now_ms)
        if sync is None:
            self._sync.after_own_content(now_ms)
            return
        self._sync.after_own_sync(now_ms)
        step.actions.append(Transmit(sync.data, sync.message_id, "sync"))
        step.events.extend(sync.events)

    def _sweep_incoming(self, now_ms: int, step: Step) -> None:
        # The channel's known missing ids are the one record of gaps, however learnt.
        sweep = self.channel.sweep_incoming(now_ms)
        step.events.extend(sweep.events)
        if self._owing():  # it delivered what waited past the timeout
            self._sync.owe()
        if sweep.missing and self.query_stores and now_ms >= self._next_store_query:
            self._next_store_query = now_ms + self.config.store_query_ms
            step.actions.append(QueryStore(tuple(sweep.missing)))

    # ---------------------------------------------------------------- resends

    def resend_at(self, message_id: str) -> int | None:
        """When ``message_id`` is due for its next resend (None when none is planned)."""
        return self._resend_at.get(message_id)

    def start_journal(self) -> None:
        """Record what every step changes, here and in the channel, for durable storage."""
        self.channel.start_journal()
        if self._rescheduled is None:
            self._rescheduled = set()

    def take_rescheduled(self) -> set[str]:
        """Ids whose planned resend changed since the last call (journal must be on)."""
        taken, self._rescheduled = self._rescheduled or set(), set()
        return taken

    def restore_resends(self, due_by_id: dict[str, int]) -> None:
        """Plan the resends of a restored outgoing buffer (stored due times)."""
        for message_id, due in due_by_id.items():
            self._plan(message_id, due)
        self._status = (-1, -1, -1, False)  # report the restored status with the next step

    def _plan(self, message_id: str, due: int) -> None:
        self._resend_at[message_id] = due
        heapq.heappush(self._resends, (due, message_id))
        if self._rescheduled is not None:
            self._rescheduled.add(message_id)

    def _schedule_resend(self, message_id: str, attempts: int, now_ms: int) -> None:
        entry = self.channel.outgoing_entry(message_id)
        possibly = bool(entry is not None and entry.possible_ackers)
        self._plan(message_id, now_ms + self.config.resend_delay(attempts, possibly, self.rng))

    def _drop_stale_resends(self) -> None:
        """Forget planned resends of messages that left the outgoing buffer."""
        resends = self._resends
        while resends:
            due, message_id = resends[0]
            current = self._resend_at.get(message_id) == due
            if current and self.channel.outgoing_entry(message_id) is not None:
                return
            heapq.heappop(resends)
            if current:
                del self._resend_at[message_id]

    def _resend_due(self, now_ms: int, step: Step) -> None:
        resends = self._resends
        self._drop_stale_resends()
        while resends and resends[0][0] <= now_ms:
            _, message_id = heapq.heappop(resends)
            del self._resend_at[message_id]
            entry = self.channel.outgoing_entry(message_id)
            if entry is None:
                continue  # acknowledged meanwhile
            if entry.attempts >= self.config.max_attempts:
                step.events.extend(self.channel.abandon(message_id))
            elif (
                entry.possible_ackers
                and (
                    later := entry.last_sent_ms
                    + self.config.resend_delay(entry.attempts, True, self.rng)
                )
                > now_ms
            ):
                # Became possibly acknowledged after this resend was planned: wait longer.
                self._plan(message_id, later)
            else:
                data = self.channel.resend(message_id, now_ms)
                step.actions.append(Transmit(data, message_id, "resend"))
                self._schedule_resend(message_id, entry.attempts, now_ms)
            self._drop_stale_resends()
