"""12/WAKU2-FILTER v2, the service side, sans-I/O: who is subscribed to what.

Theory of operation
-------------------
A light node subscribes over ``/vac/waku/filter-subscribe/2.0.0-beta1`` — one
FilterSubscribeRequest, one FilterSubscribeResponse — and the service node pushes every
matching message to it over ``/vac/waku/filter-push/2.0.0-beta1``.  A
:class:`FilterSubscriptions` table holds the state and makes every decision; it never
touches a socket or a clock (the caller passes ``now``, monotonic seconds).  The node
(:mod:`sdsync.store.light_clients`) does the I/O: it hands each request's bytes to
:func:`answer_filter_subscribe` and sends back the bytes it returns, asks
:meth:`FilterSubscriptions.subscribers` who gets each message, pushes, and reports each
push's outcome back.

A subscription is a set of *criteria*, (pubsub topic, content topic) pairs, per peer.
The requests, as nwaku answers them:

* ``SUBSCRIBE`` adds criteria: 200; 400 without a pubsub topic or content topics, with
  more than ``max_content_topics_per_request`` of them, a malformed one, or a pair the
  node does not serve (it would never see those messages); 503 when the node has
  ``max_peers`` subscribers or the peer would pass ``max_criteria_per_peer``;
* ``UNSUBSCRIBE`` removes criteria (those it names that the peer had), ``UNSUBSCRIBE_ALL``
  every one: 200, or 404 for a peer without a subscription;
* ``SUBSCRIBER_PING``: 200 if the peer has a subscription, else 404.

Every request of a subscribed peer renews its subscription; one not renewed for
``subscription_ttl_s`` (nwaku: 5 minutes; js-waku pings every minute) expires.  A peer
that ``max_push_failures`` pushes in a row could not reach is dropped: a light node that
went away without unsubscribing costs at most that many failed pushes; one that does not
speak the push protocol at all is dropped at once (:meth:`FilterSubscriptions.drop`).  A message is
offered once: the table remembers the hashes of the last ``recent_messages`` messages it
handed out, so one heard twice (relayed back after a LightPush, say) is not pushed twice.

The table is shared fairly between the *hosts* (IP addresses) its subscribers connect
from, since a peer id costs nothing (issue 27: fresh identities from one host filled it
and locked every honest subscriber out):

* a host holds at most ``max_peers_per_host`` subscriptions; one more is 503
  (``too_many_subscribers_per_host``);
* when the table is full, a subscriber from a host holding fewer subscriptions than the
  largest host takes the place of that host's stalest subscriber (the one renewed
  longest ago), which is dropped (reason ``fair_share``); only when no host holds more
  than the newcomer's would after joining is it refused (503, ``too_many_subscribers``);
* liveness: the caller reports who is connected (:meth:`FilterSubscriptions.connected`);
  a subscriber not connected for more than ``disconnect_grace_s`` is dropped
  (``disconnected``), so subscriptions do not outlive their peers by the 5-minute TTL.

Each subscription the table drops by itself is reported to ``on_drop(peer, reason)``
(``expired``, ``fair_share``, ``disconnected``) for the caller to count.

A request that does not parse is answered 400 with an empty request id; each refusal is
counted by the caller under a fixed ``reason`` word.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import IntEnum

from sdsync.errors import RemoteProtocolError
from sdsync.waku.filter.rpc import (
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
)
from sdsync.waku.relay.topics import parse_content_topic
from sdsync.waku.rpc import Refused

logger = logging.getLogger("sdsync.waku.filter.service")

Criterion = tuple[str, str]
"""(pubsub topic, content topic)."""


class FilterStatus(IntEnum):
    """Status codes of FilterSubscribeResponse (nwaku's)."""

    OK = 200
    BAD_REQUEST = 400
    NOT_FOUND = 404
    SERVICE_UNAVAILABLE = 503


@dataclass(frozen=True, slots=True)
class FilterLimits:
    """Bounds of the Filter service; the defaults are nwaku's."""

    max_peers: int = 1000
    max_criteria_per_peer: int = 1000
    max_content_topics_per_request: int = 100
    subscription_ttl_s: float = 300.0
    max_push_failures: int = 3
    recent_messages: int = 4096
    max_peers_per_host: int = 100
    """Not nwaku's (its colocation limit bounds connections per IP, 5 by default): a
    tenth of ``max_peers``, so filling the table takes ten hosts, and many light clients
    behind one NAT (or on one test machine) are still served."""
    disconnect_grace_s: float = 30.0
    """How long a subscriber may stay disconnected (to reconnect) before it is dropped."""


class FilterRefused(Refused[FilterStatus]):
    """A filter request answered with ``status``."""


@dataclass(slots=True)
class _Subscriber:
    criteria: set[Criterion]
    renewed: float
    host: str
    failures: int = 0
    absent_since: float | None = None


def _ignore_drop(peer: str, reason: str) -> None:
    """The default ``on_drop``: nobody counts."""


@dataclass
class FilterSubscriptions:
    """Subscribers and their criteria; ``serves(pubsub_topic, content_topic)`` says
    which messages the node sees at all."""

    serves: Callable[[str, str], bool]
    limits: FilterLimits = field(default_factory=FilterLimits)
    on_drop: Callable[[str, str], None] = _ignore_drop
    _peers: dict[str, _Subscriber] = field(default_factory=dict)
    _per_host: Counter[str] = field(default_factory=Counter)
    _recent: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer: object) -> bool:
        """Has ``peer`` a subscription?"""
        return peer in self._peers

    def criteria(self, peer: str) -> set[Criterion]:
        subscriber = self._peers.get(peer)
        return set(subscriber.criteria) if subscriber else set()

    def per_host(self) -> dict[str, int]:
        """How many subscribers each host has."""
        return dict(self._per_host)

    # -- requests

    def answer(
        self, peer: str, request: FilterSubscribeRequest, now: float, *, host: str | None = None
    ) -> None:
        """Apply ``request`` of ``peer``, which connects from ``host`` (its IP address;
        None: unknown, the peer counts as a host of its own); raises
        :class:`FilterRefused` unless it is 200."""
        self.expire(now)
        kind = request.filter_subscribe_type
        if kind is FilterSubscribeType.SUBSCRIBE:
            self._subscribe(peer, host or peer, self._criteria(request), now)
            return
        subscriber = self._peers.get(peer)
        if subscriber is None:
            raise FilterRefused(FilterStatus.NOT_FOUND, "not_subscribed", "no subscription")
        subscriber.renewed = now
        if kind is FilterSubscribeType.UNSUBSCRIBE:
            subscriber.criteria -= self._criteria(request, check_served=False)
            if not subscriber.criteria:
                self._remove(peer)
        elif kind is FilterSubscribeType.UNSUBSCRIBE_ALL:
            self._remove(peer)

    def _criteria(
        self, request: FilterSubscribeRequest, *, check_served: bool = True
    ) -> set[Criterion]:
        topic, content_topics = request.pubsub_topic, request.content_topics
        if not topic or not content_topics:
            raise FilterRefused(
                FilterStatus.BAD_REQUEST,
                "missing_topics",
                "a pubsub topic and content topics are required",
            )
        if len(content_topics) > self.limits.max_content_topics_per_request:
            raise FilterRefused(
                FilterStatus.BAD_REQUEST,
                "too_many_content_topics",
                f"{len(content_topics)} content topics; at most "
                f"{self.limits.max_content_topics_per_request} per request",
            )
        for content_topic in content_topics:
            try:
                parse_content_topic(content_topic, remote=True)
            except RemoteProtocolError as exc:
                raise FilterRefused(
                    FilterStatus.BAD_REQUEST, "malformed_content_topic", str(exc)
                ) from None
            if check_served and not self.serves(topic, content_topic):
                raise FilterRefused(
                    FilterStatus.BAD_REQUEST,
                    "unsupported_topic",
                    f"this node does not relay {content_topic[:100]} on {topic[:100]}",
                )
        return {(topic, content_topic) for content_topic in content_topics}

    def _subscribe(self, peer: str, host: str, criteria: set[Criterion], now: float) -> None:
        subscriber = self._peers.get(peer)
        held = subscriber.criteria if subscriber else set()
        if len(held | criteria) > self.limits.max_criteria_per_peer:
            raise FilterRefused(
                FilterStatus.SERVICE_UNAVAILABLE,
                "too_many_criteria",
                f"at most {self.limits.max_criteria_per_peer} criteria per subscriber",
            )
        if subscriber is not None:
            subscriber.criteria |= criteria
            subscriber.renewed = now
            return
        self._make_room(host)
        self._peers[peer] = _Subscriber(set(criteria), now, host)
        self._per_host[host] += 1

    def _make_room(self, host: str) -> None:
        """Refuse a new subscriber from ``host``, or drop one to make room for it."""
        if self._per_host[host] >= self.limits.max_peers_per_host:
            raise FilterRefused(
                FilterStatus.SERVICE_UNAVAILABLE,
                "too_many_subscribers_per_host",
                f"at most {self.limits.max_peers_per_host} subscribers per host",
            )
        if len(self._peers) < self.limits.max_peers:
            return
        largest, count = max(self._per_host.items(), key=lambda item: item[1])
        if count <= self._per_host[host] + 1:  # the newcomer's host would be as large
            raise FilterRefused(
                FilterStatus.SERVICE_UNAVAILABLE,
                "too_many_subscribers",
                f"this node serves {self.limits.max_peers} subscribers already",
            )
        stalest = min(
            (p for p, s in self._peers.items() if s.host == largest),
            key=lambda p: self._peers[p].renewed,
        )
        self._drop(stalest, "fair_share")

    def expire(self, now: float) -> list[str]:
        """Drop the subscriptions not renewed for ``subscription_ttl_s``; their peers."""
        stale = [
            peer
            for peer, subscriber in self._peers.items()
            if now - subscriber.renewed > self.limits.subscription_ttl_s
        ]
        for peer in stale:
            self._drop(peer, "expired")
        return stale

    def connected(self, peers: Collection[str], now: float) -> list[str]:
        """Note that exactly ``peers`` are connected at ``now``; drop the subscribers
        not connected for more than ``disconnect_grace_s``, and return them."""
        gone = []
        for peer, subscriber in self._peers.items():
            if peer in peers:
                subscriber.absent_since = None
            elif subscriber.absent_since is None:
                subscriber.absent_since = now
            elif now - subscriber.absent_since > self.limits.disconnect_grace_s:
                gone.append(peer)
        for peer in gone:
            self._drop(peer, "disconnected")
        return gone

    def _drop(self, peer: str, reason: str) -> None:
        self._remove(peer)
        self.on_drop(peer, reason)

    def _remove(self, peer: str) -> None:
        host = self._peers.pop(peer).host
        self._per_host[host] -= 1
        if not self._per_host[host]:
            del self._per_host[host]

    # -- messages

    def subscribers(
        self, pubsub_topic: str, content_topic: str, message_hash: bytes, now: float
    ) -> list[str]:
        """Who gets this message: the peers subscribed to its criterion, or nobody if it
        was offered before."""
        if message_hash in self._recent:
            return []
        self._recent[message_hash] = None
        if len(self._recent) > self.limits.recent_messages:
            self._recent.popitem(last=False)
        self.expire(now)
        wanted = (pubsub_topic, content_topic)
        return sorted(peer for peer, s in self._peers.items() if wanted in s.criteria)

    def push_succeeded(self, peer: str) -> None:
        subscriber = self._peers.get(peer)
        if subscriber is not None:
            subscriber.failures = 0

    def push_failed(self, peer: str) -> bool:
        """Count a push ``peer`` could not take; True if that dropped its subscription."""
        subscriber = self._peers.get(peer)
        if subscriber is None:
            return False
        subscriber.failures += 1
        if subscriber.failures < self.limits.max_push_failures:
            return False
        self._remove(peer)
        return True

    def drop(self, peer: str) -> bool:
        """Drop ``peer``'s subscription at once (it cannot take pushes at all); True if
        it had one."""
        if peer not in self._peers:
            return False
        self._remove(peer)
        return True


def answer_filter_subscribe(
    table: FilterSubscriptions,
    peer: str,
    request: bytes,
    now: float,
    refuse: Callable[[str], None],
    *,
    host: str | None = None,
) -> bytes:
    """The FilterSubscribeResponse bytes that answer the request bytes ``request`` of
    ``peer`` (from ``host``); ``refuse(reason)`` counts each answer that is not 200."""
    try:
        parsed = FilterSubscribeRequest.from_bytes(request)
    except RemoteProtocolError as exc:
        logger.warning("filter request from %s refused: %s", peer, exc)
        return _refused(
            refuse, "", FilterRefused(FilterStatus.BAD_REQUEST, "malformed_rpc", str(exc))
        )
    try:
        table.answer(peer, parsed, now, host=host)
    except FilterRefused as exc:
        logger.info("filter request from %s refused: %s", peer, exc)
        return _refused(refuse, parsed.request_id, exc)
    return FilterSubscribeResponse(
        request_id=parsed.request_id, status_code=int(FilterStatus.OK), status_desc="OK"
    ).to_bytes()


def _refused(refuse: Callable[[str], None], request_id: str, exc: FilterRefused) -> bytes:
    refuse(exc.reason)
    return FilterSubscribeResponse(
        request_id=request_id, status_code=int(exc.status), status_desc=exc.description
    ).to_bytes()
