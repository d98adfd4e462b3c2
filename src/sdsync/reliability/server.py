"""The reliability API of seed 004 served over gRPC (``reliability.proto``).

Theory of operation
-------------------
One :class:`ReliabilityService` holds one :class:`~sdsync.runtime.manager.ReliabilityManager`
(one participant, many channels) and answers the four calls of the API by calling the
manager's methods of the same names, on whichever of the server's threads the call came
in: the manager takes its own lock, and its SQLite state may be used from any thread. The
service closes the manager (:meth:`ReliabilityService.close`) once no call can reach it
any more: it is the service's.

Ticking is the server's job, so that a client in any language only wraps, unwraps and
reacts to events: a thread calls ``manager.tick()`` when ``manager.next_due()`` says work
is due, never more often than every :data:`MIN_TICK_MS` and at least every
:data:`IDLE_TICK_MS` (a call that schedules something sooner is served by then).

The manager's callbacks run on the thread whose call caused them, holding the manager's
lock. Each turns into an ``Event`` put onto every subscriber's bounded queue without
waiting (:class:`EventHub`): a subscriber whose queue is full is dropped with a warning and
its ``Events`` stream ends with ``RESOURCE_EXHAUSTED``, so a slow reader never holds up the
manager, the other subscribers or the protocol's timers. Events are not kept for absent
subscribers; the first event of every stream, ``Subscribed``, tells the client that from
then on it misses nothing.

Every refusal is a gRPC status with a message, never a crash and never a state change:
bytes that do not decode and requests the manager refuses are ``INVALID_ARGUMENT``;
``MarkDependenciesMet`` on a channel that is not open is ``NOT_FOUND``; opening a channel
beyond the manager's ``max_channels``, too many subscribers or a request larger than
:func:`request_limit` is ``RESOURCE_EXHAUSTED`` (the last checked by gRPC itself, before
any of our code runs). Bytes for a channel that is not open are a normal answer with
``channel_open`` false, as the manager reports them: well-formed, simply not ours. With a
token, a call without ``authorization: Bearer <token>`` metadata is ``UNAUTHENTICATED``
(:class:`TokenCheck`, before the call's handler).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, NoReturn

import grpc

from sdsync.core import system_clock_ms
from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc
from sdsync.runtime.manager import ReliabilityManager
from sdsync.wire import WireLimits, decode

logger = logging.getLogger("sdsync.reliability")

MIN_TICK_MS = 100
IDLE_TICK_MS = 1_000
#: Events a subscriber may have unread before it is dropped.
EVENT_QUEUE = 4_096
#: Besides a request's SDS message (at most the channel's max_message_bytes): field tags,
#: the channel id, the message id.
REQUEST_MARGIN = 64 * 1024
#: How long an Events stream waits for an event before it looks whether its client left.
_POLL_S = 0.25


def request_limit(limits: WireLimits) -> int:
    """The largest request the server accepts: one SDS message as large as peers accept."""
    return limits.max_message_bytes + REQUEST_MARGIN


class _Subscriber:
    def __init__(self, channels: frozenset[str], capacity: int) -> None:
        self.channels = channels
        self.queue: queue.Queue[pb.Event] = queue.Queue(capacity)
        self.dropped = False

    def wants(self, channel_id: str) -> bool:
        return not self.channels or channel_id in self.channels


class EventHub:
    """Fans events out to subscribers without ever waiting for one."""

    def __init__(self, *, capacity: int = EVENT_QUEUE, max_subscribers: int = 8) -> None:
        self.capacity = capacity
        self.max_subscribers = max_subscribers
        self._subscribers: list[_Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, channels: frozenset[str]) -> _Subscriber | None:
        """A new subscriber; None when there are ``max_subscribers`` already."""
        with self._lock:
            if len(self._subscribers) >= self.max_subscribers:
                return None
            subscriber = _Subscriber(channels, self.capacity)
            self._subscribers.append(subscriber)
            return subscriber

    def unsubscribe(self, subscriber: _Subscriber) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._subscribers.remove(subscriber)

    def publish(self, channel_id: str, event: pb.Event) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            if not subscriber.wants(channel_id):
                continue
            try:
                subscriber.queue.put_nowait(event)
            except queue.Full:
                self._drop(subscriber)

    def _drop(self, subscriber: _Subscriber) -> None:
        self.unsubscribe(subscriber)
        if not subscriber.dropped:
            subscriber.dropped = True
            logger.warning(
                "event subscriber dropped: %d events unread (it reads too slowly); "
                "its stream ends with RESOURCE_EXHAUSTED and it must subscribe again",
                self.capacity,
            )


@contextlib.contextmanager
def _refusals(context: grpc.ServicerContext) -> Iterator[None]:
    """The manager's errors as gRPC statuses; anything else is logged and INTERNAL."""
    try:
        yield
    except RemoteProtocolError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not an SDS message: {exc}")
    except LocalProtocolError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except Exception:
        logger.exception("reliability call failed")
        context.abort(grpc.StatusCode.INTERNAL, "internal error (logged by the server)")


def _require_channel_id(context: grpc.ServicerContext, channel_id: str) -> None:
    if not channel_id:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "channel_id must be non-empty")


class ReliabilityService(pb_grpc.ReliabilityServicer):
    """The servicer: the manager's API as RPCs, its callbacks as events, its ticks."""

    def __init__(
        self,
        manager: ReliabilityManager,
        *,
        hub: EventHub | None = None,
        clock: Callable[[], int] = system_clock_ms,
    ) -> None:
        self.manager = manager
        self.hub = hub if hub is not None else EventHub()
        self._clock = clock
        self._stopping = threading.Event()
        self._ticker = threading.Thread(
            target=self._tick_loop, name="sdsync-reliability-tick", daemon=True
        )
        self._subscribe_callbacks()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        """Stop ticking and end the event streams."""
        self._stopping.set()
        if self._ticker.is_alive():
            self._ticker.join()

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

    # ------------------------------------------------------------------ events

    def _subscribe_callbacks(self) -> None:
        manager, publish = self.manager, self.hub.publish

        def ready(channel_id: str, message_id: str) -> None:
            publish(
                channel_id,
                pb.Event(
                    message_ready=pb.MessageReady(channel_id=channel_id, message_id=message_id)
                ),
            )

        def sent(channel_id: str, message_id: str) -> None:
            publish(
                channel_id,
                pb.Event(message_sent=pb.MessageSent(channel_id=channel_id, message_id=message_id)),
            )

        def possibly(channel_id: str, message_id: str, count: int) -> None:
            publish(
                channel_id,
                pb.Event(
                    possibly_acknowledged=pb.PossiblyAcknowledged(
                        channel_id=channel_id, message_id=message_id, count=count
                    )
                ),
            )

        def missing(channel_id: str, message_ids: list[str]) -> None:
            publish(
                channel_id,
                pb.Event(
                    missing_dependencies=pb.MissingDependencies(
                        channel_id=channel_id, message_ids=message_ids
                    )
                ),
            )

        def failed(channel_id: str, message_id: str) -> None:
            publish(
                channel_id,
                pb.Event(send_failed=pb.SendFailed(channel_id=channel_id, message_id=message_id)),
            )

        def transmit(channel_id: str, kind: str, message_id: str, data: bytes) -> None:
            publish(
                channel_id,
                pb.Event(
                    transmit=pb.Transmit(
                        channel_id=channel_id, kind=kind, message_id=message_id, data=data
                    )
                ),
            )

        def periodic(channel_id: str) -> None:
            publish(channel_id, pb.Event(periodic_sync=pb.PeriodicSync(channel_id=channel_id)))

        manager.on_message_ready = ready
        manager.on_message_sent = sent
        manager.on_possibly_acknowledged = possibly
        manager.on_missing_dependencies = missing
        manager.on_send_failed = failed
        manager.on_transmit = transmit
        manager.on_periodic_sync = periodic

    # --------------------------------------------------------------------- RPCs

    def OpenChannel(  # noqa: N802 (the .proto's names)
        self, request: pb.OpenChannelRequest, context: grpc.ServicerContext
    ) -> pb.OpenChannelResponse:
        _require_channel_id(context, request.channel_id)
        self._check_room(context, request.channel_id)
        with _refusals(context):
            self.manager.open_channel(request.channel_id)
        return pb.OpenChannelResponse()

    def WrapOutgoingMessage(  # noqa: N802 (the .proto's names)
        self, request: pb.WrapOutgoingMessageRequest, context: grpc.ServicerContext
    ) -> pb.WrapOutgoingMessageResponse:
        _require_channel_id(context, request.channel_id)
        if not request.payload:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "payload must be non-empty")
        self._check_room(context, request.channel_id)
        given_id = request.message_id if request.HasField("message_id") else None
        with _refusals(context):
            data = self.manager.wrap_outgoing_message(request.payload, request.channel_id, given_id)
        return pb.WrapOutgoingMessageResponse(data=data, message_id=_message_id(data))

    def UnwrapReceivedMessage(  # noqa: N802 (the .proto's names)
        self, request: pb.UnwrapReceivedMessageRequest, context: grpc.ServicerContext
    ) -> pb.UnwrapReceivedMessageResponse:
        with _refusals(context):
            result = self.manager.unwrap_received_message(request.data)
        return pb.UnwrapReceivedMessageResponse(
            payload=result.payload,
            missing_dependencies=result.missing_dependencies,
            channel_id=result.channel_id,
            message_id=result.message_id,
            channel_open=result.channel_open,
        )

    def MarkDependenciesMet(  # noqa: N802 (the .proto's names)
        self, request: pb.MarkDependenciesMetRequest, context: grpc.ServicerContext
    ) -> pb.MarkDependenciesMetResponse:
        _require_channel_id(context, request.channel_id)
        if request.channel_id not in self.manager.channels():
            context.abort(grpc.StatusCode.NOT_FOUND, f"channel {request.channel_id!r} is not open")
        with _refusals(context):
            self.manager.mark_dependencies_met(list(request.message_ids), request.channel_id)
        return pb.MarkDependenciesMetResponse()

    def Events(  # noqa: N802 (the .proto's names)
        self, request: pb.EventsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.Event]:
        subscriber = self.hub.subscribe(frozenset(request.channel_ids))
        if subscriber is None:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"already {self.hub.max_subscribers} event subscribers",
            )
        try:
            yield pb.Event(subscribed=pb.Subscribed())
            while context.is_active() and not self._stopping.is_set():
                if subscriber.dropped:
                    context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"too slow: {self.hub.capacity} events unread; subscribe again",
                    )
                try:
                    yield subscriber.queue.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
        finally:
            self.hub.unsubscribe(subscriber)

    def _check_room(self, context: grpc.ServicerContext, channel_id: str) -> None:
        """RESOURCE_EXHAUSTED rather than the manager's generic refusal at max_channels."""
        manager = self.manager
        channels = manager.channels()
        if channel_id not in channels and len(channels) >= manager.max_channels:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"already {manager.max_channels} channels open",
            )


def _message_id(data: bytes) -> str:
    """The id in our own wrapped bytes (the manager returns the bytes only)."""
    limits = dataclasses.replace(WireLimits(), max_message_bytes=max(len(data), 1))
    return decode(data, limits).message_id


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
        max_workers: int = 16,
        max_subscribers: int = 8,
    ) -> None:
        # Each Events stream holds a worker thread: keep some for the unary calls.
        if max_subscribers >= max_workers:
            raise LocalProtocolError("max_subscribers must be below max_workers")
        self.service = ReliabilityService(manager, hub=EventHub(max_subscribers=max_subscribers))
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
