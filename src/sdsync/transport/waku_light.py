"""WakuLightTransport: SDS through Waku service nodes, relaying nothing (LightPush + Filter).

Theory of operation
-------------------
A Waku light client joins no gossipsub mesh: it asks *service nodes* (nwaku, go-waku,
``sdsync store serve``) to publish for it (19/WAKU2-LIGHTPUSH) and to push it what is
published on its content topics (12/WAKU2-FILTER v2). :class:`WakuLightTransport` is
such a client behind the :class:`~sdsync.waku.node.Transport` contract, so a
ReliableChannel runs over it as over relay (it is a
:class:`~sdsync.waku.node.WakuClient`, as a relay node is). It runs on a
:class:`~sdsync.waku.node.WakuHost`, the ``host`` given (a
:class:`~sdsync.testing.memory_waku.MemoryWakuNode` in tests) or else one it makes: a
:class:`~sdsync.transport.libp2p.Libp2pNode` with ``relay=False``, which mounts no
gossipsub at all (a relay peer would otherwise queue it every publication, in case it
subscribed), but names the shards of its content topics in its metadata (go-waku on
cluster 1 drops a peer that names none). Either way the transport starts and closes it.

*Publishing.* :meth:`~WakuLightTransport.publish` wraps the SDS bytes in a WakuMessage
(the channel's content topic, a fresh timestamp), returns its Waku message hash at once
and leaves it in an outbox; one sender task LightPushes the outbox in order, each message
to the first service that accepts it. A service is asked over
``/vac/waku/lightpush/3.0.0`` until it turns out not to speak it, then over
``/vac/waku/lightpush/2.0.0-beta1`` (go-waku 0.9.0 speaks only that one). A service
answering 429 (we are over its per-peer rate: nwaku's ``--rate-limit``, our store's
``lightpush_rate``) is asked the same message again after a pause, doubling from
``busy_min_s`` to ``busy_max_s`` per 429 in a row and starting over once one is taken;
each 429 is counted in ``rate_limited``. After ``busy_retries`` such pauses for one
message the service counts as failed and the next one is asked. A message no
service takes is logged, counted in ``publish_failures`` and dropped, as relay drops one
nobody hears: SDS resends what is not acknowledged. So a publisher holding a lock across
``publish`` (ReliableChannel does) never waits on a slow or dead service.
:meth:`~WakuLightTransport.lightpush` is the same push, awaited, with typed errors:
:class:`ServiceRefusedError` (a status other than 200, with its description) for each
refusal, :class:`NoServiceError` when no service took it.

*Receiving.* Filter subscriptions at up to ``redundancy`` services carry every content
topic subscribed to. The service pushes each message as a MessagePush frame on a push
lane (:meth:`~sdsync.transport.libp2p.Libp2pTransport.serve_pushes`). Each frame is
deduplicated by its Waku message hash in a bounded set of recent hashes (every subscribed
service pushes the same message; our own publications come back too, and their hashes go
in the set as they are published) and handed to the subscribers of its content topic as
``Received(payload, message hash)``. Frames from peers other than our services, or that do
not parse, are counted in ``rejected`` and dropped.

*Deciding.* Which service is asked what, and when, is :class:`FilterPlan`'s (sans-I/O: the
caller passes ``now``, monotonic seconds, and carries out the actions it hands out):
subscribe where a subscription is missing, in the order the services were given; ping each
subscribed service every ``ping_interval_s`` (a ping renews the subscription, which the
service would otherwise expire); subscribe again at once when a ping answers 404 (the
service restarted or expired us) or the connection to the service is gone (the service
restarted, or the link broke: it could no longer push to us); back off, doubling from
``retry_min_s`` to ``retry_max_s``, from a service that failed, while another one fills its
place. Pushes go first to services whose last push did not fail.

*Asking.* Each exchange with a service is its protocol's client, below this module:
:func:`~sdsync.waku.lightpush.client.lightpush_v3` and ``lightpush_v2``,
:func:`~sdsync.waku.filter.client.filter_request`, and
:func:`~sdsync.waku.filter.client.pushed_message` for what a service pushes; here is
only which service, when, and what follows from each answer.

*Catching up* is the store client's (a layer above): :meth:`~WakuLightTransport.request`
is the host's, so :meth:`sdsync.store.WakuStoreClient.over` asks a service's store over the
same connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import math
import random
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import multiaddr

from sdsync.errors import (
    LocalProtocolError,
    ProtocolNotSupportedError,
    RemoteProtocolError,
)
from sdsync.lifecycle import AsyncLifecycle
from sdsync.waku.filter.client import Criterion, filter_request, filter_requests, pushed_message
from sdsync.waku.filter.rpc import FILTER_PUSH_PROTOCOL, FilterSubscribeType
from sdsync.waku.lightpush.client import lightpush_v2, lightpush_v3
from sdsync.waku.node import Received, WakuClient, WakuHost
from sdsync.waku.relay.topics import (
    SHARD_TOPIC_PREFIX,
    WakuRelayConfig,
    default_content_topic,
    parse_content_topic,
)
from sdsync.waku.rpc import (
    MAX_RPC_BYTES,
    LightServiceError,
    ServiceRefusedError,
)
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES, WakuMessage

logger = logging.getLogger("sdsync.transport.waku_light")


_OUTBOX_LIMIT = 256
_FLUSH_S = 2.0
_UNSUBSCRIBE_S = 2.0
_WAIT_POLL_S = 0.05
_OK = 200
_NOT_FOUND = 404
_TOO_MANY_REQUESTS = 429


# --- errors ---------------------------------------------------------------------------


class NoServiceError(LightServiceError):
    """No service took the request; ``failures`` holds each one's error, in the order
    asked (a :class:`ServiceRefusedError`, an ``OSError`` for one that could not be
    reached or did not answer in time, a RemoteProtocolError for a malformed answer)."""

    def __init__(self, what: str, failures: Sequence[tuple[str, Exception]]) -> None:
        told = "; ".join(f"{service}: {error}" for service, error in failures)
        super().__init__(f"no service took {what}: {told or 'no service was asked'}")
        self.failures = list(failures)


# --- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LightTiming:
    """When the light client asks its services what."""

    #: js-waku pings every minute; nwaku expires a subscription not renewed for 5.
    ping_interval_s: float = 60.0
    request_timeout_s: float = 10.0
    retry_min_s: float = 1.0
    #: As the relay's redial (transport/redial.py): a restarted service is found again
    #: within 8 s of its return.
    retry_max_s: float = 8.0
    #: How often the connections to the services are looked at.
    watch_interval_s: float = 1.0
    #: The pause after a LightPush answered 429, doubling per 429 in a row up to
    #: ``busy_max_s``: nwaku's ``lightpush:5/1s`` gives a token back every 0.2 s.
    busy_min_s: float = 0.25
    busy_max_s: float = 8.0
    #: Pauses for one message at one service before it is asked elsewhere (at most
    #: ~16 s with the defaults).
    busy_retries: int = 6

    def backoff(self, failures: int) -> float:
        return _doubling(self.retry_min_s, self.retry_max_s, failures)

    def busy_backoff(self, refusals: int) -> float:
        return _doubling(self.busy_min_s, self.busy_max_s, refusals)


def _doubling(first: float, cap: float, times: int) -> float:
    """``first``, doubled for each of ``times`` after the first, at most ``cap``."""
    return float(min(cap, first * 2 ** max(0, times - 1)))


class Outcome(enum.Enum):
    """How a Filter request went."""

    OK = "ok"
    #: A ping answered 404: the service holds no subscription of ours (any more).
    NOT_SUBSCRIBED = "not subscribed"
    #: Unreachable, too slow, refused or answered nonsense.
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Subscribe at service number ``service`` to ``criteria``."""

    service: int
    criteria: frozenset[Criterion]


@dataclass(frozen=True, slots=True)
class Ping:
    """Ping service number ``service`` (which renews our subscription there)."""

    service: int


FilterAction = Subscribe | Ping


@dataclass(slots=True)
class _Service:
    subscribed: frozenset[Criterion] = frozenset()  # confirmed by the service
    last_ok: float = -math.inf
    pending: FilterAction | None = None
    failures: int = 0
    retry_at: float = -math.inf
    push_failures: int = 0
    push_retry_at: float = -math.inf
    push_busy: int = 0  # 429s in a row


class FilterPlan:
    """Which of ``services`` (numbered in order of preference) to ask what: sans-I/O.

    :meth:`actions` hands out what is due (at most one request per service in flight),
    :meth:`done` takes each one's :class:`Outcome`, :meth:`disconnected` the services
    whose connection is gone, :meth:`next_due` says when to ask again.
    """

    def __init__(self, services: int, redundancy: int, timing: LightTiming) -> None:
        if services < 1:
            raise LocalProtocolError("a light client needs at least one service node")
        if redundancy < 1:
            raise LocalProtocolError("redundancy must be at least 1")
        self.redundancy = min(redundancy, services)
        self.timing = timing
        self.wanted: frozenset[Criterion] = frozenset()
        self._services = [_Service() for _ in range(services)]

    def want(self, criteria: Iterable[Criterion]) -> None:
        """Subscribe to ``criteria`` too (subscribed services are asked again)."""
        self.wanted |= frozenset(criteria)

    def subscribed(self, criterion: Criterion | None = None) -> list[int]:
        """The services holding our subscription (to ``criterion``, if given)."""
        return [
            index
            for index, service in enumerate(self._services)
            if service.subscribed and (criterion is None or criterion in service.subscribed)
        ]

    def _active(self) -> int:
        """Services subscribed, or being subscribed."""
        return sum(1 for s in self._services if s.subscribed or isinstance(s.pending, Subscribe))

    def actions(self, now: float) -> list[FilterAction]:
        """What to ask now; each is in flight until :meth:`done` hears how it went."""
        if not self.wanted:
            return []
        due: list[FilterAction] = []
        for index, service in enumerate(self._services):
            if service.pending is None and service.subscribed:
                if not self.wanted <= service.subscribed:
                    due.append(Subscribe(index, self.wanted))
                elif now >= service.last_ok + self.timing.ping_interval_s:
                    due.append(Ping(index))
        active = self._active()
        for index, service in enumerate(self._services):
            if active >= self.redundancy:
                break
            if service.pending is None and not service.subscribed and now >= service.retry_at:
                due.append(Subscribe(index, self.wanted))
                active += 1
        for action in due:
            self._services[action.service].pending = action
        return due

    def done(self, action: FilterAction, outcome: Outcome, now: float) -> None:
        service = self._services[action.service]
        if service.pending != action:
            raise LocalProtocolError(f"{action} is not in flight")
        service.pending = None
        if outcome is Outcome.OK:
            if isinstance(action, Subscribe):
                service.subscribed |= action.criteria
            service.last_ok, service.failures, service.retry_at = now, 0, -math.inf
        elif outcome is Outcome.NOT_SUBSCRIBED:
            service.subscribed = frozenset()  # subscribe again, at once
        else:
            service.subscribed = frozenset()
            service.failures += 1
            service.retry_at = now + self.timing.backoff(service.failures)

    def disconnected(self, services: Iterable[int], since: float) -> None:
        """``services`` were found without a connection by a look that started at
        ``since``: their subscriptions confirmed before then are lost (subscribe again)."""
        for index in services:
            service = self._services[index]
            if service.pending is None and service.last_ok <= since:
                service.subscribed = frozenset()

    def next_due(self) -> float:
        """When :meth:`actions` next has something to hand out (``inf``: not before
        :meth:`want`, :meth:`done` or :meth:`disconnected` changes the plan)."""
        if not self.wanted:
            return math.inf
        room = self._active() < self.redundancy
        times = [math.inf]
        for service in self._services:
            if service.pending is not None:
                continue
            if service.subscribed:
                if not self.wanted <= service.subscribed:
                    return -math.inf
                times.append(service.last_ok + self.timing.ping_interval_s)
            elif room:
                times.append(service.retry_at)
        return min(times)

    # -- pushes

    def push_order(self, now: float) -> list[int]:
        """The services to LightPush to, in order: those whose last push did not fail
        (or failed long enough ago) first."""
        return sorted(
            range(len(self._services)),
            key=lambda index: (now < self._services[index].push_retry_at, index),
        )

    def pushed(self, index: int, ok: bool, now: float) -> None:
        service = self._services[index]
        if ok:
            service.push_failures, service.push_retry_at, service.push_busy = 0, -math.inf, 0
        else:
            service.push_failures += 1
            service.push_retry_at = now + self.timing.backoff(service.push_failures)

    def busy(self, index: int) -> float:
        """Service ``index`` answered a push 429: how long to pause before asking again."""
        service = self._services[index]
        service.push_busy += 1
        return self.timing.busy_backoff(service.push_busy)


# --- the transport ----------------------------------------------------------------------


class _RecentHashes:
    """The last ``limit`` message hashes seen."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._hashes: OrderedDict[bytes, None] = OrderedDict()

    def add(self, message_hash: bytes) -> bool:
        """False if ``message_hash`` was seen already."""
        if message_hash in self._hashes:
            return False
        self._hashes[message_hash] = None
        if len(self._hashes) > self._limit:
            self._hashes.popitem(last=False)
        return True


@dataclass(frozen=True, slots=True)
class ServiceNode:
    """A service node: its multiaddr (with ``/p2p/<id>``) and peer id."""

    address: str
    peer_id: str

    @classmethod
    def parse(cls, address: str) -> ServiceNode:
        try:
            peer_id = multiaddr.Multiaddr(address).get_peer_id()
        except Exception as exc:
            raise LocalProtocolError(f"service {address!r} is not a multiaddr: {exc}") from None
        if peer_id is None:
            raise LocalProtocolError(f"service {address!r} names no peer: end it with /p2p/PEER_ID")
        return cls(address, str(peer_id))


def announced_shards(
    waku: WakuRelayConfig,
    topics: Iterable[str],
    content_topic: Callable[[str], str] = default_content_topic,
) -> tuple[int, ...]:
    """The shards a light client names in its metadata: the static shard, or the
    autoshards of ``topics``' content topics (every shard of the cluster without topics)."""
    if waku.shard is not None:
        return (waku.shard,)
    shards = {parse_content_topic(content_topic(t)).shard(waku.shard_count) for t in topics}
    return tuple(sorted(shards)) if shards else tuple(range(waku.shard_count))


class WakuLightTransport(AsyncLifecycle):
    """A :class:`~sdsync.waku.node.Transport` through Waku service nodes (see the module)."""

    def __init__(
        self,
        services: Sequence[str],
        *,
        listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",),
        key: bytes | None = None,
        waku: WakuRelayConfig | None = None,
        topics: Sequence[str] = (),
        content_topic: Callable[[str], str] = default_content_topic,
        redundancy: int = 2,
        timing: LightTiming | None = None,
        drop_rate: float = 0.0,
        seed: int | None = None,
        max_message_bytes: int = MAX_WAKU_MESSAGE_BYTES,
        recent_hashes: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        host: WakuHost | None = None,
    ) -> None:
        """``listen`` and ``key`` are those of the host made when no ``host`` is given."""
        if not 0.0 <= drop_rate <= 1.0:
            raise LocalProtocolError("drop_rate must be a probability")
        self.services = [ServiceNode.parse(address) for address in services]
        self.timing = timing if timing is not None else LightTiming()
        self.plan = FilterPlan(len(self.services), redundancy, self.timing)
        self.waku = waku if waku is not None else WakuRelayConfig()
        self.content_topic = content_topic
        self.drop_rate = drop_rate
        self.max_message_bytes = max_message_bytes
        if host is None:
            from sdsync.transport.libp2p import Libp2pNode  # py-libp2p: a second to load

            host = Libp2pNode(
                listen=listen,
                key=key,
                waku=self.waku,
                announce_shards=announced_shards(self.waku, topics, content_topic),
                relay=False,
            )
        self.host = host
        self.peer_id = self.host.peer_id
        self._by_peer = {service.peer_id: index for index, service in enumerate(self.services)}
        self._rng = random.Random(seed)
        self._clock = clock
        self._recent = _RecentHashes(recent_hashes)
        # Services found not to speak LightPush v3.
        self._v2_only: set[int] = set()
        self._subscribers: dict[Criterion, list[asyncio.Queue[Received | None]]] = {}
        self._outbox: asyncio.Queue[tuple[str, WakuMessage]] = asyncio.Queue(_OUTBOX_LIMIT)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._requests: set[asyncio.Task[None]] = set()
        self._last_timestamp = 0
        self._closed = False
        # Counters, for reporting.
        self.received = 0
        self.duplicates = 0
        self.randomly_dropped = 0
        self.publish_failures = 0
        self.rate_limited = 0
        self.rejected: Counter[str] = Counter()

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the host; subscriptions and the outbox are served from now on."""
        await self.host.serve_pushes(FILTER_PUSH_PROTOCOL, self._on_push)
        await self.host.start()
        self._tasks = [
            asyncio.create_task(self._filter_forever(), name="waku-light filter"),
            asyncio.create_task(self._send_forever(), name="waku-light lightpush"),
        ]

    async def close(self) -> None:
        """Push what is queued (for up to ``_FLUSH_S``), unsubscribe, stop the host;
        subscriptions end."""
        if self._closed:
            return
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_FLUSH_S):
                    await self._outbox.join()
        self._closed = True
        for task in [*self._tasks, *self._requests]:
            task.cancel()
        for task in [*self._tasks, *self._requests]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._tasks:
            await self._unsubscribe_all()
        for queues in self._subscribers.values():
            for queue in queues:
                queue.put_nowait(None)
        await self.host.close()

    async def _unsubscribe_all(self) -> None:
        """Tell the services holding our subscription that we leave (best effort)."""

        async def leave(index: int) -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_UNSUBSCRIBE_S):
                    await filter_request(
                        functools.partial(self._request, index),
                        self._name(index),
                        FilterSubscribeType.UNSUBSCRIBE_ALL,
                    )

        await asyncio.gather(*(leave(index) for index in self.plan.subscribed()))

    # -------------------------------------------------------------- publishing

    async def publish(self, topic: str, data: bytes) -> bytes:
        """Queue ``data`` in a WakuMessage on ``topic``'s content topic for LightPush;
        returns its Waku message hash. Waits only while ``_OUTBOX_LIMIT`` are queued."""
        pubsub_topic, message = self._message(topic, data)
        await self._outbox.put((pubsub_topic, message))
        return message.hash(pubsub_topic)

    async def lightpush(self, topic: str, data: bytes) -> bytes:
        """LightPush ``data`` on ``topic`` now, to the first service that accepts it;
        returns its Waku message hash, or raises :class:`NoServiceError`."""
        pubsub_topic, message = self._message(topic, data)
        await self.lightpush_message(pubsub_topic, message)
        return message.hash(pubsub_topic)

    def _message(self, topic: str, data: bytes) -> tuple[str, WakuMessage]:
        self._check_open()
        pubsub_topic, content_topic = self._criterion(topic)
        message = WakuMessage(payload=data, content_topic=content_topic, timestamp=self._stamp())
        size = len(message.to_bytes())
        if size > self.max_message_bytes:
            raise LocalProtocolError(
                f"a {size}-byte frame exceeds max_message_bytes={self.max_message_bytes}"
            )
        # Filter pushes it back to us; it is not news.
        self._recent.add(message.hash(pubsub_topic))
        return pubsub_topic, message

    def _stamp(self) -> int:
        # Strictly increasing, so two publications of the same bytes never share a hash.
        self._last_timestamp = max(time.time_ns(), self._last_timestamp + 1)
        return self._last_timestamp

    async def lightpush_message(self, pubsub_topic: str, message: WakuMessage) -> None:
        """LightPush ``message`` as it is to the first service that accepts it."""
        failures: list[tuple[str, Exception]] = []
        for index in self.plan.push_order(self._clock()):
            try:
                await self._lightpush_paced(index, pubsub_topic, message)
            except (OSError, RemoteProtocolError) as exc:
                self.plan.pushed(index, False, self._clock())
                failures.append((self.services[index].address, exc))
                continue
            self.plan.pushed(index, True, self._clock())
            return
        raise NoServiceError(f"the message {message.hash(pubsub_topic).hex()[:16]}…", failures)

    async def _lightpush_paced(self, index: int, pubsub_topic: str, message: WakuMessage) -> None:
        """LightPush ``message`` to service ``index``, pausing after each 429 (see the
        module) up to ``busy_retries`` times; the last refusal is raised."""
        pauses = 0
        while True:
            try:
                await self._lightpush(index, pubsub_topic, message)
                return
            except ServiceRefusedError as exc:
                if exc.status != _TOO_MANY_REQUESTS:
                    raise
                self.rate_limited += 1
                if pauses == self.timing.busy_retries:
                    raise
            pauses += 1
            await asyncio.sleep(self.plan.busy(index))

    async def _send_forever(self) -> None:
        while True:
            pubsub_topic, message = await self._outbox.get()
            try:
                await self.lightpush_message(pubsub_topic, message)
            except NoServiceError as exc:
                self.publish_failures += 1
                logger.warning("%s: a publication was lost: %s", self.peer_id[-8:], exc)
            finally:
                self._outbox.task_done()

    async def _lightpush(self, index: int, pubsub_topic: str, message: WakuMessage) -> None:
        request = functools.partial(self._request, index)
        if index not in self._v2_only:
            try:
                await lightpush_v3(request, self._name(index), pubsub_topic, message)
                return
            except ProtocolNotSupportedError:
                logger.info("%s speaks no LightPush v3: v2 from now on", self._name(index))
                self._v2_only.add(index)
        await lightpush_v2(request, self._name(index), pubsub_topic, message)

    # -------------------------------------------------------------- receiving

    def subscribe(self, topic: str) -> AsyncIterator[Received]:
        """SDS bytes published on ``topic`` by others, with their Waku hash as hint."""
        self._check_open()
        criterion = self._criterion(topic)
        queue: asyncio.Queue[Received | None] = asyncio.Queue()
        self._subscribers.setdefault(criterion, []).append(queue)
        self.plan.want([criterion])
        self._wake.set()
        return _drain(queue)

    def _criterion(self, topic: str) -> Criterion:
        if topic.startswith(SHARD_TOPIC_PREFIX):
            raise LocalProtocolError(
                f"a light client asks for content topics, not a whole shard ({topic})"
            )
        content_topic = self.content_topic(topic)
        return self.waku.pubsub_topic(content_topic), content_topic

    async def _on_push(self, peer: str, frame: bytes) -> None:
        """A MessagePush frame from ``peer``: checked, deduplicated, handed out."""
        if peer not in self._by_peer:
            self._reject("not_a_service", f"a push from {peer}, which is none of our services")
            return
        try:
            pubsub_topic, message = pushed_message(frame, self.waku.pubsub_topic)
        except (RemoteProtocolError, LocalProtocolError) as exc:
            reason = exc.reason if isinstance(exc, RemoteProtocolError) else "bad_topic"
            self._reject(reason, f"a push from {peer}: {exc}")
            return
        message_hash = message.hash(pubsub_topic)
        if not self._recent.add(message_hash):
            self.duplicates += 1
            return
        queues = self._subscribers.get((pubsub_topic, message.content_topic))
        if not queues:
            self._reject("unwanted", f"a push from {peer} on {message.content_topic[:100]}")
            return
        self.received += 1
        if self.drop_rate and self._rng.random() < self.drop_rate:
            self.randomly_dropped += 1
            return
        for queue in queues:
            queue.put_nowait(Received(message.payload, message_hash))

    def _reject(self, reason: str, detail: str) -> None:
        # The first of each reason at WARNING, the rest at DEBUG: a peer cannot flood the log.
        level = logging.DEBUG if reason in self.rejected else logging.WARNING
        self.rejected[reason] += 1
        logger.log(level, "%s: dropped %s", self.peer_id[-8:], detail)

    # -------------------------------------------------------------- Filter

    async def _filter_forever(self) -> None:
        next_watch = self._clock()
        while True:
            now = self._clock()
            for action in self.plan.actions(now):
                task = asyncio.create_task(self._carry_out(action))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
            if now >= next_watch:
                await self._watch_connections(now)
                next_watch = now + self.timing.watch_interval_s
            wake_at = min(self.plan.next_due(), next_watch)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wake_at - self._clock())):
                    await self._wake.wait()

    async def _watch_connections(self, since: float) -> None:
        connected = set(await self.host.connected_peers())
        gone = [i for i in self.plan.subscribed() if self.services[i].peer_id not in connected]
        if gone:
            logger.info(
                "%s: lost the connection to %s: subscribing again",
                self.peer_id[-8:],
                ", ".join(self._name(i) for i in gone),
            )
            self.plan.disconnected(gone, since)

    async def _carry_out(self, action: FilterAction) -> None:
        request = functools.partial(self._request, action.service)
        name = self._name(action.service)
        try:
            if isinstance(action, Ping):
                await filter_request(request, name, FilterSubscribeType.SUBSCRIBER_PING)
            else:
                for pubsub_topic, content_topics in filter_requests(action.criteria):
                    await filter_request(
                        request, name, FilterSubscribeType.SUBSCRIBE, pubsub_topic, content_topics
                    )
            outcome = Outcome.OK
        except ServiceRefusedError as exc:
            lost = exc.status == _NOT_FOUND and isinstance(action, Ping)
            outcome = Outcome.NOT_SUBSCRIBED if lost else Outcome.FAILED
            (logger.info if lost else logger.warning)("%s: %s", self.peer_id[-8:], exc)
        except (OSError, RemoteProtocolError) as exc:
            outcome = Outcome.FAILED
            logger.info(
                "%s: %s with %s failed: %s",
                self.peer_id[-8:],
                action,
                self._name(action.service),
                exc,
            )
        except LocalProtocolError:
            return  # the host is closing
        self.plan.done(action, outcome, self._clock())
        self._wake.set()

    # -------------------------------------------------------------- requests

    async def _request(self, index: int, protocol_id: str, payload: bytes) -> bytes:
        return await self.host.request(
            self.services[index].address,
            protocol_id,
            payload,
            timeout_s=self.timing.request_timeout_s,
        )

    async def request(
        self,
        peer: str,
        protocol_id: str,
        payload: bytes,
        *,
        max_response_bytes: int = MAX_RPC_BYTES,
        timeout_s: float = 10.0,
    ) -> bytes:
        """The host's :meth:`~sdsync.transport.libp2p.Libp2pTransport.request` (a store
        query to a service, say)."""
        return await self.host.request(
            peer, protocol_id, payload, max_response_bytes=max_response_bytes, timeout_s=timeout_s
        )

    # -------------------------------------------------------------- peers

    @property
    def listen_addrs(self) -> list[str]:
        return self.host.listen_addrs

    async def connected_peers(self) -> list[str]:
        return await self.host.connected_peers()

    async def mesh_peers(self, topic: str) -> list[str]:
        """A light client's counterpart of a relay mesh: the services whose Filter
        subscription carries ``topic`` (what it hears ``topic`` through)."""
        criterion = self._criterion(topic)
        return [self.services[i].peer_id for i in self.plan.subscribed(criterion)]

    async def wait_for_mesh(self, topic: str, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` services hold our subscription to ``topic``; False on
        timeout."""
        deadline = self._clock() + timeout_s
        while len(await self.mesh_peers(topic)) < count:
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(_WAIT_POLL_S)
        return True

    def _name(self, index: int) -> str:
        return self.services[index].address

    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError("transport is closed")


async def _drain(queue: asyncio.Queue[Received | None]) -> AsyncIterator[Received]:
    """Items from ``queue`` until the ``None`` that close() puts in."""
    while (item := await queue.get()) is not None:
        yield item
    queue.put_nowait(None)  # stay ended for another reader


if TYPE_CHECKING:  # mypy holds the light client to the contract a chat is typed with
    _CONTRACT: type[WakuClient] = WakuLightTransport
