"""The Waku protocols, a folder each, as nwaku keeps them; each holds its messages and
codec (``rpc.py``), its service where it has state or rules (``service.py``, sans-I/O),
and its client:

* ``relay/`` — relay's topics (autosharding, :class:`WakuRelayConfig`) and
  :class:`RelayTransport`, an SDS channel's bytes over any node's relay;
* ``store/`` — store query v3: queries, pages, the answering service and
  :class:`~sdsync.waku.store.client.WakuStoreClient`;
* ``lightpush/`` — LightPush v3 and 2.0.0-beta1: the service's checks and answers;
* ``filter/`` — Filter v2: the subscription table and answers;
* ``metadata/`` — the cluster and shards each side of a connection announces;
* ``sync/`` — Waku Sync (reconciliation and transfer) between store nodes.

Beside them, what all share: :mod:`~sdsync.waku.node`, the Waku node contract the
services and clients run on (declared once), :mod:`~sdsync.waku.rpc` (frames, RPC
values, refusals), :mod:`~sdsync.waku.messages` (the messages services keep, and their
checks) and :mod:`~sdsync.waku.ratelimit`.  They sit below the transport, which
implements the contract over py-libp2p, and above :mod:`sdsync.reconcile`, whose RBSR
the store nodes' own sync method reuses.
"""

from sdsync.waku.filter.rpc import (
    FilterSubscribeRequest,
    FilterSubscribeResponse,
    FilterSubscribeType,
    MessagePush,
)
from sdsync.waku.lightpush.rpc import (
    LightPushRequestV3,
    LightPushResponseV3,
    PushRequest,
    PushResponse,
    PushRpc,
)
from sdsync.waku.metadata.rpc import WakuMetadata
from sdsync.waku.relay.topics import (
    ContentTopic,
    WakuRelayConfig,
    parse_content_topic,
    shard_pubsub_topic,
)
from sdsync.waku.relay.transport import RelayTransport
from sdsync.waku.rpc import encode_frame, read_frame
from sdsync.waku.store.rpc import StoreQueryRequest, StoreQueryResponse, WakuMessageKeyValue

__all__ = [
    "ContentTopic",
    "FilterSubscribeRequest",
    "FilterSubscribeResponse",
    "FilterSubscribeType",
    "LightPushRequestV3",
    "LightPushResponseV3",
    "MessagePush",
    "PushRequest",
    "PushResponse",
    "PushRpc",
    "RelayTransport",
    "StoreQueryRequest",
    "StoreQueryResponse",
    "WakuMessageKeyValue",
    "WakuMetadata",
    "WakuRelayConfig",
    "encode_frame",
    "parse_content_topic",
    "read_frame",
    "shard_pubsub_topic",
]
