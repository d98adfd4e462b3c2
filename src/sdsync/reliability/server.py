"""The reliability API of seed 004 served over gRPC (``reliability.proto``).

Theory of operation
-------------------
One :class:`ReliabilityService` holds one :class:`~sdsync.runtime.manager.ReliabilityManager`
(one participant, many channels) in ``explicit`` acknowledgement mode, and answers each
call by calling the manager's method of the same meaning, on whichever of the server's
threads the call came in: the manager takes its own lock, and its SQLite state may be
used from any thread. The batch calls answer item by item, each as the single call would
(a refused item is a ``Refusal`` and changes nothing; the others go ahead), inside one
:meth:`~sdsync.runtime.manager.ReliabilityManager.batch`: one commit per channel for the
whole call, made before the answer is sent. A wrap batch's answer stays under
:data:`ANSWER_LIMIT` (the items that might not fit are refused, unwrapped). The service
closes the manager (:meth:`ReliabilityService.close`) once no call can reach it any more.

Ticking is the server's job, so that a client in any language only wraps, unwraps and
reacts to events: a thread calls ``manager.tick()`` when ``manager.next_due()`` says work
is due, never more often than every :data:`MIN_TICK_MS` and at least every
:data:`IDLE_TICK_MS` (a call that schedules something sooner is served by then).

Events are the manager's numbered, kept events (:mod:`sdsync.runtime.event_log`): an
``Events`` stream reads each wanted channel's events after its resume point straight from
them, and waits on the :class:`EventHub` (which the manager's ``on_event`` callback wakes)
when it has sent everything. A stream therefore never drops anything and never holds up
the manager: a slow reader is simply behind, and what the manager keeps for it is bounded
by the manager's ``EventLimits``. Events are forgotten only when acknowledged
(``AckEvents``, or the ``resume`` point of an ``Events`` call).

A stream holds one of the server's worker threads for as long as it lasts, and gRPC's
synchronous server blocks that thread in each write until the client's flow-control window
takes the message: a client that never reads would hold it for ever. So the hub bounds the
streams (:data:`MAX_EVENT_STREAMS` in all, :data:`MAX_EVENT_STREAMS_PER_PEER` per client
connection, each below the worker count, beyond: ``RESOURCE_EXHAUSTED``), and a watchdog
cancels every stream with a write pending for longer than its ``write_timeout_s``
(:data:`EVENT_WRITE_TIMEOUT_S`): the cancellation completes the blocked write, which frees
the thread, and the client sees ``CANCELLED``. The events stay (unacknowledged) for its
next stream. A stream waiting for events has no write pending and is never cut. The
``Stats`` call counts what was refused and cut.

Every refusal is a gRPC status with a message, never a crash and never a state change:
bytes that do not decode, requests the manager refuses and ids (channel, message) that are
empty or longer than :data:`MAX_ID_BYTES` in UTF-8 (what peers accept; checked before the
manager is called) are ``INVALID_ARGUMENT``; a call
that needs an open channel and names another is ``NOT_FOUND``; opening a channel beyond
the manager's ``max_channels``, too many subscribers, a batch of more than
:data:`MAX_BATCH` items or a request larger than :func:`request_limit` is
``RESOURCE_EXHAUSTED`` (the last checked by gRPC itself, before any of our code runs).
Bytes for a channel that is not open are a normal answer with ``channel_open`` false.
With a token, a call without ``authorization: Bearer <token>`` metadata is
``UNAUTHENTICATED`` (:class:`TokenCheck`, before the call's handler).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import Any, NoReturn, TypeVar

import grpc

from sdsync.core import (
    MessageAcknowledged,
    MessageDelivered,
    MessageEvicted,
    MessageMissing,
    MessagePossiblyAcknowledged,
    SendFailed,
)
from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc
from sdsync.runtime import Delivery, EventsDiscarded, PeriodicSync, Transmit
from sdsync.runtime.clock import system_clock_ms
from sdsync.runtime.crash import crash_point
from sdsync.runtime.manager import ReliabilityManager
from sdsync.wire import WireLimits

logger = logging.getLogger("sdsync.reliability")

MIN_TICK_MS = 100
IDLE_TICK_MS = 1_000
#: Besides a request's SDS messages: field tags, channel ids, message ids.
REQUEST_MARGIN = 64 * 1024
#: The SDS messages of one request (a batch, or one message if peers accept larger ones).
#: Unwrap answers are smaller than their requests and wrap answers are kept under
#: :data:`ANSWER_LIMIT`, so no answer reaches gRPC's default 4 MiB receive limit.
BATCH_BYTES = 3 << 20
#: A WrapOutgoingMessages answer stays under this: the items that might not fit are
#: refused, unwrapped, with RESOURCE_EXHAUSTED (send them again in another call).
ANSWER_LIMIT = 3 << 20
#: Items in one WrapOutgoingMessages or UnwrapReceivedMessages call, at most.
MAX_BATCH = 4_096
#: Events read from a channel at a time by an Events stream.
_READ = 256
#: How long an Events stream waits for an event before it looks whether its client left.
_POLL_S = 0.25
#: Event streams open at once, in all and from one client connection (a stream holds a
#: worker thread: these stay below the server's ``max_workers``).
MAX_EVENT_STREAMS = 8
MAX_EVENT_STREAMS_PER_PEER = 4
#: A stream whose write has waited this long for its reader's flow control is cancelled.
EVENT_WRITE_TIMEOUT_S = 10.0
#: Channel and message ids, in UTF-8 bytes: the wire limit peers apply (``WireLimits``).
MAX_ID_BYTES = 256

Request = TypeVar("Request")
Answer = TypeVar("Answer")
Result = TypeVar("Result")


def request_limit(limits: WireLimits) -> int:
    """The largest request the server accepts: a batch of :data:`BATCH_BYTES`, or one SDS
    message as large as peers accept."""
    return max(BATCH_BYTES, limits.max_message_bytes) + REQUEST_MARGIN


class _AnswerRoom:
    """Keeps a wrap batch's answer under :data:`ANSWER_LIMIT`.

    A wrapped message is its payload plus the channel's overhead (bloom filter, causal
    history, ids), which barely changes from one message to the next: an item is refused
    before it is wrapped when its payload plus the largest overhead seen so far in the
    batch could overflow. The first item always fits (it is at most one message).
    """

    _SLACK = 64 * 1024  # a few more causal history ids or repair requests than last time

    def __init__(self) -> None:
        self.used = 0
        self.overhead = 0

    def admit(self, payload: bytes) -> None:
        if self.used and self.used + len(payload) + self.overhead + self._SLACK > ANSWER_LIMIT:
            raise _RefusedError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the answer would exceed {ANSWER_LIMIT} bytes; wrap this item in another call",
            )

    def spend(self, payload: bytes, answer: pb.WrapOutgoingMessageResponse) -> None:
        self.used += answer.ByteSize()
        self.overhead = max(self.overhead, len(answer.data) - len(payload))


class _RefusedError(Exception):
    """A call (or one item of a batch) refused with a status and a message for people."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclasses.dataclass(eq=False)
class EventStream:
    """One open Events or EventBatches stream: whose, and since when a write waits."""

    peer: str
    cancel: Callable[[], object]
    writing_since: float | None = None


class EventHub:
    """The event streams: counts and bounds them, wakes them when events are recorded,
    and tells which have had a write pending for longer than ``write_timeout_s``."""

    def __init__(
        self,
        *,
        max_subscribers: int = MAX_EVENT_STREAMS,
        max_per_peer: int = MAX_EVENT_STREAMS_PER_PEER,
        write_timeout_s: float = EVENT_WRITE_TIMEOUT_S,
    ) -> None:
        self.max_subscribers = max_subscribers
        self.max_per_peer = max_per_peer
        self.write_timeout_s = write_timeout_s
        self.refused = 0
        self.cut = 0
        self._streams: set[EventStream] = set()
        self._generation = 0
        self._changed = threading.Condition()

    @property
    def subscribers(self) -> int:
        with self._changed:
            return len(self._streams)

    def subscribe(self, peer: str, cancel: Callable[[], object]) -> EventStream:
        """A new stream of ``peer`` (its connection); RESOURCE_EXHAUSTED at either cap."""
        with self._changed:
            if len(self._streams) >= self.max_subscribers:
                self.refused += 1
                raise _RefusedError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"already {self.max_subscribers} event streams",
                )
            if sum(s.peer == peer for s in self._streams) >= self.max_per_peer:
                self.refused += 1
                raise _RefusedError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"already {self.max_per_peer} event streams on this connection",
                )
            stream = EventStream(peer, cancel)
            self._streams.add(stream)
            return stream

    def unsubscribe(self, stream: EventStream) -> None:
        """Idempotent: a stream ends, and may have been cut before."""
        with self._changed:
            self._streams.discard(stream)

    def cut_stalled(self, now: float) -> list[EventStream]:
        """Forget (and count) the streams whose write has waited ``write_timeout_s``:
        the caller cancels them."""
        with self._changed:
            stalled = [
                s
                for s in self._streams
                if s.writing_since is not None and now - s.writing_since >= self.write_timeout_s
            ]
            self._streams.difference_update(stalled)
            self.cut += len(stalled)
            return stalled

    @property
    def generation(self) -> int:
        """Changes whenever events were recorded since."""
        return self._generation

    def notify(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def wait(self, generation: int, timeout_s: float) -> None:
        """Until events are recorded after ``generation`` was read, or ``timeout_s``."""
        with self._changed:
            self._changed.wait_for(lambda: self._generation != generation, timeout_s)


def _written(stream: EventStream, items: Iterator[Answer]) -> Iterator[Answer]:
    """``items`` as a stream's messages, each marked as being written until gRPC asks for
    the next one (its write went through)."""
    for item in items:
        stream.writing_since = time.monotonic()
        yield item
        stream.writing_since = None


class _Refusals:
    """Refused calls and batch items, by status code name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def count(self, code: grpc.StatusCode) -> None:
        with self._lock:
            self._counts[code.name] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """The manager's errors as refusals; anything unexpected is logged and INTERNAL."""
    try:
        yield
    except _RefusedError:
        raise
    except RemoteProtocolError as exc:
        raise _RefusedError(
            grpc.StatusCode.INVALID_ARGUMENT, f"not an SDS message: {exc}"
        ) from None
    except LocalProtocolError as exc:
        raise _RefusedError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
    except Exception:
        logger.exception("reliability call failed")
        raise _RefusedError(
            grpc.StatusCode.INTERNAL, "internal error (logged by the server)"
        ) from None


def _require_id(name: str, value: str) -> None:
    """Non-empty and at most :data:`MAX_ID_BYTES` in UTF-8, or INVALID_ARGUMENT."""
    if not value:
        raise _RefusedError(grpc.StatusCode.INVALID_ARGUMENT, f"{name} must be non-empty")
    size = len(value.encode())
    if size > MAX_ID_BYTES:
        raise _RefusedError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{name} of {size} bytes (UTF-8); at most {MAX_ID_BYTES}",
        )


def _require_channel_id(channel_id: str) -> None:
    _require_id("channel_id", channel_id)


class ReliabilityService(pb_grpc.ReliabilityServicer):
    """The servicer: the manager's API as RPCs, its events as streams, its ticks."""

    def __init__(
        self,
        manager: ReliabilityManager,
        *,
        hub: EventHub | None = None,
        clock: Callable[[], int] = system_clock_ms,
    ) -> None:
        if manager.acknowledge != "explicit":
            raise LocalProtocolError("the service needs a manager with acknowledge='explicit'")
        self.manager = manager
        self.hub = hub if hub is not None else EventHub()
        self._clock = clock
        self.refusals = _Refusals()
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._tick_loop, name="sdsync-reliability-tick", daemon=True),
            threading.Thread(target=self._watch_loop, name="sdsync-reliability-watch", daemon=True),
        ]
        manager.on_event = lambda _channel_id, _delivery: self.hub.notify()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop ticking and watching, and end the event streams."""
        self._stopping.set()
        self.hub.notify()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()

    def close(self) -> None:
        """Close the manager, once no call can come any more (after ``stop``)."""
        self.manager.close()

    def _tick_loop(self) -> None:
        delay_ms = 0
        while not self._stopping.wait(delay_ms / 1000):
            try:
                self.manager.tick()
                due = self.manager.next_due()
            except Exception:
                # A failed step forgot its channel (the manager's rule); the others go on.
                logger.exception("tick failed")
                due = None
            wait = IDLE_TICK_MS if due is None else due - self._clock()
            delay_ms = min(max(wait, MIN_TICK_MS), IDLE_TICK_MS)

    def _watch_loop(self) -> None:
        """Cancel the streams whose reader stopped taking messages (module doc)."""
        period_s = min(max(self.hub.write_timeout_s / 4, 0.05), 1.0)
        while not self._stopping.wait(period_s):
            for stream in self.hub.cut_stalled(time.monotonic()):
                logger.warning(
                    "event stream of %s cut: a write waited %.1f s for its reader",
                    stream.peer,
                    self.hub.write_timeout_s,
                )
                stream.cancel()

    # ------------------------------------------------------------ refusals

    def _answer(
        self, context: grpc.ServicerContext, handle: Callable[[Request], Answer], request: Request
    ) -> Answer:
        """One call: its answer, or its refusal (counted) as the call's status."""
        try:
            with _refusals():
                answer = handle(request)
        except _RefusedError as refused:
            self.refusals.count(refused.code)
            context.abort(refused.code, refused.message)
        crash_point("answer")
        return answer

    def _each(
        self,
        items: Sequence[Request],
        handle: Callable[[Request], Answer],
        result: Callable[..., Result],
        field: str,
    ) -> list[Result]:
        """A batch's items handled one by one: each answer, or its refusal (counted), as a
        ``result`` with the answer in ``field`` (or the refusal in ``refused``)."""
        if len(items) > MAX_BATCH:
            raise _RefusedError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{len(items)} items in one batch; at most {MAX_BATCH}",
            )
        results = []
        for item in items:
            try:
                with _refusals():
                    results.append(result(**{field: handle(item)}))
            except _RefusedError as refused:
                self.refusals.count(refused.code)
                refusal = pb.Refusal(code=refused.code.value[0], message=refused.message)
                results.append(result(refused=refusal))
        return results

    # ------------------------------------------------------------ single calls

    def OpenChannel(  # noqa: N802 (the .proto's names)
        self, request: pb.OpenChannelRequest, context: grpc.ServicerContext
    ) -> pb.OpenChannelResponse:
        return self._answer(context, self._open, request)

    def WrapOutgoingMessage(  # noqa: N802 (the .proto's names)
        self, request: pb.WrapOutgoingMessageRequest, context: grpc.ServicerContext
    ) -> pb.WrapOutgoingMessageResponse:
        return self._answer(context, self._wrap, request)

    def UnwrapReceivedMessage(  # noqa: N802 (the .proto's names)
        self, request: pb.UnwrapReceivedMessageRequest, context: grpc.ServicerContext
    ) -> pb.UnwrapReceivedMessageResponse:
        return self._answer(context, self._unwrap, request)

    def MarkDependenciesMet(  # noqa: N802 (the .proto's names)
        self, request: pb.MarkDependenciesMetRequest, context: grpc.ServicerContext
    ) -> pb.MarkDependenciesMetResponse:
        def mark(request: pb.MarkDependenciesMetRequest) -> pb.MarkDependenciesMetResponse:
            self._require_open(request.channel_id)
            self.manager.mark_dependencies_met(list(request.message_ids), request.channel_id)
            return pb.MarkDependenciesMetResponse()

        return self._answer(context, mark, request)

    def AckEvents(  # noqa: N802 (the .proto's names)
        self, request: pb.AckEventsRequest, context: grpc.ServicerContext
    ) -> pb.AckEventsResponse:
        def ack(request: pb.AckEventsRequest) -> pb.AckEventsResponse:
            for position in request.acks:
                self._require_open(position.channel_id)
            for position in request.acks:
                self.manager.ack_events(position.channel_id, position.seq)
            return pb.AckEventsResponse()

        return self._answer(context, ack, request)

    def CloseChannel(  # noqa: N802 (the .proto's names)
        self, request: pb.CloseChannelRequest, context: grpc.ServicerContext
    ) -> pb.CloseChannelResponse:
        def close(request: pb.CloseChannelRequest) -> pb.CloseChannelResponse:
            _require_channel_id(request.channel_id)
            self.manager.close_channel(request.channel_id)
            return pb.CloseChannelResponse()

        return self._answer(context, close, request)

    def ListChannels(  # noqa: N802 (the .proto's names)
        self, request: pb.ListChannelsRequest, context: grpc.ServicerContext
    ) -> pb.ListChannelsResponse:
        return self._answer(
            context, lambda _: pb.ListChannelsResponse(channels=self._infos()), request
        )

    def SetParticipantCount(  # noqa: N802 (the .proto's names)
        self, request: pb.SetParticipantCountRequest, context: grpc.ServicerContext
    ) -> pb.SetParticipantCountResponse:
        def set_count(request: pb.SetParticipantCountRequest) -> pb.SetParticipantCountResponse:
            self._require_open(request.channel_id)
            self.manager.set_participant_count(request.channel_id, request.participants)
            return pb.SetParticipantCountResponse()

        return self._answer(context, set_count, request)

    def ListUnacknowledged(  # noqa: N802 (the .proto's names)
        self, request: pb.ListUnacknowledgedRequest, context: grpc.ServicerContext
    ) -> pb.ListUnacknowledgedResponse:
        def unacknowledged(request: pb.ListUnacknowledgedRequest) -> pb.ListUnacknowledgedResponse:
            found = self._listed(request.channel_id, self.manager.unacknowledged)
            return pb.ListUnacknowledgedResponse(
                messages=[pb.UnacknowledgedMessage(**m) for m in found]
            )

        return self._answer(context, unacknowledged, request)

    def ListWaiting(  # noqa: N802 (the .proto's names)
        self, request: pb.ListWaitingRequest, context: grpc.ServicerContext
    ) -> pb.ListWaitingResponse:
        def waiting(request: pb.ListWaitingRequest) -> pb.ListWaitingResponse:
            found = self._listed(request.channel_id, self.manager.waiting)
            return pb.ListWaitingResponse(messages=[pb.WaitingMessage(**m) for m in found])

        return self._answer(context, waiting, request)

    def Stats(  # noqa: N802 (the .proto's names)
        self, request: pb.StatsRequest, context: grpc.ServicerContext
    ) -> pb.StatsResponse:
        hub = self.hub
        return pb.StatsResponse(
            event_streams=hub.subscribers,
            event_streams_refused=hub.refused,
            event_streams_cut=hub.cut,
            refusals=self.refusals.counts(),
        )

    def _listed(
        self, channel_id: str, read: Callable[[str], Sequence[object]]
    ) -> list[dict[str, Any]]:
        """What ``read`` lists of an open channel, as the fields of its .proto message
        (the dataclasses' fields are named as the .proto's)."""
        self._require_open(channel_id)
        return [dataclasses.asdict(m) for m in read(channel_id)]  # type: ignore[call-overload]

    # ------------------------------------------------------------------ batches

    def WrapOutgoingMessages(  # noqa: N802 (the .proto's names)
        self, request: pb.WrapOutgoingMessagesRequest, context: grpc.ServicerContext
    ) -> pb.WrapOutgoingMessagesResponse:
        def wrap_all(request: pb.WrapOutgoingMessagesRequest) -> pb.WrapOutgoingMessagesResponse:
            room = _AnswerRoom()

            def wrap(item: pb.WrapOutgoingMessageRequest) -> pb.WrapOutgoingMessageResponse:
                room.admit(item.payload)
                answer = self._wrap(item)
                room.spend(item.payload, answer)
                return answer

            with self.manager.batch():
                results = self._each(request.messages, wrap, pb.WrapResult, "wrapped")
            return pb.WrapOutgoingMessagesResponse(results=results)

        return self._answer(context, wrap_all, request)

    def UnwrapReceivedMessages(  # noqa: N802 (the .proto's names)
        self, request: pb.UnwrapReceivedMessagesRequest, context: grpc.ServicerContext
    ) -> pb.UnwrapReceivedMessagesResponse:
        def unwrap_all(
            request: pb.UnwrapReceivedMessagesRequest,
        ) -> pb.UnwrapReceivedMessagesResponse:
            with self.manager.batch():
                results = self._each(request.messages, self._unwrap, pb.UnwrapResult, "unwrapped")
            return pb.UnwrapReceivedMessagesResponse(results=results)

        return self._answer(context, unwrap_all, request)

    # ------------------------------------------------------------------- events

    def Events(  # noqa: N802 (the .proto's names)
        self, request: pb.EventsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.Event]:
        with self._subscription(context) as stream:
            yield from _written(stream, self._events(request, context))

    def _events(
        self, request: pb.EventsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.Event]:
        yield pb.Event(subscribed=pb.Subscribed())
        for batch in self._follow(request, context):
            for event in batch:
                yield event
                crash_point("event")

    def EventBatches(  # noqa: N802 (the .proto's names)
        self, request: pb.EventsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.EventBatch]:
        with self._subscription(context) as stream:
            yield from _written(stream, self._event_batches(request, context))

    def _event_batches(
        self, request: pb.EventsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.EventBatch]:
        yield pb.EventBatch(events=[pb.Event(subscribed=pb.Subscribed())])
        for batch in self._follow(request, context):
            yield pb.EventBatch(events=batch)
            crash_point("event")

    @contextlib.contextmanager
    def _subscription(self, context: grpc.ServicerContext) -> Iterator[EventStream]:
        """A counted stream slot for the call, given back however the call ends (a cut
        stream's generator may never run again: gRPC's callback gives it back then)."""
        try:
            stream = self.hub.subscribe(context.peer(), context.cancel)
        except _RefusedError as refused:
            self.refusals.count(refused.code)
            context.abort(refused.code, refused.message)
        context.add_callback(lambda: self.hub.unsubscribe(stream))
        try:
            yield stream
        finally:
            self.hub.unsubscribe(stream)

    def _follow(
        self, request: pb.EventsRequest, context: grpc.ServicerContext
    ) -> Iterator[list[pb.Event]]:
        """One stream's events, a channel's read at a time, until the client leaves."""
        wanted = frozenset(request.channel_ids)
        # Resume points not yet applied (their channels may open later).
        to_ack = {p.channel_id: p.seq for p in request.resume}
        read_to = dict(to_ack)
        while context.is_active() and not self._stopping.is_set():
            generation = self.hub.generation
            sent = False
            for channel_id in self.manager.channels():
                if wanted and channel_id not in wanted:
                    continue
                batch = self._read(channel_id, to_ack, read_to)
                if batch:
                    sent = True
                    yield batch
            if not sent:
                self.hub.wait(generation, _POLL_S)

    def _read(
        self, channel_id: str, to_ack: dict[str, int], read_to: dict[str, int]
    ) -> list[pb.Event]:
        """The channel's next events for one stream (none if it closed meanwhile)."""
        try:
            if channel_id in to_ack:
                self.manager.ack_events(channel_id, to_ack.pop(channel_id))
            batch = self.manager.read_events(channel_id, read_to.get(channel_id, 0), _READ)
        except LocalProtocolError:
            return []  # closed since manager.channels() listed it
        if batch:
            read_to[channel_id] = batch[-1].seq or 0
        return [_event(channel_id, d) for d in batch]

    # ------------------------------------------------------------------ helpers

    def _open(self, request: pb.OpenChannelRequest) -> pb.OpenChannelResponse:
        _require_channel_id(request.channel_id)
        self._check_room(request.channel_id)
        self.manager.open_channel(request.channel_id)
        last, _ = self.manager.event_positions(request.channel_id)
        return pb.OpenChannelResponse(last_seq=last)

    def _wrap(self, request: pb.WrapOutgoingMessageRequest) -> pb.WrapOutgoingMessageResponse:
        _require_channel_id(request.channel_id)
        if not request.payload:
            raise _RefusedError(grpc.StatusCode.INVALID_ARGUMENT, "payload must be non-empty")
        self._check_room(request.channel_id)
        given_id = request.message_id if request.HasField("message_id") else None
        if given_id is not None:
            _require_id("message_id", given_id)
        wrapped = self.manager.wrap(request.payload, request.channel_id, given_id)
        return pb.WrapOutgoingMessageResponse(
            data=wrapped.data, message_id=wrapped.message_id, repeated_wrap=wrapped.repeated
        )

    def _unwrap(self, request: pb.UnwrapReceivedMessageRequest) -> pb.UnwrapReceivedMessageResponse:
        result = self.manager.unwrap_received_message(request.data)
        return pb.UnwrapReceivedMessageResponse(
            payload=result.payload,
            missing_dependencies=result.missing_dependencies,
            channel_id=result.channel_id,
            message_id=result.message_id,
            channel_open=result.channel_open,
            duplicate=result.duplicate,
        )

    def _infos(self) -> list[pb.ChannelInfo]:
        manager = self.manager
        infos = []
        for channel_id in manager.channels():
            with contextlib.suppress(LocalProtocolError):  # closed meanwhile
                last, acked = manager.event_positions(channel_id)
                waiting, unacknowledged = manager.channel(channel_id).buffer_sizes()
                infos.append(
                    pb.ChannelInfo(
                        channel_id=channel_id,
                        last_seq=last,
                        acknowledged_seq=acked,
                        participants=manager.participant_count(channel_id) or 0,
                        unacknowledged=unacknowledged,
                        waiting=waiting,
                    )
                )
        return infos

    def _require_open(self, channel_id: str) -> None:
        _require_channel_id(channel_id)
        if channel_id not in self.manager.channels():
            raise _RefusedError(grpc.StatusCode.NOT_FOUND, f"channel {channel_id!r} is not open")

    def _check_room(self, channel_id: str) -> None:
        """RESOURCE_EXHAUSTED rather than the manager's generic refusal at max_channels."""
        manager = self.manager
        channels = manager.channels()
        if channel_id not in channels and len(channels) >= manager.max_channels:
            raise _RefusedError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"already {manager.max_channels} channels open"
            )


def _event(channel_id: str, delivery: Delivery) -> pb.Event:
    """A numbered event as the .proto's Event."""
    seq, event = delivery.seq or 0, delivery.event
    mid = event.message_id
    match event:
        case MessageDelivered():
            ready = pb.MessageReady(
                channel_id=channel_id,
                message_id=mid,
                payload=event.content,
                sender_id=event.sender_id,
                lamport_timestamp=event.lamport_timestamp,
            )
            return pb.Event(message_ready=ready, seq=seq, channel_id=channel_id)
        case MessageAcknowledged():
            sent = pb.MessageSent(channel_id=channel_id, message_id=mid)
            return pb.Event(message_sent=sent, seq=seq, channel_id=channel_id)
        case MessagePossiblyAcknowledged():
            possibly = pb.PossiblyAcknowledged(
                channel_id=channel_id, message_id=mid, count=event.count
            )
            return pb.Event(possibly_acknowledged=possibly, seq=seq, channel_id=channel_id)
        case MessageMissing():
            missing = pb.MissingDependencies(channel_id=channel_id, message_ids=[mid])
            return pb.Event(missing_dependencies=missing, seq=seq, channel_id=channel_id)
        case SendFailed():
            failed = pb.SendFailed(channel_id=channel_id, message_id=mid)
            return pb.Event(send_failed=failed, seq=seq, channel_id=channel_id)
        case Transmit():
            transmit = pb.Transmit(
                channel_id=channel_id, kind=event.kind, message_id=mid, data=event.data
            )
            return pb.Event(transmit=transmit, seq=seq, channel_id=channel_id)
        case PeriodicSync():
            periodic = pb.PeriodicSync(channel_id=channel_id)
            return pb.Event(periodic_sync=periodic, seq=seq, channel_id=channel_id)
        case MessageEvicted():
            evicted = pb.MessageEvicted(
                channel_id=channel_id,
                message_id=mid,
                reason=event.reason.value,
                sender_id=event.sender_id,
                unmet_dependencies=event.unmet_dependencies,
                size_bytes=event.size_bytes,
            )
            return pb.Event(message_evicted=evicted, seq=seq, channel_id=channel_id)
        case EventsDiscarded():
            discarded = pb.EventsDiscarded(
                channel_id=channel_id,
                first_seq=event.first_seq,
                last_seq=event.last_seq,
                ready=event.ready,
            )
            return pb.Event(events_discarded=discarded, seq=seq, channel_id=channel_id)
    raise LocalProtocolError(f"no .proto event for {type(event).__name__}")


class TokenCheck(grpc.ServerInterceptor):
    """Refuses every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None or self._authorized(handler_call_details):
            return handler
        make = (
            grpc.unary_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        return make(_unauthenticated, handler.request_deserializer, handler.response_serializer)

    def _authorized(self, details: grpc.HandlerCallDetails) -> bool:
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False


def _unauthenticated(_request: object, context: grpc.ServicerContext) -> NoReturn:
    context.abort(
        grpc.StatusCode.UNAUTHENTICATED,
        "missing or wrong token: send metadata 'authorization: Bearer <token>'",
    )


class ReliabilityServer:
    """A gRPC server around a :class:`ReliabilityService`: ``start``, ``port``, ``stop``."""

    def __init__(
        self,
        manager: ReliabilityManager,
        listen: str,
        *,
        token: str | None = None,
        max_workers: int | None = None,
        max_subscribers: int = MAX_EVENT_STREAMS,
        max_subscribers_per_peer: int = MAX_EVENT_STREAMS_PER_PEER,
        write_timeout_s: float = EVENT_WRITE_TIMEOUT_S,
    ) -> None:
        # Each Events stream holds a worker thread: keep some for the unary calls (as many
        # again by default).
        if max_workers is None:
            max_workers = 2 * max_subscribers
        if max_subscribers >= max_workers:
            raise LocalProtocolError("max_subscribers must be below max_workers")
        hub = EventHub(
            max_subscribers=max_subscribers,
            max_per_peer=max_subscribers_per_peer,
            write_timeout_s=write_timeout_s,
        )
        self.service = ReliabilityService(manager, hub=hub)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers, thread_name_prefix="sdsync-reliability"),
            interceptors=[TokenCheck(token)] if token else None,
            options=[
                ("grpc.max_receive_message_length", request_limit(manager.config.limits)),
                # Otherwise a second server could bind the same port and share its calls.
                ("grpc.so_reuseport", 0),
            ],
        )
        pb_grpc.add_ReliabilityServicer_to_server(self.service, self._server)
        try:
            self.port = self._server.add_insecure_port(listen)
        except RuntimeError as exc:  # grpc's "Failed to bind"
            raise OSError(f"cannot listen on {listen}: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}")

    def start(self) -> None:
        self.service.start()
        self._server.start()

    def stop(self, grace_s: float = 1.0) -> None:
        """End the streams and the ticks, refuse new calls, close the manager once the
        calls in flight are done (cancelled after ``grace_s``)."""
        self.service.stop()
        self._server.stop(grace_s).wait()
        self.service.close()
