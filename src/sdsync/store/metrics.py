"""Prometheus metrics of a store node, on the node's own registry.

Each node owns a :class:`~prometheus_client.CollectorRegistry`, so several nodes in
one process (tests, benchmarks) never share or collide on counters.  The Store Sync
counters are defined now, with their final names, and are incremented by the sync
component once it is mounted.

The Waku node keeps its own counters (:class:`~sdsync.waku.node.WakuCounters`:
plain ``Counter``s on :class:`~sdsync.transport.libp2p.Libp2pTransport`, written on its
trio thread): a store node on a Waku node exports them through :class:`Libp2pCollector`,
which reads them when ``/metrics`` is scraped, so they are never counted twice nor copied
on every event.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from sdsync.waku.node import WakuCounters


class StoreMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.messages = Gauge("sdsync_store_messages", "Messages in the archive.", registry=r)
        self.archive_bytes = Gauge(
            "sdsync_store_archive_bytes", "Bytes the archive occupies on disk.", registry=r
        )
        self.filter_subscribers = Gauge(
            "sdsync_store_filter_subscribers",
            "Light clients holding a Filter subscription (0 without light services).",
            registry=r,
        )
        self.ingested = Counter(
            "sdsync_store_ingested_messages",
            "Messages newly archived, by source (http, resume, relay, lightpush, sync).",
            ["source"],
            registry=r,
        )
        self.duplicates = Counter(
            "sdsync_store_duplicate_messages",
            "Messages received that the archive already held, by source.",
            ["source"],
            registry=r,
        )
        self.rejected = Counter(
            "sdsync_store_rejected",
            "Ingestion requests (http) or messages (relay) rejected for bad data, by source.",
            ["source"],
            registry=r,
        )
        self.refused = Counter(
            "sdsync_store_refused",
            "Input refused: requests answered with a 4xx, by route (METHOD /path/template) "
            "and reason; messages from the relay or Store Resume dropped (route relay, "
            "resume).",
            ["route", "reason"],
            registry=r,
        )
        self.queries = Counter(
            "sdsync_store_queries",
            "Store v3 queries answered, by status code.",
            ["status"],
            registry=r,
        )
        self.query_seconds = Histogram(
            "sdsync_store_query_seconds", "Time to answer a store v3 query.", registry=r
        )
        self.lightpushes = Counter(
            "sdsync_store_lightpush",
            "LightPush requests answered, by status code.",
            ["status"],
            registry=r,
        )
        self.filter_pushes = Counter(
            "sdsync_store_filter_pushes",
            "Filter pushes to subscribers, by outcome (sent; failed, after one retry on a "
            "fresh stream; dropped: never tried, the subscriber's queue being full or its "
            "subscription dropped).",
            ["outcome"],
            registry=r,
        )
        self.filter_drops = Counter(
            "sdsync_store_filter_subscriptions_dropped",
            "Filter subscriptions the node dropped, by reason (push_failures: too many "
            "failed pushes in a row; no_push_protocol: the peer does not take pushes; "
            "expired: not renewed in time; disconnected: no connection for longer than the "
            "grace; fair_share: the stalest of the largest host's, for a smaller host's).",
            ["reason"],
            registry=r,
        )
        self.retention_deleted = Counter(
            "sdsync_store_retention_deleted_messages",
            "Messages deleted by retention, by policy kind.",
            ["policy"],
            registry=r,
        )
        self.sync_rounds = Counter(
            "sdsync_store_sync_rounds",
            "Store Sync reconciliation rounds, by peer role.",
            ["role"],
            registry=r,
        )
        self.sync_bytes = Counter(
            "sdsync_store_sync_bytes",
            "Bytes exchanged by Store Sync, by direction (sent, received).",
            ["direction"],
            registry=r,
        )
        self.sync_differences = Counter(
            "sdsync_store_sync_differences",
            "Differences found by Store Sync, by side (we_lacked, peer_lacked).",
            ["side"],
            registry=r,
        )

        self.http_connections_closed = Counter(
            "sdsync_store_http_connections_closed",
            "HTTP connections the node closed on its own, by reason (per_ip_limit: refused "
            "at once, its address holding as many as it may; idle_timeout: no whole request "
            "head within the idle timeout of its opening or of its last answer).",
            ["reason"],
            registry=r,
        )
        self.traffic = MinuteTraffic()
        """``ingested``, per minute over the last hour (the status page's chart)."""
        self.sync_symbol_buckets = Counter(
            "sdsync_store_sync_symbol_buckets",
            "RIBLT bucket rows a snapshot took from the node's symbol cache (reused) or "
            "encoded (new or changed buckets).",
            ["outcome"],
            registry=r,
        )
        self.memory_returns = Counter(
            "sdsync_store_memory_returns",
            "Times the node gave memory back to the system, a load having grown it or "
            "ended (caches emptied, malloc trimmed: sdsync.store.memory).",
            registry=r,
        )
        self.memory_returned_bytes = Counter(
            "sdsync_store_memory_returned_bytes",
            "Resident bytes those returns gave back.",
            registry=r,
        )

    def export_waku_sync(self, sync: WakuSyncCounters) -> None:
        """Export Waku Sync's counters on this registry (:class:`WakuSyncCollector`)."""
        self.registry.register(WakuSyncCollector(sync))

    def export_libp2p(self, host: WakuCounters) -> None:
        """Export ``host``'s counters on this registry (:class:`Libp2pCollector`)."""
        self.registry.register(Libp2pCollector(host))

    def returned_memory(self, returned: int) -> None:
        """Count one return of memory to the system, of ``returned`` resident bytes."""
        self.memory_returns.inc()
        self.memory_returned_bytes.inc(returned)

    def refuse(self, route: str, reason: str) -> None:
        """Count one refusal: ``route`` is where (``METHOD /path/template`` of an HTTP
        route, or ``relay``, ``resume``, ``sync``...), ``reason`` a short fixed word
        (``bad_time``, ``timestamp_in_future``...).  Both are labels: never put request
        data in them."""
        self.refused.labels(route=route, reason=reason).inc()


class MinuteTraffic:
    """Counts per source and wall-clock minute, over the last ``minutes`` minutes.

    A Prometheus counter has only its total; the status page charts the last hour without
    a time-series database, so the counts that feed ``sdsync_store_ingested_messages`` are
    also added here, at most ``minutes + 1`` minutes of them kept.
    """

    def __init__(self, minutes: int = 60, clock: Callable[[], float] = time.time) -> None:
        self.minutes = minutes
        self._clock = clock
        self._by_minute: dict[int, Tally[str]] = {}

    def now_minute(self) -> int:
        """The current minute (Unix s // 60)."""
        return int(self._clock() // 60)

    def add(self, source: str, count: int) -> None:
        minute = self.now_minute()
        self._by_minute.setdefault(minute, Tally())[source] += count
        for old in [m for m in self._by_minute if m <= minute - self.minutes]:
            del self._by_minute[old]

    def last(self) -> tuple[int, list[dict[str, int]]]:
        """The first of the last ``minutes`` minutes, and each one's counts by source,
        oldest first (the current minute last, still counting)."""
        first = self.now_minute() - self.minutes + 1
        counts = [dict(self._by_minute.get(first + i, {})) for i in range(self.minutes)]
        return first, counts


# (attribute of WakuCounters and metric name, its label, its help)
LIBP2P_COUNTERS = (
    ("rejected", "reason", "Frames and requests from peers rejected as bad data."),
    (
        "connections_refused",
        "reason",
        "Inbound connections closed unserved (ConnectionLimits: per-IP limit, pending "
        "handshakes, handshake timeout).",
    ),
    ("stream_timeouts", "protocol", "Request streams that timed out."),
    ("stream_failures", "protocol", "Request streams that broke."),
    (
        "streams_refused",
        "protocol",
        "Inbound streams reset, their peer holding too many of the protocol open.",
    ),
    ("push_streams", "protocol", "Push streams opened."),
    (
        "push_retries",
        "protocol",
        "Pushes written again on a fresh stream after their lane failed.",
    ),
    (
        "pushes_resent",
        "protocol",
        "Pushes sent again after a one-frame reader dropped them unread.",
    ),
)

#: The host's plain counts, as ``sdsync_store_libp2p_<name>_total``.
LIBP2P_TOTALS = (
    (
        "relay_rate_limited",
        "Relay frames dropped, neither archived nor relayed: their forwarding peer was"
        " over its relay rate.",
    ),
    (
        "mcache_evicted",
        "Messages evicted from the gossip message cache, oldest first, to keep it within"
        " its byte budget.",
    ),
)


class WakuSyncCounters(Protocol):
    """What :class:`~sdsync.waku.sync.WakuSync` counts (written on the node's loop)."""

    @property
    def sessions(self) -> Mapping[tuple[str, str], int]: ...
    @property
    def failures(self) -> int: ...
    @property
    def refused(self) -> Mapping[str, int]: ...
    @property
    def archived(self) -> int: ...
    @property
    def pushed(self) -> int: ...


class WakuSyncCollector(Collector):
    """Waku Sync's counters as ``sdsync_store_waku_sync_*_total``, read at scrape time."""

    def __init__(self, sync: WakuSyncCounters) -> None:
        self.sync = sync

    def collect(self) -> Iterator[CounterMetricFamily]:
        sync = self.sync
        sessions = CounterMetricFamily(
            "sdsync_store_waku_sync_sessions",
            "Waku Sync exchanges completed, by role (initiator: our rounds) and method"
            " (waku: XOR ranges with nwaku; rbsr: between sdsync nodes).",
            labels=["role", "method"],
        )
        for (role, method), count in sorted(sync.sessions.items()):
            sessions.add_metric([role, method], count)
        yield sessions
        yield CounterMetricFamily(
            "sdsync_store_waku_sync_failed_rounds",
            "Our Waku Sync rounds that failed (no peer, a peer gone, refused or hostile).",
            value=sync.failures,
        )
        refused = CounterMetricFamily(
            "sdsync_store_waku_sync_refused",
            "Waku Sync sessions refused and pushed messages not archived, by reason.",
            labels=["reason"],
        )
        for reason, count in sorted(sync.refused.items()):
            refused.add_metric([reason], count)
        yield refused
        messages = CounterMetricFamily(
            "sdsync_store_waku_sync_messages",
            "Messages pushed to Waku Sync peers, and new ones archived from theirs.",
            labels=["direction"],
        )
        messages.add_metric(["pushed"], sync.pushed)
        messages.add_metric(["archived"], sync.archived)
        yield messages


class Libp2pCollector(Collector):
    """The libp2p host's counters as ``sdsync_store_libp2p_<name>_total{reason|protocol}``,
    read at scrape time."""

    def __init__(self, host: WakuCounters) -> None:
        self.host = host

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, label, documentation in LIBP2P_COUNTERS:
            family = CounterMetricFamily(
                f"sdsync_store_libp2p_{name}", documentation, labels=[label]
            )
            # The trio thread adds to these: dict() copies one in a single C call, under
            # the GIL, where iterating it here could meet a key being added.
            for key, count in sorted(dict(getattr(self.host, name)).items()):
                family.add_metric([key], count)
            yield family
        for name, documentation in LIBP2P_TOTALS:
            yield CounterMetricFamily(
                f"sdsync_store_libp2p_{name}", documentation, value=getattr(self.host, name)
            )
