"""Waku Sync (nwaku's ``waku_store_sync``): store nodes reconcile a recent window of their
archives over libp2p and push each other what the other lacks, byte-compatible with nwaku.

* :mod:`~sdsync.waku.sync.codec` — the payloads of ``/vac/waku/reconciliation/1.0.0``
  and the frames of ``/vac/waku/transfer/1.0.0``;
* :mod:`~sdsync.waku.sync.index` — a session's snapshot: ranges and XOR fingerprints;
* :mod:`~sdsync.waku.sync.reconciliation` — one side of one exchange, sans-I/O;
* :mod:`~sdsync.waku.sync.rbsr` — between two sdsync nodes, RBSR in place of XOR ranges;
* :mod:`~sdsync.waku.sync.transfer` — what a pushed message must be to be archived;
* :mod:`~sdsync.waku.sync.service` — :class:`WakuSync` on a node: rounds, sessions,
  transfers, bounds.

docs/store.md ("With nwaku") tells an operator what is compatible and what is not.
"""

from sdsync.waku.sync.codec import (
    RECONCILIATION_PROTOCOL,
    TRANSFER_PROTOCOL,
    ItemSet,
    Range,
    RangesData,
    RangeType,
    SyncId,
    WakuMessageAndTopic,
    decode_ranges,
    encode_ranges,
)
from sdsync.waku.sync.index import ItemRows, SyncIndex
from sdsync.waku.sync.rbsr import RBSR_PROTOCOL, RbsrReconciler
from sdsync.waku.sync.reconciliation import Reconciler, Topics
from sdsync.waku.sync.service import (
    RoundReport,
    SnapshotTooLarge,
    SyncArchive,
    WakuSync,
    WakuSyncConfig,
)

__all__ = [
    "RBSR_PROTOCOL",
    "RECONCILIATION_PROTOCOL",
    "TRANSFER_PROTOCOL",
    "ItemRows",
    "ItemSet",
    "Range",
    "RangeType",
    "RangesData",
    "RbsrReconciler",
    "Reconciler",
    "RoundReport",
    "SnapshotTooLarge",
    "SyncArchive",
    "SyncId",
    "SyncIndex",
    "Topics",
    "WakuMessageAndTopic",
    "WakuSync",
    "WakuSyncConfig",
    "decode_ranges",
    "encode_ranges",
]
