"""What a Store Sync responder lets a peer do: which windows it serves, what it archives.

Theory of operation
-------------------
Store Sync is how store nodes federate, and by default it needs no token; so everything a
session may write must be bounded by the protocol, not by trust in the peer:

* **The window** is the recent past a periodic round covers: it may end no later than
  ``now + clock_skew_s`` and start no earlier than ``now - (window_s + lag_s +
  window_margin_s)``. Older data is what Store Resume reads through the REST API.
* **What may be pushed** is what the reconciliation found we lack — but the initiator
  chose those items, so each pushed message is checked again: it is one of them (by hash,
  recomputed from its content), its own timestamp is the one claimed for that item and
  lies inside the window, its pubsub topic is one this node archives (the configured
  ``pubsub_topics``; with none configured, a topic the archive already holds — a peer can
  add to a conversation the node keeps, never start a new one), and it is accepted at
  most once, within a byte budget per session.

A peer that passes every check can still write messages the node would also have taken
from the relay: recent ones, on topics it archives. Setting a sync ``token`` (shared by the
federation) limits even that to peers that hold it. See docs/store.md, "Security".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sdsync.store.sync.config import NS, SyncConfig
from sdsync.waku.messages import StoredMessage


class SyncRefused(Exception):  # noqa: N818 -- a refusal, not a failure of ours
    """A request the sync policy does not allow; ``reason`` is a short metrics label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def check_window(config: SyncConfig, window: tuple[int, int], now_ns: int) -> None:
    """Refuse a window outside the recent past this node syncs."""
    start, end = window
    latest = now_ns + round(config.clock_skew_s * NS)
    earliest = now_ns - round((config.window_s + config.lag_s + config.window_margin_s) * NS)
    if end > latest:
        raise SyncRefused("window_in_future", "the window ends in the future")
    if start < earliest:
        raise SyncRefused(
            "window_too_old",
            f"this node syncs the last {config.window_s:g} s (window starts at {earliest} at"
            " the earliest); use the REST API (Store Resume) for older messages",
        )


def check_pushed(
    messages: Iterable[StoredMessage],
    wanted: Mapping[bytes, int],
    window: tuple[int, int],
    archived_topic: Mapping[str, bool],
    *,
    configured: bool,
) -> None:
    """Refuse a batch with any message the session may not archive.

    ``wanted`` maps the hashes still expected to the timestamps claimed for them;
    ``archived_topic`` says, per pubsub topic of the batch, whether this node archives it;
    ``configured``: whether its topics were given (else they are those it holds).
    """
    start, end = window
    for message in messages:
        claimed = wanted.get(message.message_hash)
        if claimed is None:
            raise SyncRefused(
                "not_wanted",
                f"message {message.message_hash.hex()} was not found missing (or came already)",
            )
        if message.timestamp != claimed or not start <= message.timestamp < end:
            raise SyncRefused(
                "timestamp_mismatch",
                f"message {message.message_hash.hex()} has timestamp {message.timestamp},"
                f" not the {claimed} its item claimed inside the window",
            )
        if not archived_topic.get(message.pubsub_topic, False):
            raise SyncRefused("topic_not_archived", _not_archived(message.pubsub_topic, configured))


def _not_archived(topic: str, configured: bool) -> str:
    # Read by the peer's operator, who may run either node: say how either side gets there.
    rule = (
        "it takes pushes only on its --pubsub-topic and --relay-shard topics"
        if configured
        else "with no --pubsub-topic it takes pushes only on topics it holds already"
        " (a peer may add to a conversation it keeps, not start one)"
    )
    return (
        f"this node does not archive pubsub topic {topic!r}: {rule}; start it with"
        f" --pubsub-topic {topic}, or let it pull: run `sdsync store sync` on its side"
    )
