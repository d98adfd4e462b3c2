"""``sdsync store …``: run a store node, sync it with another once, export or back up its
archive.

Exit codes: 0 — done (``serve``: stopped by SIGINT/SIGTERM); 1 — ``sync`` failed (the
peer is unreachable, does not speak Store Sync, or answered badly), or ``backup`` could
not copy or write; 2 — bad options or an archive that cannot be opened (``backup``: or
cannot be backed up as asked).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sdsync.cli.config import effective_config, load_config
from sdsync.cli.errors import fail
from sdsync.cli.help import panelled
from sdsync.cli.logs import LogFormat, configure_logging
from sdsync.reconcile import METHODS
from sdsync.transport.settings import ConnectionLimits
from sdsync.waku.relay.topics import SHARD_TOPIC_PREFIX

if TYPE_CHECKING:
    from sdsync.store import RetentionPolicy, SqlArchive
    from sdsync.transport.nodekey import NodeKeySource
    from sdsync.waku.ratelimit import RateLimit
    from sdsync.waku.store.service import AnswerLimits

store_app = typer.Typer(
    help="Store node: archive of Waku messages, 13/WAKU2-STORE v3 REST API, Store Sync, "
    "Parquet export.",
    no_args_is_help=True,
    add_completion=False,
)

DEFAULT_DATA_DIR = Path(os.environ.get("XDG_DATA_HOME") or "~/.local/share") / "sdsync" / "store"
DEFAULT_LISTEN = "127.0.0.1:8645"
DEFAULT_RELAY_LISTEN = "/ip4/127.0.0.1/tcp/0"
DEFAULT_WEB_LISTEN = "/ip4/127.0.0.1/tcp/0/ws"
RELAY_EXEMPT_IPS = ConnectionLimits().exempt_ips
SIZE = "BYTES[KB|MB|GB|KiB|MiB|GiB]"
DataDir = Annotated[
    Path,
    typer.Option("--data-dir", file_okay=False, help="State: SQLite archive, last-online time."),
]
Db = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="postgresql://user@host/db, or a SQLite file (default: DATA_DIR/store.sqlite3).",
    ),
]


# The choices of --sync-method and --method: the reconciliation table's rows, in its order
# (mypy cannot see the members of an enum built from a table).
SyncMethod = StrEnum("SyncMethod", [(name, name) for name in METHODS])  # type: ignore[misc]
NODE_SYNC_METHOD = SyncMethod("riblt")
"""--sync-method's default: SyncConfig's."""
ONCE_SYNC_METHOD = SyncMethod("rbsr")
"""``store sync --method``'s default: the method every Store Sync node speaks."""


def _db_url(db: str | None, data_dir: Path) -> str:
    return db if db is not None else str(data_dir.expanduser() / "store.sqlite3")


def _open_archive(url: str) -> SqlArchive:
    from sdsync.store import open_archive

    try:
        return open_archive(url)
    except Exception as exc:  # any driver's failure to open is the operator's to fix
        raise fail(f"cannot open the archive {url}: {exc}") from None


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise typer.BadParameter(f"expected HOST:PORT, not {listen!r}", param_hint="--listen")
    return host.strip("[]") or "127.0.0.1", int(port)


# `store serve --help`, a panel per concern; tests/cli checks that every option is in one.
SERVE_PANELS = (
    ("Configuration", ("config_file", "print_config")),
    ("Archive", ("db", "data_dir", "retention", "retention_interval", "timestamp_variance")),
    (
        "HTTP API",
        ("listen", "token", "http_idle_timeout", "http_max_connections_per_ip", "http_exempt_ip"),
    ),
    (
        "Relay",
        (
            "pubsub_topic",
            "relay_shard",
            "relay_cluster_id",
            "relay_listen",
            "relay_peer",
            "nodekey",
            "nodekey_file",
            "relay_rate_limit",
        ),
    ),
    (
        "Relay connections",
        (
            "relay_max_connections_per_ip",
            "relay_exempt_ip",
            "relay_pending_handshakes",
            "relay_handshake_timeout",
            "relay_max_connections",
        ),
    ),
    ("Light-client services", ("light", "lightpush_rate_limit", "filter_per_host")),
    ("Store queries over libp2p", ("store_answer_bytes_per_peer", "store_answer_bytes")),
    (
        "Store Resume and Store Sync (HTTP, with other sdsync nodes)",
        (
            "peer",
            "sync_interval",
            "sync_method",
            "sync_window",
            "sync_token",
            "sync_sessions_per_minute",
            "sync_session_burst",
        ),
    ),
    (
        "Waku Sync (libp2p, with nwaku)",
        ("store_sync", "store_sync_interval", "store_sync_range", "store_sync_relay_jitter"),
    ),
    ("Chat page", ("web", "web_address")),
    ("Logs", ("verbose", "log_format")),
)
SERVE_SECRETS = ("token", "sync_token", "nodekey")


def _retention(specs: list[str] | None) -> tuple[RetentionPolicy, ...]:
    from sdsync.errors import LocalProtocolError
    from sdsync.store import RetentionPolicy
    from sdsync.store.retention import DEFAULT_POLICY

    try:
        return tuple(RetentionPolicy.parse(s) for s in specs or [DEFAULT_POLICY] if s != "none")
    except LocalProtocolError as exc:
        raise typer.BadParameter(str(exc), param_hint="--retention") from None


def _config_callback(ctx: typer.Context, value: Path | None) -> Path | None:
    load_config(ctx, value)
    return value


@store_app.command(cls=panelled(SERVE_PANELS))
def serve(
    ctx: typer.Context,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            dir_okay=False,
            is_eager=True,
            callback=_config_callback,
            help="A TOML file of options: each key is a flag without '--' (relay-shard = [7]);"
            " flags and environment variables win over it (docs/store.md).",
        ),
    ] = None,
    print_config: Annotated[
        bool,
        typer.Option(
            "--print-config",
            help="Print the effective configuration (file, environment and flags applied) as"
            " TOML, secrets left out, and exit.",
        ),
    ] = False,
    db: Db = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    listen: Annotated[
        str, typer.Option(help="Where the HTTP API listens, HOST:PORT.")
    ] = DEFAULT_LISTEN,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SDSYNC_STORE_TOKEN",
            help="Bearer token for writes and admin routes (none: writes disabled).",
        ),
    ] = None,
    retention: Annotated[
        list[str] | None,
        typer.Option(
            metavar="time:SECONDS|capacity:N|size:BYTES[GB]",
            help="Retention policy; repeatable; 'none' keeps everything. [default: time:172800]",
        ),
    ] = None,
    retention_interval: Annotated[
        float, typer.Option(min=1.0, help="Seconds between retention runs.")
    ] = 1800.0,
    peer: Annotated[
        list[str] | None,
        typer.Option(
            help="Base URL of another store node, for Store Resume and Store Sync; repeatable."
        ),
    ] = None,
    sync_interval: Annotated[
        float,
        typer.Option(
            min=0.0, help="Seconds between Store Sync rounds with a random --peer; 0: none."
        ),
    ] = 300.0,
    sync_method: Annotated[
        SyncMethod,
        typer.Option(
            help="Reconciliation method of the rounds this node starts (a peer that lacks it"
            " is synced by rbsr)."
        ),
    ] = NODE_SYNC_METHOD,
    sync_window: Annotated[
        float, typer.Option(min=1.0, help="Seconds into the past a round covers (ending 20 s ago).")
    ] = 3600.0,
    pubsub_topic: Annotated[
        list[str] | None,
        typer.Option(
            help="Archive this topic from the Waku relay; repeatable: a shard's pubsub topic"
            " /waku/2/rs/CLUSTER/SHARD (every message on it), or a channel's /sds/1/NAME (its"
            " content topic /sds/1/NAME/proto, on its autoshard). Store Sync then accepts only"
            " these pubsub topics (without: only topics the archive already holds)."
        ),
    ] = None,
    sync_token: Annotated[
        str | None,
        typer.Option(
            envvar="SDSYNC_SYNC_TOKEN",
            help="Shared secret of the federation: required of every Store Sync peer, and sent"
            " to the peers this node syncs with.",
        ),
    ] = None,
    timestamp_variance: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds a message's timestamp may lie ahead of this node's clock; later ones"
            " are refused (nwaku: 20).",
        ),
    ] = 20.0,
    relay_shard: Annotated[
        list[int] | None,
        typer.Option(
            min=0,
            help="Archive every message on this shard of --relay-cluster-id"
            " (/waku/2/rs/CLUSTER/SHARD); repeatable.",
        ),
    ] = None,
    relay_cluster_id: Annotated[
        int, typer.Option(min=0, help="Waku cluster of the relay (1: The Waku Network).")
    ] = 1,
    relay_listen: Annotated[
        list[str] | None,
        typer.Option(
            help="libp2p listen multiaddr of the relay (/ip4/HOST/tcp/PORT, or …/tcp/PORT/ws"
            " for browsers); repeatable. [default: /ip4/127.0.0.1/tcp/0]"
        ),
    ] = None,
    relay_peer: Annotated[
        list[str] | None,
        typer.Option(help="libp2p multiaddr (…/p2p/<id>) of a relay peer; repeatable."),
    ] = None,
    nodekey: Annotated[
        str | None,
        typer.Option(
            envvar="SDSYNC_NODEKEY",
            help="The relay host's libp2p private key: 64 hex characters (secp256k1, as"
            " nwaku's --nodekey), so its peer id stays the same. [default: DATA_DIR/nodekey,"
            " created at first start]",
        ),
    ] = None,
    nodekey_file: Annotated[
        Path | None,
        typer.Option(help="A file holding the relay host's key, as --nodekey takes it."),
    ] = None,
    light: Annotated[
        bool,
        typer.Option(
            help="Serve light clients on the relay host: LightPush (3.0.0, 2.0.0-beta1) and"
            " Filter v2, on the topics archived."
        ),
    ] = True,
    web: Annotated[
        bool,
        typer.Option(
            "--web",
            help="Serve the chat page at /chat/ (a js-waku light node in the browser using this"
            " node). Relays every shard of the cluster unless --relay-shard/--pubsub-topic say"
            f" otherwise, and listens on {DEFAULT_WEB_LISTEN} unless a --relay-listen is"
            " …/ws.",
        ),
    ] = False,
    web_address: Annotated[
        list[str] | None,
        typer.Option(
            help="Multiaddr the chat page dials instead of the WebSocket listeners, e.g. a TLS"
            " proxy's /dns4/HOST/tcp/443/wss (the node's /p2p/<id> is appended); repeatable.",
        ),
    ] = None,
    http_idle_timeout: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds an HTTP connection may go without sending a whole request head,"
            " from its opening or its last answer, before it is closed (nginx's"
            " client_header_timeout: 60).",
        ),
    ] = 60.0,
    # -- connection limits (issue 27): the relay host's (ConnectionLimits), the HTTP API's
    relay_max_connections_per_ip: Annotated[
        int,
        typer.Option(
            min=0,
            help="libp2p connections one IP address may hold at once, handshaking or"
            " established (nwaku's colocation limit: 5); 0: no limit.",
        ),
    ] = 5,
    relay_exempt_ip: Annotated[
        list[str] | None,
        typer.Option(
            help="An IP address not held to --relay-max-connections-per-ip; repeatable;"
            " 'none': none. [default: 127.0.0.1, ::1]"
        ),
    ] = None,
    relay_pending_handshakes: Annotated[
        int,
        typer.Option(min=1, help="libp2p handshakes in progress at once, from all addresses."),
    ] = 64,
    relay_handshake_timeout: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds a libp2p connection may take to finish its handshake."),
    ] = 10.0,
    relay_max_connections: Annotated[
        int,
        typer.Option(
            min=51,
            help="libp2p connections in all, of which 50 are kept for outbound dials"
            " (py-libp2p's default: 300).",
        ),
    ] = 300,
    http_max_connections_per_ip: Annotated[
        int,
        typer.Option(
            min=0,
            help="HTTP connections one IP address may hold open at once; more are closed at"
            " once; 0: no limit.",
        ),
    ] = 64,
    http_exempt_ip: Annotated[
        list[str] | None,
        typer.Option(
            help="An IP address not held to --http-max-connections-per-ip (a local reverse"
            " proxy's); repeatable. [default: none, loopback included]"
        ),
    ] = None,
    # -- end of connection limits
    filter_per_host: Annotated[
        int,
        typer.Option(
            min=1,
            help="Filter subscriptions one host (IP address) may hold, of the node's 1000.",
        ),
    ] = 100,
    lightpush_rate_limit: Annotated[
        str,
        typer.Option(
            metavar="VOLUME/PERIOD|off",
            help="LightPushes one peer may make (a token bucket: nwaku's --rate-limit"
            " lightpush:5/1s on average, bursts of 100); more are answered 429.",
        ),
    ] = "100/20s",
    relay_rate_limit: Annotated[
        str,
        typer.Option(
            metavar="BYTES/PERIOD|off",
            help="Relay bytes one forwarding peer may bring (a token bucket); more are"
            " dropped, neither archived nor relayed.",
        ),
    ] = "32MiB/16s",
    # -- per-peer budgets (issue 27): Store Sync's session rate (SyncConfig), the
    # store-query answers in flight over libp2p (AnswerLimits)
    sync_sessions_per_minute: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Store Sync sessions one remote address may open per minute, on average"
            " (a token bucket); more are answered 429. Above 0.",
        ),
    ] = 12.0,
    sync_session_burst: Annotated[
        int,
        typer.Option(min=1, help="Store Sync sessions one remote address may open at once."),
    ] = 8,
    store_answer_bytes_per_peer: Annotated[
        str,
        typer.Option(
            metavar=SIZE,
            help="Bytes of store-query answers one libp2p peer may be sent per 10 s, read or"
            " not (a page of the largest messages is 15 MB); more are answered 429.",
        ),
    ] = "64MiB",
    store_answer_bytes: Annotated[
        str,
        typer.Option(
            metavar=SIZE,
            help="Bytes of store-query answers all libp2p peers may be sent per 10 s; more"
            " are answered 503.",
        ),
    ] = "256MiB",
    # -- end of per-peer budgets
    # -- Waku Sync over libp2p, named as nwaku's options (issue 35)
    store_sync: Annotated[
        bool,
        typer.Option(
            help="Waku Sync with nwaku and other store nodes over the relay host"
            " (/vac/waku/reconciliation/1.0.0 and /vac/waku/transfer/1.0.0), on the pubsub"
            " topics archived."
        ),
    ] = True,
    store_sync_interval: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds between Waku Sync rounds with a random peer that speaks it;"
            " 0: answer peers only.",
        ),
    ] = 300.0,
    store_sync_range: Annotated[
        float, typer.Option(min=1.0, help="Seconds into the past a Waku Sync round covers.")
    ] = 3600.0,
    store_sync_relay_jitter: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="The newest seconds a Waku Sync round leaves out (messages still in flight).",
        ),
    ] = 20.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
    log_format: Annotated[
        LogFormat,
        typer.Option(help="Log lines as text, or as one JSON object a line for log shippers."),
    ] = LogFormat.text,
) -> None:
    """Serve the archive over HTTP until SIGINT or SIGTERM."""
    if print_config:
        print(effective_config(ctx, SERVE_SECRETS), end="")
        return
    from sdsync.errors import LocalProtocolError
    from sdsync.store import NodeConfig, StoreNode
    from sdsync.store.launch import RelayOptions, WebOptions, run_node
    from sdsync.store.light_clients import LightClientConfig
    from sdsync.store.server import HttpLimits
    from sdsync.store.sync import SyncConfig
    from sdsync.waku.filter.service import FilterLimits
    from sdsync.waku.lightpush.service import ServedTopics
    from sdsync.waku.sync import WakuSyncConfig

    configure_logging(logging.INFO if verbose else logging.WARNING, log_format)
    host, port = parse_listen(listen)
    policies = _retention(retention)
    lightpush_rate = _rate_limit(lightpush_rate_limit, "--lightpush-rate-limit")
    relay_rate = _rate_limit(relay_rate_limit, "--relay-rate-limit")
    relay_topics = _relay_topics(pubsub_topic or (), relay_shard or (), relay_cluster_id)
    if web:
        relay_topics, relay_listen = _web_relay(relay_topics, relay_listen, relay_cluster_id, light)
    served = _served_topics(relay_topics, relay_cluster_id)
    sync_topics = tuple(dict.fromkeys(pubsub_topic for pubsub_topic, _ in served))
    url = _db_url(db, data_dir)
    archive = _open_archive(url)
    _budget_bytes(archive, policies)
    config = NodeConfig(
        data_dir=data_dir.expanduser(),
        listen_host=host,
        port=port,
        token=token,
        retention=policies,
        retention_interval_s=retention_interval,
        peers=tuple(peer or ()),
        relay_topics=relay_topics,
        timestamp_variance_s=timestamp_variance,
        light_clients=LightClientConfig(
            served=ServedTopics(served, cluster_id=relay_cluster_id),
            filter=FilterLimits(max_peers_per_host=filter_per_host),
            lightpush_rate=lightpush_rate,
        ),
        http=HttpLimits(
            idle_timeout_s=http_idle_timeout,
            max_connections_per_ip=http_max_connections_per_ip,
            exempt_ips=_exempt_ips(http_exempt_ip, frozenset()),
        ),
        sync=SyncConfig(
            interval_s=sync_interval or None,
            method=sync_method.value,
            window_s=sync_window,
            pubsub_topics=sync_topics,
            token=sync_token,
            sessions_per_minute=_above_zero(sync_sessions_per_minute, "--sync-sessions-per-minute"),
            session_burst=sync_session_burst,
        ),
        store_answers=_answer_limits(store_answer_bytes_per_peer, store_answer_bytes),
        waku_sync=WakuSyncConfig(
            pubsub_topics=sync_topics,
            content_topics=_content_topics(served),
            interval_s=store_sync_interval,
            range_s=store_sync_range,
            relay_jitter_s=store_sync_relay_jitter,
            clock_skew_s=timestamp_variance,
        )
        if store_sync and relay_topics
        else None,
    )

    identity = _nodekey(data_dir, nodekey, nodekey_file) if config.relay_topics else None
    relay = RelayOptions(
        key=identity.key if identity is not None else None,
        listen=relay_listen or [DEFAULT_RELAY_LISTEN],
        peers=relay_peer or (),
        cluster_id=relay_cluster_id,
        rate=relay_rate,
        limits=_connection_limits(
            relay_max_connections_per_ip,
            relay_pending_handshakes,
            relay_handshake_timeout,
            relay_max_connections,
            _exempt_ips(relay_exempt_ip, RELAY_EXEMPT_IPS),
        )
        if config.relay_topics
        else None,
        light_clients=light,
        store_sync=config.waku_sync is not None,
    )

    web_options = WebOptions(advertise=_web_addresses(web_address or ())) if web else None

    def ready(node: StoreNode, relay_addrs: list[str]) -> None:
        print(
            f"sdsync store: listening on {node.url} ({archive.backend} archive {_redacted(url)}; "
            f"writes {'need the token' if token else 'disabled'})",
            flush=True,
        )
        if relay_addrs:
            print(
                f"sdsync store: relay on {', '.join(relay_addrs)}, "
                f"archiving {', '.join(config.relay_topics)} (Waku relay, cluster "
                f"{relay_cluster_id}); serving {', '.join(relay.protocols)}" + _identity(identity),
                flush=True,
            )
        if web_options is not None:
            _print_chat_help(node.url, relay_addrs)
        logging.getLogger("sdsync.store").info(
            "started: peer id %s, HTTP %s, relay %s, %s archive %s (schema %d), topics %s",
            identity.key.peer_id if identity is not None else "none (no relay)",
            node.url,
            " ".join(relay_addrs) or "none",
            archive.backend,
            _redacted(url),
            archive.schema_version,
            " ".join(config.relay_topics) or "none",
        )

    try:
        asyncio.run(run_node(archive, config, relay, ready, web_options))
    except OSError as exc:
        raise fail(f"cannot listen on {listen}: {exc}") from None
    except LocalProtocolError as exc:  # a bad --relay-listen, --relay-peer or --web-address
        raise fail(f"cannot start the relay: {exc}") from None
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise fail(f"the relay needs the 'p2p' extra ({exc})") from None
    print("sdsync store: stopped", flush=True)


def _nodekey(data_dir: Path, hex_key: str | None, key_file: Path | None) -> NodeKeySource:
    from sdsync.errors import OptionError
    from sdsync.transport.nodekey import choose_nodekey

    try:
        return choose_nodekey(data_dir.expanduser(), hex_key=hex_key, key_file=key_file)
    except OptionError as exc:
        flag = {"nodekey": "--nodekey", "nodekey_file": "--nodekey-file"}.get(exc.option)
        raise typer.BadParameter(str(exc), param_hint=flag or "--data-dir") from None


def _identity(identity: NodeKeySource | None) -> str:
    """The end of the relay line: where the node key came from, and any warning on it."""
    if identity is None:
        return ""
    warning = f" (warning: {identity.warning})" if identity.warning else ""
    return f"; node key {identity.origin}{warning}"


def _web_relay(
    relay_topics: tuple[str, ...], relay_listen: list[str] | None, cluster_id: int, light: bool
) -> tuple[tuple[str, ...], list[str]]:
    """The relay topics and listeners of a node serving the chat page: every shard of the
    cluster when none is named, and a WebSocket listener when none is given."""
    from sdsync.waku.relay.topics import TWN_SHARD_COUNT

    if not light:
        raise typer.BadParameter("the chat page uses the light services", param_hint="--no-light")
    topics = relay_topics or _relay_topics((), range(TWN_SHARD_COUNT), cluster_id)
    listen = list(relay_listen or [DEFAULT_RELAY_LISTEN])
    if not any(addr.rstrip("/").endswith(("/ws", "/wss")) for addr in listen):
        listen.append(DEFAULT_WEB_LISTEN)
    return topics, listen


def _web_addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    from sdsync.errors import LocalProtocolError
    from sdsync.store.chat_page import websocket_origin

    for addr in addresses:
        try:
            websocket_origin(addr)
        except LocalProtocolError as exc:
            raise typer.BadParameter(str(exc), param_hint="--web-address") from None
    return tuple(addresses)


def _print_chat_help(url: str, relay_addrs: list[str]) -> None:
    """Where to open the chat page, and the terminal chat that joins the same channel."""
    tcp = next((addr for addr in relay_addrs if "/ws" not in addr), None)
    print(f"sdsync store: chat page on {url}/chat/?channel=room", flush=True)
    if tcp is not None:
        print(
            f"sdsync store: terminal chat: sdsync chat --channel room --peer {tcp} --store {tcp}",
            flush=True,
        )


def _rate_limit(spec: str, option: str) -> RateLimit | None:
    from sdsync.errors import LocalProtocolError
    from sdsync.waku.ratelimit import RateLimit

    try:
        return RateLimit.parse(spec)
    except LocalProtocolError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def _above_zero(value: float, option: str) -> float:
    if value <= 0:
        raise typer.BadParameter(f"must be above 0, got {value:g}", param_hint=option)
    return value


def _answer_limits(per_peer: str, total: str) -> AnswerLimits:
    from sdsync.waku.store.service import AnswerLimits

    return AnswerLimits(
        per_peer_bytes=_size(per_peer, "--store-answer-bytes-per-peer"),
        total_bytes=_size(total, "--store-answer-bytes"),
    )


def _size(spec: str, option: str) -> int:
    """Bytes from ``64MiB`` and the like: --retention's size:… spelling."""
    from sdsync.errors import LocalProtocolError
    from sdsync.store import RetentionPolicy

    try:
        size = RetentionPolicy.parse(f"size:{spec}").limit
    except LocalProtocolError:
        size = 0
    if size < 1:
        raise typer.BadParameter(f"expected {SIZE} above 0, got {spec!r}", param_hint=option)
    return size


def _budget_bytes(archive: SqlArchive, policies: Iterable[RetentionPolicy]) -> None:
    """Enforce the smallest size policy as the archive grows too, not only every
    retention interval: a flood cannot fill the disk in between."""
    from sdsync.store.retention import ByteBudget

    sizes = [p for p in policies if p.kind == "size"]
    if sizes:
        archive.size_watch = ByteBudget(min(sizes, key=lambda p: p.limit))


def _relay_topics(
    pubsub_topics: Iterable[str], shards: Iterable[int], cluster_id: int
) -> tuple[str, ...]:
    """The topics the relay archives: ``--pubsub-topic``s, then ``--relay-shard``s' topics."""
    from sdsync.waku.relay.topics import shard_pubsub_topic

    own = f"{SHARD_TOPIC_PREFIX}{cluster_id}/"
    for topic in pubsub_topics:
        if topic.startswith(SHARD_TOPIC_PREFIX) and not topic.startswith(own):
            raise typer.BadParameter(
                f"{topic} is not on cluster {cluster_id} (--relay-cluster-id)",
                param_hint="--pubsub-topic",
            )
    shard_topics = (shard_pubsub_topic(cluster_id, shard) for shard in shards)
    return tuple(dict.fromkeys([*pubsub_topics, *shard_topics]))


def _content_topics(served: Iterable[tuple[str, str | None]]) -> tuple[str, ...]:
    """The content topics Waku Sync is restricted to: those of the channels archived, if
    only channels are (a shard archived whole: none, every content topic)."""
    content = [c for _, c in served]
    return () if None in content else tuple(dict.fromkeys(c for c in content if c))


def _served_topics(
    relay_topics: Iterable[str], cluster_id: int
) -> tuple[tuple[str, str | None], ...]:
    """What the relay of ``relay_topics`` archives: (pubsub topic, content topic) pairs —
    a shard's topic with every content topic (None), a channel's content topic on its
    autoshard (as the transport routes them)."""
    channels = [t for t in relay_topics if not t.startswith(SHARD_TOPIC_PREFIX)]
    if not channels:
        return tuple((topic, None) for topic in relay_topics)
    from sdsync.errors import LocalProtocolError

    try:
        from sdsync.transport.libp2p import WakuRelayConfig
        from sdsync.waku.relay.topics import default_content_topic
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise fail(f"the relay needs the 'p2p' extra ({exc})") from None
    waku = WakuRelayConfig(cluster_id=cluster_id)
    try:
        content = {t: default_content_topic(t) for t in channels}
        shards = {t: waku.pubsub_topic(c) for t, c in content.items()}
    except LocalProtocolError as exc:
        raise typer.BadParameter(str(exc), param_hint="--pubsub-topic") from None
    return tuple((shards.get(t, t), content.get(t)) for t in relay_topics)


def _exempt_ips(given: list[str] | None, default: frozenset[str]) -> frozenset[str]:
    """The addresses of a repeatable ``--…-exempt-ip``: ``default`` if not given, none
    for ``none``."""
    if given is None:
        return default
    return frozenset(ip for ip in given if ip != "none")


def _connection_limits(
    per_ip: int,
    pending: int,
    handshake_timeout_s: float,
    max_connections: int,
    exempt: frozenset[str],
) -> ConnectionLimits:
    """The relay host's ConnectionLimits from the --relay-* connection flags."""

    return ConnectionLimits(
        per_ip=per_ip,
        pending=pending,
        handshake_timeout_s=handshake_timeout_s,
        max_connections=max_connections,
        exempt_ips=exempt,
    )


def _redacted(url: str) -> str:
    """``url`` without a password, for logs."""
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{location}"


@store_app.command()
def sync(
    peer: Annotated[str, typer.Option(help="Base URL of the store node to sync with.")],
    method: Annotated[SyncMethod, typer.Option(help="Reconciliation method.")] = ONCE_SYNC_METHOD,
    window: Annotated[
        float, typer.Option(min=1.0, help="Seconds into the past to sync (ending 20 s ago).")
    ] = 3600.0,
    db: Db = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    sync_token: Annotated[
        str | None,
        typer.Option(
            envvar="SDSYNC_SYNC_TOKEN", help="The peer's Store Sync token, if it has one."
        ),
    ] = None,
) -> None:
    """Sync the local archive with PEER once (Store Sync: reconcile, then transfer)."""
    from sdsync.errors import RemoteProtocolError, ServiceUnavailable
    from sdsync.store.sync import ArchiveKeeper, SyncConfig, sync_with_peer

    url = _db_url(db, data_dir)
    archive = _open_archive(url)
    span = SyncConfig(window_s=window).window(time.time_ns())
    try:
        report = asyncio.run(
            sync_with_peer(
                ArchiveKeeper(archive), peer, span, method=method.value, token=sync_token
            )
        )
    except (ServiceUnavailable, RemoteProtocolError) as exc:
        raise fail(f"sync with {peer} failed: {exc}", code=1) from None
    finally:
        archive.close()
    if as_json:
        print(json.dumps(report.as_dict()))
        return
    print(
        f"synced {_redacted(url)} with {report.peer} ({report.method}, "
        f"{window:g} s window, {report.items} local items)\n"
        f"  differences: we lacked {report.need}, the peer lacked {report.have}\n"
        f"  sent {report.sent} messages ({report.peer_stored} new to the peer), "
        f"received {report.received} ({report.stored} new)\n"
        f"  bytes sent {report.bytes_sent:,} (frames {report.frame_bytes_sent:,}), "
        f"received {report.bytes_received:,} (frames {report.frame_bytes_received:,})\n"
        f"  {report.round_trips} round trips, {report.requests} requests, "
        f"{report.seconds:.2f} s"
    )


@store_app.command()
def export(
    parquet: Annotated[
        Path, typer.Option("--parquet", file_okay=False, help="Output directory (Parquet dataset).")
    ],
    db: Db = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    start: Annotated[int | None, typer.Option(help="From this time, Unix ns (inclusive).")] = None,
    end: Annotated[int | None, typer.Option(help="Up to this time, Unix ns (exclusive).")] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace files a previous export wrote.")
    ] = False,
) -> None:
    """Export the archive as Parquet for `sdsync pipeline reconcile` (see docs/store.md)."""
    import pyarrow as pa

    from sdsync.store import export_parquet

    url = _db_url(db, data_dir)
    if db is None and not Path(url).exists():
        raise fail(f"no archive at {url} (give --db or --data-dir)")
    archive = _open_archive(url)
    try:
        report = export_parquet(archive, parquet, start=start, end=end, overwrite=overwrite)
    except (pa.ArrowException, OSError) as exc:
        raise fail(f"cannot export to {parquet}: {exc}") from None
    finally:
        archive.close()
    print(f"exported {report.rows} messages in {report.files} files to {parquet}")


@store_app.command()
def backup(
    path: Annotated[
        Path,
        typer.Argument(
            metavar="PATH", dir_okay=False, help="The backup file to write (a SQLite archive)."
        ),
    ],
    db: Db = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace PATH if it exists.")
    ] = False,
) -> None:
    """Copy the SQLite archive to PATH, while the node serves (see docs/store.md)."""
    from rich.console import Console

    from sdsync.store.backup import BackupFailed, BackupRefusedError, backup_archive

    url = _db_url(db, data_dir)
    err = Console(stderr=True)
    with err.status("backing up…") as status:

        def progress(copied: int, total: int) -> None:
            if copied < total:
                status.update(f"backing up: {copied / 1e6:,.1f} of {total / 1e6:,.1f} MB")
            else:
                status.update("checking the copy…")

        try:
            report = backup_archive(url, path, overwrite=overwrite, progress=progress)
        except BackupRefusedError as exc:
            raise fail(str(exc), console=err) from None
        except BackupFailed as exc:
            raise fail(f"backup failed: {exc}", code=1, console=err) from None
    print(
        f"backed up {report.messages} messages ({report.bytes / 1e6:.1f} MB) from "
        f"{report.source} to {report.path} in {report.seconds:.2f} s"
    )
