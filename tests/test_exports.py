"""The public API, pinned: what each package's ``__init__`` exports (as trio's test_exports).

A name added, renamed or removed fails here first, so an API change is a decision made in
this file, not an accident of a refactor. Every exported name must also exist.
"""

from __future__ import annotations

import importlib

import pytest

EXPORTS: dict[str, frozenset[str]] = {
    "sdsync": frozenset(
        {
            "BloomParams",
            "ChannelConfig",
            "Event",
            "HistoryEntry",
            "HistoryStore",
            "LocalProtocolError",
            "Message",
            "MessageChannel",
            "MessageKind",
            "RejectReason",
            "ReliabilityManager",
            "RemoteProtocolError",
            "RepairConfig",
            "SdsError",
            "UnwrapResult",
            "WireLimits",
            "__version__",
            "decode",
            "encode",
        }
    ),
    "sdsync.core": frozenset(
        {
            "BloomFilter",
            "BloomParams",
            "ChannelConfig",
            "ChannelSnapshot",
            "ChannelStats",
            "DropReason",
            "EphemeralReceived",
            "Event",
            "HistoryStore",
            "IncomingSweep",
            "Journal",
            "LocalLog",
            "LogEntry",
            "MemoryHistoryStore",
            "MemoryWireStore",
            "MessageAcknowledged",
            "MessageChannel",
            "MessageDelivered",
            "MessageDeliveredEarly",
            "MessageDropped",
            "MessageEvicted",
            "MessageIdScheme",
            "MessageLost",
            "MessageMissing",
            "MessageMissingEvicted",
            "MessagePossiblyAcknowledged",
            "MessageReceived",
            "MessageSent",
            "MissingDependency",
            "Outgoing",
            "OutgoingEntry",
            "OutgoingState",
            "OutgoingSweep",
            "OwnLogPolicy",
            "RepairConfig",
            "RepairRequestReceived",
            "RepairRequestSent",
            "RepairResponseSent",
            "RepairSweep",
            "RollingBloomFilter",
            "SendFailed",
            "StoredIncoming",
            "StoredOutgoing",
            "SyncReceived",
            "SyncSent",
            "SyncStatus",
            "WireStore",
        }
    ),
    "sdsync.wire": frozenset(
        {
            "DEFAULT_LIMITS",
            "HistoryEntry",
            "Message",
            "MessageKind",
            "WakuMessage",
            "WireLimits",
            "classify",
            "decode",
            "decode_waku_message",
            "encode",
            "message_hash",
            "message_id_for",
            "message_id_for_sender",
        }
    ),
    # The Waku protocols' messages moved here from sdsync.wire (issue 36: a folder per
    # protocol); sdsync.wire keeps the SDS codec and the WakuMessage envelope.
    "sdsync.waku": frozenset(
        {
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
        }
    ),
    "sdsync.runtime": frozenset(
        {
            "system_clock_ms",
            "CatchUp",
            "ChannelDriver",
            "ChannelState",
            "Delivery",
            "EventLimits",
            "EventsDiscarded",
            "LogRecord",
            "OwnMessage",
            "PROFILES",
            "PeriodicSync",
            "Profile",
            "Published",
            "QueryStore",
            "ReliabilityManager",
            "ReliableChannel",
            "RuntimeConfig",
            "SqliteHistoryStore",
            "Step",
            "StoreClient",
            "Transmit",
            "UnwrapResult",
            "WaitingMessage",
            "Wrapped",
            "profile",
            "state_path",
        }
    ),
    "sdsync.chat": frozenset(
        {
            "ChatOptions",
            "ChatSession",
            "DEFAULT_LISTEN",
            "Identity",
            "Line",
            "load_identity",
            "run_chat",
            "save_identity",
        }
    ),
    "sdsync.demo": frozenset(
        {
            "FullDemo",
            "InvalidScenarioError",
            "OFFLINE_MS",
            "OUTAGE_MS",
            "QuickDemo",
            "demo_scenario",
            "run_full_demo",
            "run_quick_demo",
            "run_simulation",
        }
    ),
    "sdsync.peer": frozenset({"PeerSession", "serve"}),
    "sdsync.reliability": frozenset(
        {"EventHub", "ReliabilityServer", "ReliabilityService", "TokenCheck", "request_limit"}
    ),
    # The in-memory network and Waku node are test doubles: sdsync.testing.memory (issue 36).
    "sdsync.transport": frozenset(
        {
            "Envelope",
            "Libp2pNode",
            "Libp2pTransport",
            "Received",
            "Transport",
            "WakuClient",
            "WakuCounters",
            "WakuHost",
            "WakuLightTransport",
            "WakuNode",
            "WakuRelayConfig",
            "WakuRequester",
        }
    ),
    "sdsync.store": frozenset(
        {
            "RelayOptions",
            "run_node",
            "Archive",
            "ArchiveUnavailable",
            "DEFAULT_PAGE_SIZE",
            "ExportReport",
            "HttpStoreClient",
            "MAX_PAGE_SIZE",
            "NodeConfig",
            "Page",
            "QueryError",
            "RetentionPolicy",
            "SqlArchive",
            "StatusCode",
            "StoreNode",
            "StoreQuery",
            "StoreUnavailableError",
            "StoredMessage",
            "WakuStoreClient",
            "answer_store_query",
            "export_parquet",
            "open_archive",
            "serve",
        }
    ),
    "sdsync.store.sync": frozenset(
        {
            "ArchiveKeeper",
            "PREFIX",
            "PeriodicSync",
            "SessionTable",
            "SyncConfig",
            "ArchiveNode",
            "SyncReport",
            "SyncUnsupportedError",
            "responder_app",
            "sync_with_peer",
        }
    ),
    "sdsync.reconcile": frozenset(
        {
            "Bound",
            "DEFAULT_MAX_FRAME_SIZE",
            "EMPTY_FINGERPRINT",
            "FINGERPRINT_SIZE",
            "FULL_WINDOW",
            "HASH_SIZE",
            "INFINITY",
            "METHODS",
            "Item",
            "ItemStore",
            "MemoryItemStore",
            "Method",
            "PROLLY_VERSION",
            "ProllyParams",
            "ProllySession",
            "RBSR_VERSION",
            "ROUND_LIMIT_ITEMS",
            "RbsrParams",
            "RbsrSession",
            "ReconcileResult",
            "ReconcileSession",
            "SessionStats",
            "Window",
            "default_max_rounds",
            "fingerprint",
            "fingerprint_of_sum",
            "session_class",
            "RIBLT_VERSION",
            "RibltItemStore",
            "RibltParams",
            "RibltSession",
            "SymbolCache",
            "reconcile_in_memory",
            "sessions",
            "summarize",
            "varint",
        }
    ),
}


@pytest.mark.parametrize("package", sorted(EXPORTS))
def test_each_package_exports_exactly_its_pinned_names(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == EXPORTS[package]
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_top_level_names_are_the_packages_own() -> None:
    """``sdsync.X`` is the object its component exports, not a copy."""
    import sdsync
    from sdsync import core, errors, runtime, wire

    assert sdsync.MessageChannel is core.MessageChannel
    assert sdsync.decode is wire.decode
    assert sdsync.LocalProtocolError is errors.LocalProtocolError
    assert sdsync.ReliabilityManager is runtime.ReliabilityManager
