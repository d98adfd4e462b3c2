"""Relay's topics (11/WAKU2-RELAY, 51/WAKU2-RELAY-SHARDING): which pubsub topic carries
a content topic, and how a channel's topic becomes one.

Theory of operation
-------------------
Autosharding picks the pubsub topic of a content topic
``/<application>/<version>/<name>/<encoding>`` (optionally behind a generation ``/0``):
the shard is the big-endian uint64 of the last 8 bytes of sha256(application ‖ version)
modulo the cluster's shard count, and its pubsub topic ``/waku/2/rs/<cluster>/<shard>``.
Parsing a content topic says whose it is: ``remote=True`` for a peer's.
:class:`WakuRelayConfig` is a node's choice of cluster and of static or automatic
sharding, and routes an SDS channel's topic (on :func:`default_content_topic`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError

RELAY_PROTOCOL = "/vac/waku/relay/2.0.0"

#: The Waku Network (64/WAKU2-NETWORK): cluster 1, autosharded over 8 shards.
TWN_CLUSTER_ID = 1
TWN_SHARD_COUNT = 8


@dataclass(frozen=True, slots=True)
class ContentTopic:
    """A content topic ``/<application>/<version>/<name>/<encoding>``, parsed."""

    application: str
    version: str
    name: str
    encoding: str

    def shard(self, shard_count: int) -> int:
        """The shard autosharding puts this topic on, in a cluster of ``shard_count``."""
        if shard_count < 1:
            raise LocalProtocolError(f"a cluster needs at least one shard, not {shard_count}")
        digest = hashlib.sha256(self.application.encode() + self.version.encode()).digest()
        return int.from_bytes(digest[-8:], "big") % shard_count

    def pubsub_topic(self, cluster_id: int, shard_count: int) -> str:
        """The pubsub topic autosharding puts this topic on."""
        return shard_pubsub_topic(cluster_id, self.shard(shard_count))


SHARD_TOPIC_PREFIX = "/waku/2/rs/"
"""Every sharded pubsub topic starts so: ``/waku/2/rs/<cluster_id>/<shard>``."""


def shard_pubsub_topic(cluster_id: int, shard: int) -> str:
    """``/waku/2/rs/<cluster_id>/<shard>``."""
    if cluster_id < 0 or shard < 0:
        raise LocalProtocolError(f"no pubsub topic for cluster {cluster_id}, shard {shard}")
    return f"{SHARD_TOPIC_PREFIX}{cluster_id}/{shard}"


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def parse_content_topic(topic: str, *, remote: bool = False) -> ContentTopic:
    """``topic`` parsed: LocalProtocolError if it is malformed, RemoteProtocolError
    (``MALFORMED_CONTENT_TOPIC``) instead if a peer sent it (``remote=True``)."""
    parts = topic.split("/")
    if len(parts) == 6 and parts[1] == "0":  # the optional generation, only 0 so far
        del parts[1]
    # A lone surrogate has no UTF-8 form: no hash, no shard, no place on the wire.
    if len(parts) != 5 or parts[0] or not all(parts[1:]) or not _utf8(topic):
        problem = f"content topic {topic[:100]!r} is not /application/version/name/encoding"
        if remote:
            raise RemoteProtocolError(problem, reason=RejectReason.MALFORMED_CONTENT_TOPIC)
        raise LocalProtocolError(problem)
    return ContentTopic(*parts[1:])


def default_content_topic(pubsub_topic: str) -> str:
    """``/sds/1/<channel>`` → ``/sds/1/<channel>/proto`` (app, version, name, encoding): the
    content topic a Waku transport carries a channel's topic on."""
    return pubsub_topic.rstrip("/") + "/proto"


@dataclass(frozen=True, slots=True)
class WakuRelayConfig:
    """Which Waku cluster a Waku node (:class:`~sdsync.transport.libp2p.Libp2pTransport`)
    relays on, and how content topics map to shards — all on ``shard`` (static sharding),
    or autosharded over ``shard_count`` shards when ``shard`` is None (The Waku Network:
    cluster 1, 8)."""

    cluster_id: int = TWN_CLUSTER_ID
    shard: int | None = None
    shard_count: int = TWN_SHARD_COUNT

    def __post_init__(self) -> None:
        if self.cluster_id < 0 or self.shard_count < 1:
            raise LocalProtocolError(f"no cluster {self.cluster_id} of {self.shard_count} shards")
        if self.shard is not None and self.shard < 0:
            raise LocalProtocolError(f"no shard {self.shard}")

    def pubsub_topic(self, content_topic: str) -> str:
        """The pubsub topic ``/waku/2/rs/<cluster>/<shard>`` that carries ``content_topic``."""
        if self.shard is not None:
            parse_content_topic(content_topic)  # well-formed all the same
            return shard_pubsub_topic(self.cluster_id, self.shard)
        return parse_content_topic(content_topic).pubsub_topic(self.cluster_id, self.shard_count)

    def route(
        self, topic: str, content_topic: Callable[[str], str] = default_content_topic
    ) -> tuple[str, str | None]:
        """The pubsub topic that carries a caller's ``topic``, and the content topic its
        subscribers want (None: every one, for a ``/waku/2/rs/...`` topic itself)."""
        if topic.startswith(SHARD_TOPIC_PREFIX):
            return topic, None
        content = content_topic(topic)
        return self.pubsub_topic(content), content
