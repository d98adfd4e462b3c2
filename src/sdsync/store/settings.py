"""The settings of a store node, each declared once, and the node they make.

Theory of operation
-------------------
:data:`SETTINGS` is the one list of what an operator may set on a node: each
:class:`Setting` has its name (the key of a configuration file, the flag without its
dashes), its default, its bounds, its help and the panel of ``--help`` it belongs to.
Where a component has a config of its own (:class:`~sdsync.store.node.NodeConfig`,
:class:`~sdsync.transport.settings.ConnectionLimits`, :class:`~sdsync.store.server.HttpLimits`,
:class:`~sdsync.store.sync.SyncConfig`, …) the default is read from it, so a default lives
in one place.  ``sdsync store serve`` is built from this list: its options, their order,
defaults, bounds and panels (:mod:`sdsync.cli.store`).

:func:`plan_node` takes the values (any left out keep their defaults), checks every one —
bounds, spellings such as ``64MiB`` or ``100/20s``, how the topics, shards and cluster fit
together — and assembles what runs: the :class:`~sdsync.store.node.NodeConfig`, the relay
host's :class:`~sdsync.store.launch.RelayOptions` and the chat page's
:class:`~sdsync.store.launch.WebOptions`.  A value that cannot be used raises
:class:`~sdsync.errors.OptionError` naming its setting, before anything is opened; the
only thing planning may write is the node key, created in the data dir at first start.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdsync.errors import LocalProtocolError, OptionError
from sdsync.reconcile import METHODS
from sdsync.store.launch import RelayOptions, WebOptions
from sdsync.store.light_clients import DEFAULT_LIGHTPUSH_RATE, LightClientConfig
from sdsync.store.node import NodeConfig
from sdsync.store.retention import DEFAULT_POLICY, RetentionPolicy
from sdsync.store.server import HttpLimits
from sdsync.store.sync import SyncConfig
from sdsync.transport.forwarded import canonical_ip
from sdsync.transport.nodekey import NodeKeySource, choose_nodekey
from sdsync.transport.settings import OUTBOUND_RESERVE, ConnectionLimits
from sdsync.waku.filter.service import FilterLimits
from sdsync.waku.lightpush.service import ServedTopics
from sdsync.waku.ratelimit import DEFAULT_RELAY_RATE, RateLimit
from sdsync.waku.relay.topics import (
    SHARD_TOPIC_PREFIX,
    TWN_SHARD_COUNT,
    WakuRelayConfig,
    default_content_topic,
    shard_pubsub_topic,
)
from sdsync.waku.store.service import AnswerLimits
from sdsync.waku.sync import WakuSyncConfig

__all__ = ["BY_NAME", "SETTINGS", "NodePlan", "Setting", "db_url", "plan_node", "size_text"]

SIZE = "BYTES[KB|MB|GB|KiB|MiB|GiB]"
_BINARY = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def size_text(size: int) -> str:
    """``64MiB`` for 64 * 2**20: a size as the settings spell it, in the largest binary
    unit that divides it."""
    return next((f"{size // unit}{name}" for name, unit in _BINARY if size % unit == 0), str(size))


@dataclass(frozen=True)
class Setting:
    """One setting of a node."""

    name: str
    """Its key in a configuration file; its flag is ``--`` and the name with dashes."""
    group: str
    """The panel of ``--help`` it is listed in."""
    kind: type
    """``str``, ``int``, ``float``, ``bool`` or ``Path``; of each item when repeatable."""
    default: Any
    help: str
    repeatable: bool = False
    """Given any number of times; its default is then None (see ``shown_default``)."""
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    envvar: str | None = None
    secret: bool = False
    """Never printed back (``--print-config``); give it by its environment variable."""
    switch: bool = False
    """A flag that only turns on (``--web``), without a ``--no-`` form."""
    shown_default: str | None = None
    """The default as ``--help`` words it, when the default is worked out at start."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_NODE = NodeConfig(data_dir=Path())
_CONNECTIONS = ConnectionLimits()
_HTTP = HttpLimits()
_SYNC = SyncConfig()
_ANSWERS = AnswerLimits()
_FILTER = FilterLimits()
_WAKU_SYNC = WakuSyncConfig(pubsub_topics=("",))
_RELAY = RelayOptions()

DEFAULT_DATA_DIR = Path(os.environ.get("XDG_DATA_HOME") or "~/.local/share") / "sdsync" / "store"
DEFAULT_RELAY_LISTEN = _RELAY.listen[0]
DEFAULT_WEB_LISTEN = "/ip4/127.0.0.1/tcp/0/ws"

ARCHIVE = "Archive"
HTTP_API = "HTTP API"
RELAY = "Relay"
CONNECTIONS = "Relay connections"
LIGHT = "Light-client services"
ANSWERS = "Store queries over libp2p"
STORE_SYNC = "Store Resume and Store Sync (HTTP, with other sdsync nodes)"
WAKU_SYNC = "Waku Sync (libp2p, with nwaku)"
WEB = "Chat page"

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "db",
        ARCHIVE,
        str,
        None,
        "postgresql://user@host/db, or a SQLite file (default: DATA_DIR/store.sqlite3).",
    ),
    Setting(
        "data_dir",
        ARCHIVE,
        Path,
        DEFAULT_DATA_DIR,
        "State: SQLite archive, last-online time, node key.",
    ),
    Setting(
        "retention",
        ARCHIVE,
        str,
        None,
        "Retention policy; repeatable; 'none' keeps everything.",
        repeatable=True,
        metavar="time:SECONDS|capacity:N|size:BYTES[GB]",
        shown_default=DEFAULT_POLICY,
    ),
    Setting(
        "retention_interval",
        ARCHIVE,
        float,
        _NODE.retention_interval_s,
        "Seconds between retention runs.",
        minimum=1.0,
    ),
    Setting(
        "timestamp_variance",
        ARCHIVE,
        float,
        _NODE.timestamp_variance_s,
        "Seconds a message's timestamp may lie ahead of this node's clock; later ones are"
        " refused (nwaku: 20).",
        minimum=0.0,
    ),
    Setting(
        "listen",
        HTTP_API,
        str,
        f"{_NODE.listen_host}:{_NODE.port}",
        "Where the HTTP API listens, HOST:PORT.",
    ),
    Setting(
        "token",
        HTTP_API,
        str,
        None,
        "Bearer token for writes and admin routes (none: writes disabled).",
        envvar="SDSYNC_STORE_TOKEN",
        secret=True,
    ),
    Setting(
        "http_idle_timeout",
        HTTP_API,
        float,
        _HTTP.idle_timeout_s,
        "Seconds an HTTP connection may go without sending a whole request head, from its"
        " opening or its last answer, before it is closed (nginx's client_header_timeout: 60).",
        minimum=0.1,
    ),
    Setting(
        "http_max_connections_per_ip",
        HTTP_API,
        int,
        _HTTP.max_connections_per_ip,
        "HTTP connections one IP address may hold open at once; more are closed at once;"
        " 0: no limit.",
        minimum=0,
    ),
    Setting(
        "http_pages_rate_limit",
        HTTP_API,
        str,
        str(_HTTP.pages_rate),
        "Requests one IP address may make of /status and /metrics (a token bucket; the"
        " archive's figures there are measured in the background, not per request); more"
        " are answered 429; the token's holder is not counted.",
        metavar="VOLUME/PERIOD|off",
    ),
    Setting(
        "http_exempt_ip",
        HTTP_API,
        str,
        None,
        "An IP address not held to --http-max-connections-per-ip nor"
        " --http-pages-rate-limit (a local reverse proxy's); repeatable.",
        repeatable=True,
        shown_default=", ".join(sorted(_HTTP.exempt_ips)) or "none, loopback included",
    ),
    Setting(
        "trusted_proxy",
        HTTP_API,
        str,
        None,
        "The IP address of a reverse proxy in front of this node (a local TLS or WebSocket"
        " proxy's: 127.0.0.1) whose X-Forwarded-For is believed: an HTTP request or relay"
        " WebSocket connection from it counts as the client's it names, for every per-IP"
        " limit; its HTTP connections are not held to --http-max-connections-per-ip."
        " Anyone else's X-Forwarded-For is ignored. Repeatable.",
        repeatable=True,
        metavar="IP",
        shown_default="none",
    ),
    Setting(
        "pubsub_topic",
        RELAY,
        str,
        None,
        "Archive this topic from the Waku relay; repeatable: a shard's pubsub topic"
        " /waku/2/rs/CLUSTER/SHARD (every message on it), or a channel's /sds/1/NAME (its"
        " content topic /sds/1/NAME/proto, on its autoshard). Store Sync then accepts only"
        " these pubsub topics (without: only topics the archive already holds).",
        repeatable=True,
    ),
    Setting(
        "relay_shard",
        RELAY,
        int,
        None,
        "Archive every message on this shard of --relay-cluster-id (/waku/2/rs/CLUSTER/SHARD);"
        " repeatable.",
        repeatable=True,
        minimum=0,
    ),
    Setting(
        "relay_cluster_id",
        RELAY,
        int,
        _RELAY.cluster_id,
        "Waku cluster of the relay (1: The Waku Network).",
        minimum=0,
    ),
    Setting(
        "relay_listen",
        RELAY,
        str,
        None,
        "libp2p listen multiaddr of the relay (/ip4/HOST/tcp/PORT, or …/tcp/PORT/ws for"
        " browsers); repeatable.",
        repeatable=True,
        shown_default=DEFAULT_RELAY_LISTEN,
    ),
    Setting(
        "relay_peer",
        RELAY,
        str,
        None,
        "libp2p multiaddr (…/p2p/<id>) of a relay peer; repeatable.",
        repeatable=True,
    ),
    Setting(
        "nodekey",
        RELAY,
        str,
        None,
        "The relay host's libp2p private key: 64 hex characters (secp256k1, as nwaku's"
        " --nodekey), so its peer id stays the same.",
        envvar="SDSYNC_NODEKEY",
        secret=True,
        shown_default="DATA_DIR/nodekey, created at first start",
    ),
    Setting(
        "nodekey_file",
        RELAY,
        Path,
        None,
        "A file holding the relay host's key, as --nodekey takes it.",
    ),
    Setting(
        "relay_rate_limit",
        RELAY,
        str,
        f"{size_text(int(DEFAULT_RELAY_RATE.volume))}/{DEFAULT_RELAY_RATE.period_s:g}s",
        "Relay bytes one forwarding peer may bring (a token bucket); more are dropped,"
        " neither archived nor relayed.",
        metavar="BYTES/PERIOD|off",
    ),
    Setting(
        "relay_rate_limit_per_ip",
        RELAY,
        str,
        None,
        "Relay bytes all the peers seen from one IP address (one IPv6 /64) may bring"
        " together; more are dropped, neither archived nor relayed.",
        metavar="BYTES/PERIOD|off",
        shown_default="twice --relay-rate-limit",
    ),
    Setting(
        "relay_max_connections_per_ip",
        CONNECTIONS,
        int,
        _CONNECTIONS.per_ip,
        "libp2p connections one IP address may hold at once, handshaking or established"
        " (nwaku's colocation limit: 5); 0: no limit.",
        minimum=0,
    ),
    Setting(
        "relay_exempt_ip",
        CONNECTIONS,
        str,
        None,
        "An IP address not held to --relay-max-connections-per-ip; repeatable; 'none': none."
        " Loopback is not exempt: behind a local proxy every client comes from it (see"
        " --trusted-proxy).",
        repeatable=True,
        shown_default=", ".join(sorted(_CONNECTIONS.exempt_ips)) or "none",
    ),
    Setting(
        "relay_pending_handshakes",
        CONNECTIONS,
        int,
        _CONNECTIONS.pending,
        "libp2p handshakes in progress at once, from all addresses.",
        minimum=1,
    ),
    Setting(
        "relay_pending_handshakes_per_ip",
        CONNECTIONS,
        int,
        _CONNECTIONS.pending_per_ip,
        "Of those, handshakes one IP address may have in progress at once (but an"
        " --relay-exempt-ip); when all are taken, one that has run 1 s gives its slot to a"
        " newcomer.",
        minimum=1,
    ),
    Setting(
        "relay_handshake_timeout",
        CONNECTIONS,
        float,
        _CONNECTIONS.handshake_timeout_s,
        "Seconds a libp2p connection may take to finish its handshake.",
        minimum=0.1,
    ),
    Setting(
        "relay_max_connections",
        CONNECTIONS,
        int,
        _CONNECTIONS.max_connections,
        f"libp2p connections in all, of which {OUTBOUND_RESERVE} are kept for"
        " outbound dials (py-libp2p's default: 300).",
        minimum=OUTBOUND_RESERVE + 1,
    ),
    Setting(
        "light",
        LIGHT,
        bool,
        _RELAY.light_clients,
        "Serve light clients on the relay host: LightPush (3.0.0, 2.0.0-beta1) and Filter v2,"
        " on the topics archived.",
    ),
    Setting(
        "lightpush_rate_limit",
        LIGHT,
        str,
        str(DEFAULT_LIGHTPUSH_RATE),
        "LightPushes one peer may make (a token bucket: nwaku's --rate-limit lightpush:5/1s on"
        " average, bursts of 100); more are answered 429.",
        metavar="VOLUME/PERIOD|off",
    ),
    Setting(
        "lightpush_rate_limit_per_ip",
        LIGHT,
        str,
        None,
        "LightPushes all the peers seen from one IP address (one IPv6 /64) may make together:"
        " a client that takes a new identity per refusal gains nothing; more are answered"
        " 429.",
        metavar="VOLUME/PERIOD|off",
        shown_default="twice --lightpush-rate-limit",
    ),
    Setting(
        "filter_per_host",
        LIGHT,
        int,
        _FILTER.max_peers_per_host,
        f"Filter subscriptions one host (IP address) may hold, of the node's {_FILTER.max_peers}.",
        minimum=1,
    ),
    Setting(
        "store_answer_bytes_per_peer",
        ANSWERS,
        str,
        size_text(_ANSWERS.per_peer_bytes),
        "Bytes of store-query answers one libp2p peer may be sent per 10 s, read or not (a"
        " page of the largest messages is 15 MB); more are answered 429.",
        metavar=SIZE,
    ),
    Setting(
        "store_answer_bytes_per_ip",
        ANSWERS,
        str,
        None,
        "Bytes of store-query answers all the libp2p peers seen from one IP address (one"
        " IPv6 /64) may be sent per 10 s together; more are answered 429.",
        metavar=SIZE,
        shown_default="twice --store-answer-bytes-per-peer",
    ),
    Setting(
        "store_answer_bytes",
        ANSWERS,
        str,
        size_text(_ANSWERS.total_bytes),
        "Bytes of store-query answers all libp2p peers may be sent per 10 s; more are"
        " answered 503.",
        metavar=SIZE,
    ),
    Setting(
        "peer",
        STORE_SYNC,
        str,
        None,
        "Base URL of another store node, for Store Resume and Store Sync; repeatable.",
        repeatable=True,
    ),
    Setting(
        "sync_interval",
        STORE_SYNC,
        float,
        _SYNC.interval_s,
        "Seconds between Store Sync rounds with a random --peer; 0: none.",
        minimum=0.0,
    ),
    Setting(
        "sync_method",
        STORE_SYNC,
        str,
        _SYNC.method,
        "Reconciliation method of the rounds this node starts (a peer that lacks it is"
        " synced by rbsr).",
        choices=tuple(METHODS),
    ),
    Setting(
        "sync_window",
        STORE_SYNC,
        float,
        _SYNC.window_s,
        f"Seconds into the past a round covers (ending {_SYNC.lag_s:g} s ago).",
        minimum=1.0,
    ),
    Setting(
        "sync_token",
        STORE_SYNC,
        str,
        None,
        "Shared secret of the federation: required of every Store Sync peer, and sent to the"
        " peers this node syncs with.",
        envvar="SDSYNC_SYNC_TOKEN",
        secret=True,
    ),
    Setting(
        "sync_sessions_per_minute",
        STORE_SYNC,
        float,
        _SYNC.sessions_per_minute,
        "Store Sync sessions one remote address may open per minute, on average (a token"
        " bucket); more are answered 429. Above 0.",
        minimum=0.0,
    ),
    Setting(
        "sync_session_burst",
        STORE_SYNC,
        int,
        _SYNC.session_burst,
        "Store Sync sessions one remote address may open at once.",
        minimum=1,
    ),
    Setting(
        "store_sync",
        WAKU_SYNC,
        bool,
        True,
        "Waku Sync with nwaku and other store nodes over the relay host"
        " (/vac/waku/reconciliation/1.0.0 and /vac/waku/transfer/1.0.0), on the pubsub topics"
        " archived.",
    ),
    Setting(
        "store_sync_interval",
        WAKU_SYNC,
        float,
        _WAKU_SYNC.interval_s,
        "Seconds between Waku Sync rounds with a random peer that speaks it; 0: answer peers only.",
        minimum=0.0,
    ),
    Setting(
        "store_sync_range",
        WAKU_SYNC,
        float,
        _WAKU_SYNC.range_s,
        "Seconds into the past a Waku Sync round covers.",
        minimum=1.0,
    ),
    Setting(
        "store_sync_relay_jitter",
        WAKU_SYNC,
        float,
        _WAKU_SYNC.relay_jitter_s,
        "The newest seconds a Waku Sync round leaves out (messages still in flight).",
        minimum=0.0,
    ),
    Setting(
        "web",
        WEB,
        bool,
        False,
        "Serve the chat page at /chat/ (a js-waku light node in the browser using this node)."
        " Relays every shard of the cluster unless --relay-shard/--pubsub-topic say otherwise,"
        f" and listens on {DEFAULT_WEB_LISTEN} unless a --relay-listen is …/ws.",
        switch=True,
    ),
    Setting(
        "web_address",
        WEB,
        str,
        None,
        "Multiaddr the chat page dials instead of the WebSocket listeners, e.g. a TLS proxy's"
        " /dns4/HOST/tcp/443/wss (the node's /p2p/<id> is appended); repeatable.",
        repeatable=True,
    ),
)
BY_NAME = {setting.name: setting for setting in SETTINGS}


@dataclass(frozen=True)
class NodePlan:
    """What a node runs with, every setting checked."""

    db_url: str
    """The archive: a PostgreSQL URL or a SQLite file."""
    config: NodeConfig
    relay: RelayOptions
    web: WebOptions | None
    size_policy: RetentionPolicy | None
    """The smallest size policy, enforced as the archive grows as well as every
    retention interval (so a flood cannot fill the disk in between)."""
    identity: NodeKeySource | None = None
    """Where the relay host's key came from (None: no relay, or not asked for)."""
    values: Mapping[str, Any] = field(default_factory=dict)
    """Every setting's value, defaults filled in."""


def plan_node(values: Mapping[str, Any], *, identity: bool = True) -> NodePlan:
    """The node of ``values`` (setting name → value; one left out keeps its default).

    With ``identity``, the relay host's key is read or, at first start, created in the
    data dir; without, nothing is written (a configuration checked, not started).
    Raises :class:`~sdsync.errors.OptionError` naming the first setting whose value
    cannot be used, and :class:`LocalProtocolError` for a name no setting has.
    """
    unknown = set(values) - BY_NAME.keys()
    if unknown:
        raise LocalProtocolError(f"no such setting: {', '.join(sorted(unknown))}")
    given = {s.name: _checked(s, values.get(s.name, s.default)) for s in SETTINGS}
    return _Planner(given).plan(identity)


def _checked(setting: Setting, value: Any) -> Any:
    """``value`` if it is of the setting's kind and within its bounds."""
    if value is None:
        return None
    if setting.repeatable and not isinstance(value, (list, tuple)):
        raise OptionError(setting.name, f"expected a list, got {value!r}")
    items = list(value) if setting.repeatable else [value]
    for item in items:
        _check_item(setting, item)
    return tuple(items) if setting.repeatable else value


def _check_item(setting: Setting, item: Any) -> None:
    kinds: tuple[type[Any], ...] = {float: (int, float), Path: (str, Path)}.get(
        setting.kind, (setting.kind,)
    )
    # bool is an int to isinstance, yet True is no count of connections.
    if not isinstance(item, kinds) or (isinstance(item, bool) and setting.kind is not bool):
        raise OptionError(setting.name, f"expected {setting.kind.__name__}, got {item!r}")
    if setting.minimum is not None and item < setting.minimum:
        raise OptionError(setting.name, f"must be at least {setting.minimum:g}, got {item}")
    if setting.choices and item not in setting.choices:
        raise OptionError(setting.name, f"expected one of {', '.join(setting.choices)}")


class _Planner:
    """The parts of a node from checked values, each part a small step."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values
        self.data_dir = Path(values["data_dir"]).expanduser()
        self.cluster_id: int = values["relay_cluster_id"]
        self.trusted_proxies = _addresses(values["trusted_proxy"] or (), "trusted_proxy")

    def plan(self, identity: bool) -> NodePlan:
        v = self.values
        relay_topics = self._relay_topics(v["pubsub_topic"] or (), v["relay_shard"] or ())
        relay_listen = tuple(v["relay_listen"] or (DEFAULT_RELAY_LISTEN,))
        if v["web"]:
            relay_topics, relay_listen = self._web_relay(relay_topics, relay_listen)
        served = self._served_topics(relay_topics)
        policies = self._retention(v["retention"])
        config = self._config(relay_topics, served, policies)
        web = WebOptions(advertise=self._web_addresses()) if v["web"] else None
        relay_rate = _rate(v["relay_rate_limit"], "relay_rate_limit")
        rate_per_ip = _per_ip(v, "relay_rate_limit_per_ip", relay_rate)
        limits = self._connection_limits() if relay_topics else None
        # Last: the one step that may write (the key, at first start).
        source = self._nodekey() if identity and relay_topics else None
        relay = RelayOptions(
            key=source.key if source is not None else None,
            listen=relay_listen,
            peers=tuple(v["relay_peer"] or ()),
            cluster_id=self.cluster_id,
            rate=relay_rate,
            rate_per_ip=rate_per_ip,
            limits=limits,
            light_clients=v["light"],
            store_sync=config.waku_sync is not None,
        )
        sizes = [p for p in policies if p.kind == "size"]
        return NodePlan(
            db_url=db_url(v["db"], self.data_dir),
            config=config,
            relay=relay,
            web=web,
            size_policy=min(sizes, key=lambda p: p.limit) if sizes else None,
            identity=source,
            values=v,
        )

    def _config(
        self,
        relay_topics: tuple[str, ...],
        served: tuple[tuple[str, str | None], ...],
        policies: tuple[RetentionPolicy, ...],
    ) -> NodeConfig:
        v = self.values
        host, port = parse_listen(v["listen"])
        lightpush_rate = _rate(v["lightpush_rate_limit"], "lightpush_rate_limit")
        sync_topics = tuple(dict.fromkeys(pubsub_topic for pubsub_topic, _ in served))
        return NodeConfig(
            data_dir=self.data_dir,
            listen_host=host,
            port=port,
            token=v["token"],
            retention=policies,
            retention_interval_s=v["retention_interval"],
            peers=tuple(v["peer"] or ()),
            relay_topics=relay_topics,
            timestamp_variance_s=v["timestamp_variance"],
            light_clients=LightClientConfig(
                served=ServedTopics(served, cluster_id=self.cluster_id),
                filter=FilterLimits(max_peers_per_host=v["filter_per_host"]),
                lightpush_rate=lightpush_rate,
                lightpush_rate_per_ip=_per_ip(v, "lightpush_rate_limit_per_ip", lightpush_rate),
            ),
            http=HttpLimits(
                idle_timeout_s=v["http_idle_timeout"],
                max_connections_per_ip=v["http_max_connections_per_ip"],
                exempt_ips=_exempt_ips(v["http_exempt_ip"], _HTTP.exempt_ips, "http_exempt_ip"),
                trusted_proxies=self.trusted_proxies,
                pages_rate=_rate(v["http_pages_rate_limit"], "http_pages_rate_limit"),
            ),
            sync=SyncConfig(
                interval_s=v["sync_interval"] or None,
                method=v["sync_method"],
                window_s=v["sync_window"],
                pubsub_topics=sync_topics,
                token=v["sync_token"],
                sessions_per_minute=_above_zero(v, "sync_sessions_per_minute"),
                session_burst=v["sync_session_burst"],
            ),
            store_answers=AnswerLimits(
                per_peer_bytes=_size(v, "store_answer_bytes_per_peer"),
                per_ip_bytes=_size(v, "store_answer_bytes_per_ip")
                if v["store_answer_bytes_per_ip"] is not None
                else 2 * _size(v, "store_answer_bytes_per_peer"),
                total_bytes=_size(v, "store_answer_bytes"),
            ),
            waku_sync=WakuSyncConfig(
                pubsub_topics=sync_topics,
                content_topics=_content_topics(served),
                interval_s=v["store_sync_interval"],
                range_s=v["store_sync_range"],
                relay_jitter_s=v["store_sync_relay_jitter"],
                clock_skew_s=v["timestamp_variance"],
            )
            if v["store_sync"] and relay_topics
            else None,
        )

    def _retention(self, specs: Iterable[str] | None) -> tuple[RetentionPolicy, ...]:
        try:
            return tuple(RetentionPolicy.parse(s) for s in specs or [DEFAULT_POLICY] if s != "none")
        except LocalProtocolError as exc:
            raise OptionError("retention", str(exc)) from None

    def _relay_topics(self, pubsub_topics: Iterable[str], shards: Iterable[int]) -> tuple[str, ...]:
        """The topics the relay archives: the pubsub topics, then the shards' topics."""
        own = f"{SHARD_TOPIC_PREFIX}{self.cluster_id}/"
        for topic in pubsub_topics:
            if topic.startswith(SHARD_TOPIC_PREFIX) and not topic.startswith(own):
                raise OptionError(
                    "pubsub_topic",
                    f"{topic} is not on cluster {self.cluster_id} (--relay-cluster-id)",
                )
        shard_topics = (shard_pubsub_topic(self.cluster_id, shard) for shard in shards)
        return tuple(dict.fromkeys([*pubsub_topics, *shard_topics]))

    def _web_relay(
        self, relay_topics: tuple[str, ...], listen: tuple[str, ...]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A node serving the chat page relays every shard of the cluster when none is
        named, and listens on a WebSocket when no listener is one."""
        if not self.values["light"]:
            raise OptionError("light", "the chat page uses the light services")
        topics = relay_topics or self._relay_topics((), range(TWN_SHARD_COUNT))
        if not any(addr.rstrip("/").endswith(("/ws", "/wss")) for addr in listen):
            listen = (*listen, DEFAULT_WEB_LISTEN)
        return topics, listen

    def _served_topics(self, relay_topics: Iterable[str]) -> tuple[tuple[str, str | None], ...]:
        """What the relay archives as (pubsub topic, content topic) pairs: a shard's topic
        with every content topic (None), a channel's content topic on its autoshard (as
        the transport routes them)."""
        channels = [t for t in relay_topics if not t.startswith(SHARD_TOPIC_PREFIX)]
        if not channels:
            return tuple((topic, None) for topic in relay_topics)
        waku = WakuRelayConfig(cluster_id=self.cluster_id)
        try:
            content = {t: default_content_topic(t) for t in channels}
            shards = {t: waku.pubsub_topic(c) for t, c in content.items()}
        except LocalProtocolError as exc:
            raise OptionError("pubsub_topic", str(exc)) from None
        return tuple((shards.get(t, t), content.get(t)) for t in relay_topics)

    def _connection_limits(self) -> ConnectionLimits:
        v = self.values
        return ConnectionLimits(
            per_ip=v["relay_max_connections_per_ip"],
            pending=v["relay_pending_handshakes"],
            pending_per_ip=v["relay_pending_handshakes_per_ip"],
            handshake_timeout_s=v["relay_handshake_timeout"],
            max_connections=v["relay_max_connections"],
            exempt_ips=_exempt_ips(
                v["relay_exempt_ip"], _CONNECTIONS.exempt_ips, "relay_exempt_ip"
            ),
            trusted_proxies=self.trusted_proxies,
        )

    def _web_addresses(self) -> tuple[str, ...]:
        from sdsync.store.chat_page import websocket_origin

        addresses = tuple(self.values["web_address"] or ())
        for addr in addresses:
            try:
                websocket_origin(addr)
            except LocalProtocolError as exc:
                raise OptionError("web_address", str(exc)) from None
        return addresses

    def _nodekey(self) -> NodeKeySource:
        return choose_nodekey(
            self.data_dir,
            hex_key=self.values["nodekey"],
            key_file=Path(self.values["nodekey_file"]) if self.values["nodekey_file"] else None,
        )


def db_url(db: str | None, data_dir: Path) -> str:
    """The archive of ``--db``, or the SQLite file in the data dir without it."""
    return db if db is not None else str(data_dir.expanduser() / "store.sqlite3")


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise OptionError("listen", f"expected HOST:PORT, not {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _rate(spec: str, name: str) -> RateLimit | None:
    try:
        return RateLimit.parse(spec)
    except LocalProtocolError as exc:
        raise OptionError(name, str(exc)) from None


def _per_ip(values: Mapping[str, Any], name: str, per_peer: RateLimit | None) -> RateLimit | None:
    """A per-IP rate: as given, else twice the per-peer one (none without one): two
    clients behind one NAT each get their rate, fresh identities from it nothing more."""
    if values[name] is not None:
        return _rate(values[name], name)
    return None if per_peer is None else RateLimit(2 * per_peer.volume, per_peer.period_s)


def _above_zero(values: Mapping[str, Any], name: str) -> float:
    value: float = values[name]
    if value <= 0:
        raise OptionError(name, f"must be above 0, got {value:g}")
    return value


def _size(values: Mapping[str, Any], name: str) -> int:
    """Bytes from ``64MiB`` and the like: a size policy's spelling."""
    spec = values[name]
    try:
        size = RetentionPolicy.parse(f"size:{spec}").limit
    except LocalProtocolError:
        size = 0
    if size < 1:
        raise OptionError(name, f"expected {SIZE} above 0, got {spec!r}")
    return size


def _content_topics(served: Iterable[tuple[str, str | None]]) -> tuple[str, ...]:
    """Waku Sync's content topics: those of the channels archived, if only channels are
    (a shard archived whole: none, so every content topic)."""
    content = [c for _, c in served]
    return () if None in content else tuple(dict.fromkeys(c for c in content if c))


def _addresses(given: Iterable[str], name: str) -> frozenset[str]:
    """IP addresses, each in its canonical spelling (the one a connection reports)."""
    try:
        return frozenset(canonical_ip(ip) for ip in given)
    except ValueError as exc:
        raise OptionError(name, str(exc)) from None


def _exempt_ips(given: Iterable[str] | None, default: frozenset[str], name: str) -> frozenset[str]:
    """A repeatable exemption: ``default`` if not given, none for ``none``; a value that
    is not an IP address (``localhost``) is refused, never silently matched by nothing."""
    if given is None:
        return default
    return _addresses((ip for ip in given if ip != "none"), name)
