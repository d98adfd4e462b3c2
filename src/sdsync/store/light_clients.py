"""A store node's light-client services: LightPush and Filter on its Waku node.

Theory of operation
-------------------
A js-waku light node (a browser, ``createLightNode``) relays nothing: it publishes
through a service node's LightPush and receives through its Filter, and reads history
from its store.  :class:`LightClientServices` makes a store node that service node.  It is the
I/O around two sans-I/O parts:

* :mod:`sdsync.waku.lightpush.service` judges a pushed message and writes the answer; an
  accepted one is published on Waku relay as it is
  (:meth:`~sdsync.waku.node.WakuNode.publish_message`),
  archived as a relay message would be (counted under source ``lightpush``; our own
  relay subscription never hands our own publication back, so it is archived once;
  pushes that arrive during a write share the next transaction, and each is answered
  once its own is committed: :mod:`sdsync.store.ingest`), and offered to Filter;
* :mod:`sdsync.waku.filter.service` holds the subscriptions and answers subscribe requests;
  :meth:`LightClientServices.offer` asks it who gets a message — heard on relay or pushed —
  and pushes a MessagePush to each over ``/vac/waku/filter-push/2.0.0-beta1``.

Pushes to one subscriber go out in order, one at a time, each within
``push_timeout_s``; at most ``push_queue`` wait (more are dropped, counted, and logged
once per overflow, not once a push), so a slow subscriber holds up nobody else.  The
host writes them all on one long-lived stream per subscriber, its *push lane*
(:meth:`~sdsync.waku.node.WakuNode.push`; js-waku refuses a peer's 101st stream of a
protocol and then drops the connection, so a stream per push fails after 100), reopened when the
subscriber resets or closes it; a push whose write fails is retried once on a fresh
stream there, and only then fails here.  go-waku's Filter client, which reads one push
per stream and closes it, gets a stream per push instead: the host learns that per
peer (:mod:`sdsync.transport.libp2p_host`).  A failed push counts against the
subscriber (:meth:`~sdsync.waku.filter.service.FilterSubscriptions.push_failed`), which drops
it after ``max_push_failures`` in a row; a subscriber that does not speak the push
protocol at all (:class:`~sdsync.errors.ProtocolNotSupportedError`) is dropped at once.
A dropped subscription is logged and counted in
``sdsync_store_filter_subscriptions_dropped_total{reason}``, and the pushes still queued
for it under ``dropped``.  Every push is counted in
``sdsync_store_filter_pushes_total{outcome}`` (``sent``, ``failed``, ``dropped``), every
answered push in ``sdsync_store_lightpush_total{status}`` (a peer over its
``lightpush_rate``, a token bucket per peer id, gets 429 and reason ``rate_limited``; one
whose IP address is over ``lightpush_rate_per_ip``, which every identity seen from it
shares, ``rate_limited_ip``), and every refusal in
``sdsync_store_refused_total{route, reason}`` with the protocol id as ``route``.  Frames
that are truncated, too long or never sent are refused by the transport before they get
here, which bounds, times out, counts and summarises such streams (docs/network.md).

Filter is shared between hosts, not peer ids (:mod:`sdsync.waku.filter.service`): each
subscribe request is judged with the IP address the peer connects from
(:meth:`~sdsync.waku.node.WakuNode.peer_ip`), and every ``liveness_interval_s`` the
services tell the table who is connected
(:meth:`~sdsync.waku.node.WakuNode.connected_peers`), so a subscriber whose
connection is gone is dropped within ``disconnect_grace_s`` plus one interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sdsync.errors import LocalProtocolError, ProtocolNotSupportedError, RemoteProtocolError
from sdsync.store.ingest import GroupCommit
from sdsync.store.served import ServedNode
from sdsync.waku.filter.rpc import FILTER_PUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL, MessagePush
from sdsync.waku.filter.service import FilterLimits, FilterSubscriptions, answer_filter_subscribe
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL, LIGHTPUSH_V2_PROTOCOL
from sdsync.waku.lightpush.service import (
    LightPushRefused,
    LightPushStatus,
    Push,
    ServedTopics,
    answer_lightpush,
    answer_lightpush_v2,
)
from sdsync.waku.messages import StoredMessage
from sdsync.waku.node import WakuNode
from sdsync.waku.ratelimit import PeerBuckets, RateLimit
from sdsync.wire.waku import WakuMessage

logger = logging.getLogger("sdsync.store.light_clients")

DEFAULT_LIGHTPUSH_RATE = RateLimit(100, 20.0)
"""nwaku's per-peer LightPush rate (``--rate-limit lightpush:5/1s``) on average, over a
20 s window so that a chat's burst of up to 100 pushes passes."""
DEFAULT_LIGHTPUSH_RATE_PER_IP = RateLimit(200, 20.0)
"""What all the peers seen from one IP address (one IPv6 /64) may push together: two
peers' worth, so two light clients behind one NAT both get their rate, while a client that
takes a new identity at every refusal gains nothing (nwaku has no such bound; its
colocation limit of 5 connections per IP is the nearest)."""
_PUSH_REFUSALS = {"peer": "rate_limited", "table": "rate_limited", "address": "rate_limited_ip"}
LIGHT_PROTOCOLS = (LIGHTPUSH_PROTOCOL, LIGHTPUSH_V2_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL)
"""What :class:`LightClientServices` serves."""


@dataclass(frozen=True)
class LightClientConfig:
    """What the services serve and their bounds."""

    served: ServedTopics = field(default_factory=ServedTopics)
    filter: FilterLimits = field(default_factory=FilterLimits)
    push_timeout_s: float = 5.0
    push_queue: int = 256
    liveness_interval_s: float = 10.0
    """How often Filter subscribers are checked for a connection."""
    lightpush_rate: RateLimit | None = DEFAULT_LIGHTPUSH_RATE
    """Pushes one peer may make (None: no limit); more are answered 429."""
    lightpush_rate_per_ip: RateLimit | None = DEFAULT_LIGHTPUSH_RATE_PER_IP
    """Pushes all the peers of one IP address may make together (None: no such limit)."""


class LightClientServices:
    """LightPush (3.0.0 and 2.0.0-beta1) and Filter v2 for ``node`` on ``host``."""

    def __init__(
        self,
        node: ServedNode,
        host: WakuNode,
        config: LightClientConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.host = host
        self.config = config
        self.filters = FilterSubscriptions(
            config.served.serves, config.filter, on_drop=self._subscription_dropped
        )
        self._clock = clock
        self._queues: dict[str, deque[bytes]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._liveness: asyncio.Task[None] | None = None
        self._overflowing: set[str] = set()  # peers whose overflow was logged
        self._archive = GroupCommit(functools.partial(node.ingest, source="lightpush"))
        self._push_rates = PeerBuckets.of(config.lightpush_rate, config.lightpush_rate_per_ip)

    async def start(self) -> None:
        await self.host.serve(LIGHTPUSH_PROTOCOL, self._answer_lightpush)
        await self.host.serve(LIGHTPUSH_V2_PROTOCOL, self._answer_lightpush_v2)
        await self.host.serve(FILTER_SUBSCRIBE_PROTOCOL, self._answer_filter)
        self._liveness = asyncio.create_task(self._check_liveness(), name="filter-liveness")

    async def close(self) -> None:
        await self._archive.close()
        tasks = [*self._workers.values(), *([self._liveness] if self._liveness else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- what lightpush.PushService asks of us

    @property
    def served(self) -> ServedTopics:
        return self.config.served

    def now_ns(self) -> int:
        return self.node.now_ns()

    @property
    def max_future_ns(self) -> int:
        return self.node.max_future_ns

    def refuse(self, route: str, reason: str) -> None:
        self.node.metrics.refuse(route, reason)

    async def accept(self, push: Push) -> int:
        """Relay, archive and offer to Filter; the relay peers it went to."""
        peers = 0
        try:
            peers = len(await self.host.mesh_peers(push.pubsub_topic))
            await self.host.publish_message(push.pubsub_topic, push.message)
        except LocalProtocolError as exc:  # the host is closing
            logger.warning("could not relay a pushed message: %s", exc)
            peers = 0
        if not push.message.ephemeral and not await self._archive.submit(
            StoredMessage.of(push.pubsub_topic, push.message)
        ):
            # Our 200 says the message is kept, so not even relay peers make up for the
            # archive: the client tries again, and relay drops the copy by its hash.
            raise LightPushRefused(
                LightPushStatus.SERVICE_UNAVAILABLE,
                "archive_unavailable",
                "the archive failed; try again",
            )
        subscribers = self.offer(push.pubsub_topic, push.message)
        if peers or subscribers or not push.message.ephemeral:
            return peers
        raise LightPushRefused(LightPushStatus.NO_PEERS, "no_peers", "no relay peers available")

    def answered(self, status: LightPushStatus) -> None:
        self.node.metrics.lightpushes.labels(status=str(int(status))).inc()

    async def admit(self, peer: str) -> str | None:
        rates = self._push_rates
        if rates is None:
            return None
        address = await self.host.peer_ip(peer) if rates.per_address is not None else None
        refusal = rates.refusal(peer, self._clock(), address=address)
        return None if refusal is None else _PUSH_REFUSALS[refusal]

    # -- handlers

    async def _answer_lightpush(self, peer: str, request: bytes) -> bytes:
        return await answer_lightpush(self, LIGHTPUSH_PROTOCOL, request, peer=peer)

    async def _answer_lightpush_v2(self, peer: str, request: bytes) -> bytes:
        return await answer_lightpush_v2(self, LIGHTPUSH_V2_PROTOCOL, request, peer=peer)

    async def _answer_filter(self, peer: str, request: bytes) -> bytes:
        def refuse(reason: str) -> None:
            self.refuse(FILTER_SUBSCRIBE_PROTOCOL, reason)

        host = await self.host.peer_ip(peer)
        return answer_filter_subscribe(
            self.filters, peer, request, self._clock(), refuse, host=host
        )

    # -- Filter liveness

    async def _check_liveness(self) -> None:
        while True:
            await asyncio.sleep(self.config.liveness_interval_s)
            try:
                connected = set(await self.host.connected_peers())
            except LocalProtocolError:  # the host is closing
                return
            self.filters.connected(connected, self._clock())

    def _subscription_dropped(self, peer: str, reason: str) -> None:
        self.node.metrics.filter_drops.labels(reason=reason).inc()
        logger.info("filter subscription of %s dropped (%s)", peer, reason)

    # -- Filter pushes

    def offer(self, pubsub_topic: str, message: WakuMessage) -> int:
        """Push ``message`` to its Filter subscribers; how many there are."""
        peers = self.filters.subscribers(
            pubsub_topic, message.content_topic, message.hash(pubsub_topic), self._clock()
        )
        if peers:
            frame = MessagePush(waku_message=message, pubsub_topic=pubsub_topic).to_bytes()
            for peer in peers:
                self._enqueue(peer, frame)
        return len(peers)

    def _enqueue(self, peer: str, frame: bytes) -> None:
        queue = self._queues.setdefault(peer, deque())
        if len(queue) >= self.config.push_queue:
            self.node.metrics.filter_pushes.labels(outcome="dropped").inc()
            if peer not in self._overflowing:
                self._overflowing.add(peer)
                logger.warning(
                    "filter subscriber %s is %d pushes behind: dropping pushes until it catches up",
                    peer,
                    len(queue),
                )
            return
        queue.append(frame)
        if peer not in self._workers:
            self._workers[peer] = asyncio.create_task(self._drain(peer), name=f"filter-push {peer}")

    async def _drain(self, peer: str) -> None:
        """Push ``peer``'s queue in order until it is empty or the peer is dropped."""
        queue = self._queues[peer]
        pushes = self.node.metrics.filter_pushes
        try:
            while queue:
                if await self._push(peer, queue[0]):
                    pushes.labels(outcome="sent").inc()
                    queue.popleft()
                    continue
                pushes.labels(outcome="failed").inc()
                queue.popleft()
                if peer not in self.filters:
                    pushes.labels(outcome="dropped").inc(len(queue))
                    return
        finally:
            del self._workers[peer]
            del self._queues[peer]
            self._overflowing.discard(peer)

    async def _push(self, peer: str, frame: bytes) -> bool:
        """One push to ``peer``; False if it failed (counted against the subscriber,
        whose subscription may be dropped for it)."""
        try:
            await self.host.push(
                peer, FILTER_PUSH_PROTOCOL, frame, timeout_s=self.config.push_timeout_s
            )
        except ProtocolNotSupportedError as exc:
            self._dropped(peer, "no_push_protocol", self.filters.drop(peer), exc)
            return False
        except (OSError, TimeoutError, RemoteProtocolError, LocalProtocolError) as exc:
            dropped = self.filters.push_failed(peer)
            if dropped:
                self._dropped(peer, "push_failures", dropped, exc)
            else:
                logger.info("filter push to %s failed: %s", peer, exc)
            return False
        self.filters.push_succeeded(peer)
        return True

    def _dropped(self, peer: str, reason: str, dropped: bool, why: Exception) -> None:
        if not dropped:
            return
        self.node.metrics.filter_drops.labels(reason=reason).inc()
        logger.warning("filter subscription of %s dropped (%s): %s", peer, reason, why)
