"""ReliableChannel: one SDS channel on a real event loop and a real transport.

Theory of operation
-------------------
All protocol decisions live in the core and all timing decisions in
:class:`~sdsync.runtime.ChannelDriver`; this class only performs I/O for them. Two tasks
run while the channel is open:

* the *receive loop* feeds every frame from the transport to the driver — frames that are
  not valid SDS are counted and logged by reason, and the loop carries on;
* the *timer loop* sleeps until ``driver.next_due()`` (or until something changed that may
  make it earlier) and then lets the driver tick.

Whatever a driver step asks for is carried out in order: with a ``state_dir`` the step
is first committed to the channel's SQLite database (:mod:`sdsync.runtime.state`), then
its events are queued for the application and its transmissions published (the
driver :meth:`~ChannelDriver.saw` each one's retrieval hint — its envelope hash — so a
catch-up never fetches what we sent, and our own content keeps it as its hint); store
queries are answered by the :class:`StoreClient` and fed back in. A store catch-up
(:class:`CatchUp`) lists the envelope hashes on the channel's content topic over the
window page by page and fetches only the driver's :meth:`~ChannelDriver.unseen` ones
(every receive marks its frame's hash seen); each page's frames go to the driver
(:meth:`ChannelDriver.receive_found`: what we had is skipped, the rest takes the normal
receive path), and the driver hears that the window is done — or, when the store was
unavailable or answered nonsense, that it failed and is asked again an interval later
(what earlier pages brought stays, and is seen, so not fetched again). A transport that
regained its peers after losing them all says so with :meth:`back_online`: the next
catch-up is due at once, and so are the resends of what nobody may have heard.
Application events arrive on :meth:`numbered_events` (or
:meth:`events`): those it must act on are numbered and stored with their step, and
reported until acknowledged — at least once, under the same number, even across a
kill -9 (:mod:`sdsync.runtime.event_log`). Data flows one way: transport → wire decode →
core → (state) → events → app.

A step that cannot be committed, or any other unexpected error in a loop, stops the
channel: memory would be ahead of the stored state, so the application gets the error
from :meth:`events` and :meth:`send` and reopens the channel from what is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Protocol

from sdsync.core import (
    ChannelConfig,
    Event,
    MessageChannel,
    MessageDropped,
    MessageReceived,
)
from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.lifecycle import AsyncLifecycle
from sdsync.runtime.clock import system_clock_ms
from sdsync.runtime.driver import CatchUp, ChannelDriver, QueryStore, Step, Transmit
from sdsync.runtime.event_log import DURABLE_EVENTS, Delivery, EventLog
from sdsync.runtime.policy import RuntimeConfig
from sdsync.runtime.state import ChannelState, LogRecord, Synchronous, state_path
from sdsync.waku.node import Received, Transport
from sdsync.waku.relay.topics import default_content_topic
from sdsync.wire import HistoryEntry, decode

logger = logging.getLogger("sdsync.runtime")


Unseen = Callable[[list[bytes]], list[bytes]]
"""Those of a catch-up page's envelope hashes worth fetching (:meth:`ChannelDriver.unseen`)."""


class StoreClient(Protocol):
    """Where missing messages are fetched from (store nodes)."""

    async def fetch(self, channel_id: str, entries: tuple[HistoryEntry, ...]) -> list[Received]:
        """The stored frames of whichever of ``entries`` the store has."""
        ...

    def catch_up(
        self, content_topic: str, start_ms: int, end_ms: int, page_size: int, unseen: Unseen
    ) -> AsyncIterator[list[Received]]:
        """A catch-up in two phases, page by page, oldest first: list the envelope hashes
        of the frames stored on ``content_topic`` timestamped in [``start_ms``, ``end_ms``]
        (Unix ms; hashes only, at most ``page_size`` a page), then fetch by hash only those
        of the page that ``unseen`` keeps, and yield them (each with its hash as retrieval
        hint; a page that needs nothing yields nothing). ``unseen`` is called once a page,
        after the frames of the pages before it were handled. Raises ``OSError`` when the
        store cannot answer now."""
        ...


class ReliableChannel(AsyncLifecycle):
    def __init__(
        self,
        transport: Transport,
        channel_id: str,
        participant_id: str,
        *,
        config: ChannelConfig | None = None,
        runtime: RuntimeConfig | None = None,
        store: StoreClient | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], int] = system_clock_ms,
        topic: str | None = None,
        content_topic: str | None = None,
        state_dir: Path | None = None,
        synchronous: Synchronous = "NORMAL",
    ) -> None:
        self.transport = transport
        self.topic = topic if topic is not None else f"/sds/1/{channel_id}"
        # What a store catch-up asks for: where the transport publishes ``topic``.
        self.content_topic = (
            content_topic if content_topic is not None else default_content_topic(self.topic)
        )
        # Store catch-ups the store answered to the end, and messages they brought.
        self.catch_ups = 0
        self.caught_up_messages = 0
        self._clock = clock
        now = clock()
        self.channel = MessageChannel(channel_id, participant_id, now_ms=now, config=config)
        self.driver = ChannelDriver(
            self.channel,
            runtime if runtime is not None else RuntimeConfig(),
            rng if rng is not None else random.Random(),
            now,
            query_stores=store is not None,
        )
        # Restores the channel and driver from <state_dir>/<channel_id>.sqlite, if any.
        self.state = (
            ChannelState(state_path(state_dir, channel_id), self.driver, synchronous=synchronous)
            if state_dir is not None
            else None
        )
        self.store = store
        # Bad frames dropped, by reason: a RejectReason, or a DropReason that is bad input.
        self.rejected: Counter[str] = Counter()
        # Numbered events until acknowledged (stored with the state, if any).
        self.event_log = self.state.events if self.state is not None else EventLog()
        # None wakes a reader to report self._failure.
        self._events: asyncio.Queue[Delivery | None] = asyncio.Queue()
        after = self.event_log.acked_seq
        while unacknowledged := self.event_log.read(after, 1_024):
            for delivery in unacknowledged:  # a crash left them unacknowledged
                self._events.put_nowait(delivery)
            after = unacknowledged[-1].seq or after
        self._failure: BaseException | None = None
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._fetches: set[asyncio.Task[None]] = set()

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._tasks:
            raise LocalProtocolError("channel already started")
        frames = self.transport.subscribe(self.topic)
        self._tasks = [
            asyncio.create_task(self._receive_loop(frames), name="sds-receive"),
            asyncio.create_task(self._timer_loop(), name="sds-timers"),
        ]

    async def stop(self) -> None:
        for task in [*self._tasks, *self._fetches]:
            task.cancel()
        for task in [*self._tasks, *self._fetches]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def close(self) -> None:
        """Stop, store what is still only in memory, and release the state database."""
        await self.stop()
        if self.state is not None:
            self.state.close()
            self.state = None

    def back_online(self) -> None:
        """The transport is connected again after losing every peer: what was published
        meanwhile reached us through nobody, so the next store catch-up is due now, and
        what we published reached nobody, so its resends are due now."""
        self.driver.back_online(self._clock())
        self._wake.set()

    def catch_up_now(self) -> None:
        """Catch up from the stores now, not an interval on (the application knows it
        missed something: its user asked, the device woke)."""
        self.driver.catch_up_now(self._clock())
        self._wake.set()

    def history(self, limit: int | None = None) -> list[LogRecord]:
        """The stored log (ours and delivered messages, with content), oldest first."""
        if self.state is None:
            raise LocalProtocolError("history is kept only with a state_dir")
        return self.state.history(limit)

    # ----------------------------------------------------------------- sending

    async def send(self, payload: bytes, *, message_id: str | None = None) -> str:
        """Publish content; returns its message id. Delivery is then the channel's job.

        With a ``state_dir`` the message is stored before this returns: from then on no
        crash loses it, and resends continue after a restart.
        """
        self._check_alive()
        async with self._lock:
            published = self.driver.publish(payload, self._clock(), message_id=message_id)
            await self._carry_out(published.whole())
        self._wake.set()
        return published.message_id

    async def send_ephemeral(self, payload: bytes) -> None:
        self._check_alive()
        async with self._lock:
            await self._carry_out(self.driver.publish_ephemeral(payload))

    async def mark_dependencies_met(self, message_ids: list[str]) -> None:
        """The application found these messages itself: stop waiting for them."""
        self._check_alive()
        async with self._lock:
            await self._carry_out(self.driver.mark_dependencies_met(message_ids))
        self._wake.set()

    def set_participant_count(self, participants: int) -> None:
        """How many the group has: SDS-R's response groups, and with
        ``RuntimeConfig.sync_ms_per_participant`` (the lean profile) the sync interval."""
        if participants < 1:
            raise LocalProtocolError("participants must be >= 1")
        self.driver.set_participant_count(participants)

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise self._stopped() from self._failure

    def _stopped(self) -> LocalProtocolError:
        return LocalProtocolError(f"the channel stopped after {self._failure!r}; reopen it")

    # ---------------------------------------------------------------- events

    async def events(self) -> AsyncIterator[Event]:
        """Application events, in the order they happened: :meth:`numbered_events`
        without the numbers."""
        async for delivery in self.numbered_events():
            yield _event(delivery)

    async def numbered_events(self) -> AsyncIterator[Delivery]:
        """Application events in order, each with its number (None for live-only ones:
        see :data:`~sdsync.runtime.event_log.DURABLE_EVENTS`).

        A numbered event is acknowledged when the loop asks for the next one, so one
        whose processing a crash interrupted is reported again after a restart (first,
        before anything new), under the same number: at least once, exactly once for an
        application that skips numbers it has processed already.
        """
        while True:
            delivery = self._take(await self._events.get())
            yield delivery
            if delivery.seq is not None:
                self.ack(delivery.seq)

    def ack(self, seq: int) -> None:
        """Numbered events up to ``seq`` are processed: never report them again (stored
        with the next commit or at close)."""
        if self.event_log.ack(seq):
            self._wake.set()  # the timer loop stores it, if nothing else does first

    def pending_events(self) -> list[Event]:
        """Events not consumed yet, without waiting (all handed over and acknowledged)."""
        taken: list[Delivery] = []
        while not self._events.empty():
            delivery = self._events.get_nowait()
            if delivery is None:
                self._events.put_nowait(None)
                break
            taken.append(delivery)
        numbers = [d.seq for d in taken if d.seq is not None]
        if numbers:
            self.ack(numbers[-1])
        if not taken and self._failure is not None:
            raise self._stopped() from self._failure
        return [_event(d) for d in taken]

    def _take(self, delivery: Delivery | None) -> Delivery:
        if delivery is None:
            self._events.put_nowait(None)  # every later reader learns it too
            raise self._stopped() from self._failure
        return delivery

    # ----------------------------------------------------------------- loops

    async def _receive_loop(self, frames: AsyncIterator[Received]) -> None:
        try:
            async for frame in frames:
                async with self._lock:
                    await self._receive(frame)
                self._wake.set()
        except Exception as exc:  # fail-stop: reported through events()
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._failure is not None:
            return
        logger.error("%s: channel stopped: %r", self.channel.participant_id, exc)
        self._failure = exc
        self._events.put_nowait(None)

    async def _receive(self, frame: Received, *, found: bool = False) -> None:
        """A frame from the transport, or ``found`` by a store catch-up."""
        try:
            message = decode(frame.data, self.channel.config.limits)
        except RemoteProtocolError as exc:
            self.driver.saw(frame.retrieval_hint)  # not worth fetching from a store either
            self._reject(exc.reason, str(exc))
            return
        receive = self.driver.receive_found if found else self.driver.receive_message
        step = receive(message, self._clock(), retrieval_hint=frame.retrieval_hint, data=frame.data)
        if found:
            self.caught_up_messages += sum(isinstance(e, MessageReceived) for e in step.events)
        for event in step.events:
            if isinstance(event, MessageDropped) and event.reason.bad_input:
                self._reject(event.reason, f"message {event.message_id}")
        await self._carry_out(step)

    def _reject(self, reason: str, detail: str) -> None:
        # The first of each reason at WARNING, the rest at DEBUG: a peer cannot flood the log.
        level = logging.DEBUG if reason in self.rejected else logging.WARNING
        self.rejected[reason] += 1
        logger.log(
            level,
            "%s: dropped a bad frame (%s, %d so far): %s",
            self.channel.participant_id,
            reason,
            self.rejected[reason],
            detail,
        )

    async def _timer_loop(self) -> None:
        try:
            while True:
                delay = max(0, self.driver.next_due() - self._clock()) / 1000
                self._wake.clear()
                # Not wait_for: on 3.11 it swallows a cancel that races the wake-up, and
                # stop() would then wait out the whole delay.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                async with self._lock:
                    now = self._clock()
                    if self.driver.next_due() <= now:
                        await self._carry_out(self.driver.tick(now))
                    elif self.state is not None and self.state.events.dirty:
                        self.state.commit()  # acknowledgements
        except Exception as exc:  # fail-stop: reported through events()
            self._fail(exc)

    async def _carry_out(self, step: Step) -> None:
        numbered = iter(self.event_log.record(e for e in step.events if _durable(e)))
        if self.state is not None:
            try:
                self.state.commit()  # stored, with its events, before anyone hears of it
            except Exception as exc:
                self._fail(exc)
                raise
        for event in step.events:
            self._events.put_nowait(next(numbered) if _durable(event) else Delivery(None, event))
        for action in step.actions:
            if isinstance(action, Transmit):
                await self._transmit(action)
            elif isinstance(action, QueryStore) and self.store is not None:
                # Fetch outside the lock: a slow store must not stall receiving.
                self._in_background(self._query_store(self.store, action))
            elif isinstance(action, CatchUp) and self.store is not None:
                self._in_background(self._catch_up(self.store, action))

    def _in_background(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.create_task(work)
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)

    async def _transmit(self, action: Transmit) -> None:
        hint = await self.transport.publish(self.topic, action.data)
        self.driver.saw(hint)  # a store has it, and a catch-up need not fetch it back
        if action.kind == "content" and hint is not None and self._still_ours(action.message_id):
            self.channel.set_retrieval_hint(action.message_id, hint)

    def _still_ours(self, message_id: str) -> bool:
        # Outgoing (on_ack: not logged yet) or logged; given up on while publishing: no.
        channel = self.channel
        return channel.outgoing_entry(message_id) is not None or message_id in channel.log

    async def _query_store(self, store: StoreClient, query: QueryStore) -> None:
        try:
            found = await store.fetch(self.channel.channel_id, query.entries)
        except OSError as exc:  # an unreachable store is retried on the next sweep
            logger.info("store query failed: %s", exc)
            return
        async with self._lock:
            for frame in found:
                await self._receive(frame)
        self._wake.set()

    async def _catch_up(self, store: StoreClient, window: CatchUp) -> None:
        try:
            try:
                pages = store.catch_up(
                    self.content_topic,
                    window.start_ms,
                    window.end_ms,
                    self.driver.config.store_catchup_page_size,
                    self.driver.unseen,
                )
                async for page in pages:
                    async with self._lock:
                        for frame in page:
                            await self._receive(frame, found=True)
                    self._wake.set()
            except (OSError, RemoteProtocolError) as exc:
                # Not lost: the caught-up time stays, and the next catch-up asks again.
                logger.info("store catch-up failed: %s", exc)
                async with self._lock:
                    await self._carry_out(self.driver.catch_up_failed(self._clock()))
                return
            async with self._lock:
                self.catch_ups += 1
                await self._carry_out(self.driver.caught_up(window, self._clock()))
        except asyncio.CancelledError:
            # Stopped midway: a later start() catches up this window again.
            self.driver.catch_up_failed(self._clock())
            raise
        except Exception as exc:  # fail-stop: reported through events()
            self._fail(exc)
        finally:
            self._wake.set()


def _durable(event: Event) -> bool:
    return isinstance(event, DURABLE_EVENTS)


def _event(delivery: Delivery) -> Event:
    event = delivery.event
    assert isinstance(event, Event)  # a channel numbers core events only
    return event
