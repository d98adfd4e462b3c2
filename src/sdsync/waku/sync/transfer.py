"""What a message pushed over ``/vac/waku/transfer/1.0.0`` must be to be archived.

Theory of operation
-------------------
After a reconciliation each side pushes the messages the other lacks, one
:class:`~sdsync.waku.sync.codec.WakuMessageAndTopic` frame each, on a long-lived stream
(nwaku keeps one per peer). nwaku archives whatever arrives there. Here a pushed message
passes every check a relayed one passes, and one more (:func:`admit`):

* it decodes under the size bound of a relayed message, and is not ephemeral;
* its pubsub topic is one this node syncs (the topics it archives from the relay);
* its topics can be stored, and its timestamp is present, positive, and not ahead of
  our clock by more than the relay allows (:func:`~sdsync.wire.waku.check_relayable`);
* its hash is computed here, from the message, never taken from the peer;
* it was *expected from this peer*: the reconciliation found we lack that hash and the
  peer claimed its timestamp (:class:`Expected`), or a reconciliation with the peer is
  running now and the timestamp lies in its window (nwaku pushes as soon as it finds a
  difference, which may be before our side of the exchange has found the same one).

So a sync peer can bring nothing a relay peer could not: recent messages, on topics we
archive. A refusal drops the message and is counted by reason; it does not break the
stream (nwaku would lose the messages queued behind it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping

from sdsync.errors import RemoteProtocolError
from sdsync.waku.node import Envelope
from sdsync.waku.sync.codec import WakuMessageAndTopic
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES, check_relayable


class TransferRefused(RemoteProtocolError):  # noqa: N818 -- a refusal, not a failure
    """A pushed message this node does not archive; ``reason`` is a short fixed label."""

    def __init__(self, label: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = label


class Expected:
    """Per peer, the hashes a reconciliation showed we lack, with the timestamps the peer
    claimed, each until ``ttl_ns`` after it was found; at most ``max_per_peer`` per peer
    (the oldest forgotten first)."""

    def __init__(self, ttl_ns: int, max_per_peer: int) -> None:
        self.ttl_ns = ttl_ns
        self.max_per_peer = max_per_peer
        self._peers: dict[str, OrderedDict[bytes, tuple[int, int]]] = {}

    def add(self, peer: str, wanted: Mapping[bytes, int], now_ns: int) -> None:
        table = self._peers.setdefault(peer, OrderedDict())
        until = now_ns + self.ttl_ns
        for message_hash, timestamp in wanted.items():
            table[message_hash] = (timestamp, until)
            table.move_to_end(message_hash)
        while len(table) > self.max_per_peer:
            table.popitem(last=False)

    def take(self, peer: str, message_hash: bytes, now_ns: int) -> int | None:
        """The timestamp claimed for ``message_hash`` by ``peer`` (forgotten now), or None."""
        table = self._peers.get(peer)
        entry = None if table is None else table.pop(message_hash, None)
        if table is not None and not table:
            del self._peers[peer]
        if entry is None or entry[1] < now_ns:
            return None
        return entry[0]

    def prune(self, now_ns: int) -> None:
        for peer in list(self._peers):
            table = self._peers[peer]
            for message_hash in [h for h, (_, until) in table.items() if until < now_ns]:
                del table[message_hash]
            if not table:
                del self._peers[peer]

    def __len__(self) -> int:
        return sum(len(t) for t in self._peers.values())


def admit(
    frame: bytes,
    peer: str,
    *,
    topics: Collection[str],
    expected: Expected,
    running_window: tuple[int, int] | None,
    now_ns: int,
    max_future_ns: int,
    max_message_bytes: int = MAX_WAKU_MESSAGE_BYTES,
) -> Envelope:
    """The message of ``frame`` pushed by ``peer`` if this node archives it (see the
    module); raises :class:`TransferRefused`, or RemoteProtocolError for a malformed
    frame. ``running_window`` is that of a reconciliation with ``peer`` running now."""
    pushed = WakuMessageAndTopic.from_bytes(frame, max_message_bytes=max_message_bytes)
    message, pubsub_topic = pushed.message, pushed.pubsub_topic
    if message.ephemeral:
        raise TransferRefused("ephemeral", "an ephemeral message is never archived")
    if pubsub_topic not in topics:
        raise TransferRefused(
            "topic_not_synced", f"this node does not sync pubsub topic {pubsub_topic[:200]!r}"
        )
    check_relayable(message, pubsub_topic, now_ns, max_future_ns)
    assert message.timestamp is not None  # check_relayable refuses a message without one
    message_hash = message.hash(pubsub_topic)
    claimed = expected.take(peer, message_hash, now_ns)
    if claimed is None:
        low, high = running_window if running_window is not None else (1, 0)
        if not low <= message.timestamp <= high:
            raise TransferRefused(
                "not_expected",
                f"message {message_hash.hex()} was not found missing in a reconciliation"
                " with this peer",
            )
    elif claimed != message.timestamp:
        raise TransferRefused(
            "timestamp_mismatch",
            f"message {message_hash.hex()} has timestamp {message.timestamp}, not the"
            f" {claimed} claimed for it",
        )
    return Envelope(pubsub_topic, message, message_hash)
