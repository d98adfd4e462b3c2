"""``sdsync store …``: run a store node, sync it with another once, export or back up its
archive.

``store serve``'s options are the node's settings (:mod:`sdsync.store.settings`), made into
flags there: this module adds only the run's own (``--config``, ``--print-config``, the
logs) and prints.

Exit codes: 0 — done (``serve``: stopped by SIGINT/SIGTERM); 1 — ``sync`` failed (the
peer is unreachable, does not speak Store Sync, or answered badly), or ``backup`` could
not copy or write; 2 — bad options or an archive that cannot be opened (``backup``: or
cannot be backed up as asked).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sdsync.cli.config import effective_config, load_config
from sdsync.cli.errors import fail
from sdsync.cli.help import LISTED, panelled
from sdsync.cli.logs import LogFormat, configure_logging
from sdsync.cli.settings import with_settings
from sdsync.reconcile import METHODS
from sdsync.store.settings import BY_NAME, SETTINGS, NodePlan, db_url, plan_node

if TYPE_CHECKING:
    from sdsync.store import SqlArchive
    from sdsync.transport.nodekey import NodeKeySource

store_app = typer.Typer(
    help="Store node: archive of Waku messages, 13/WAKU2-STORE v3 REST API, Store Sync, "
    "Parquet export.",
    no_args_is_help=True,
    add_completion=False,
)

DataDir = Annotated[
    Path,
    typer.Option("--data-dir", file_okay=False, help=BY_NAME["data_dir"].help),
]
Db = Annotated[str | None, typer.Option("--db", help=BY_NAME["db"].help)]
DEFAULT_DATA_DIR: Path = BY_NAME["data_dir"].default

# `store sync --method`'s choices: the reconciliation table's rows, in its order (mypy
# cannot see the members of an enum built from a table).
SyncMethod = StrEnum("SyncMethod", [(name, name) for name in METHODS])  # type: ignore[misc]
ONCE_SYNC_METHOD = SyncMethod("rbsr")
"""``store sync --method``'s default: the method every Store Sync node speaks."""


def _open_archive(url: str) -> SqlArchive:
    from sdsync.store import open_archive

    try:
        return open_archive(url)
    except Exception as exc:  # any driver's failure to open is the operator's to fix
        raise fail(f"cannot open the archive {url}: {exc}") from None


# `store serve --help`: the run's own options, then a panel per group of settings.
RUN_OPTIONS = ("config_file", "print_config")
LOG_OPTIONS = ("verbose", "log_format")
SERVE_PANELS = (
    ("Configuration", RUN_OPTIONS),
    *(
        (group, tuple(s.name for s in SETTINGS if s.group == group))
        for group in dict.fromkeys(s.group for s in SETTINGS)
    ),
    ("Logs", LOG_OPTIONS),
)
SERVE_SECRETS = tuple(s.name for s in SETTINGS if s.secret)


def _config_callback(ctx: typer.Context, value: Path | None) -> Path | None:
    load_config(ctx, value)
    return value


@store_app.command(cls=panelled(SERVE_PANELS))
@with_settings(SETTINGS, after=LOG_OPTIONS)
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
            help="Check the effective configuration (file, environment and flags applied),"
            " print it as TOML, secrets left out, and exit.",
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
    log_format: Annotated[
        LogFormat,
        typer.Option(help="Log lines as text, or as one JSON object a line for log shippers."),
    ] = LogFormat.text,
    **settings: Any,
) -> None:
    """Serve the archive over HTTP until SIGINT or SIGTERM."""
    if print_config:
        _plan(settings, identity=False)
        print(effective_config(ctx, SERVE_SECRETS), end="")
        return
    from sdsync.errors import LocalProtocolError
    from sdsync.store.launch import run_node
    from sdsync.store.memory import limit_arenas
    from sdsync.store.retention import ByteBudget

    configure_logging(logging.INFO if verbose else logging.WARNING, log_format)
    limit_arenas()  # before any thread allocates
    plan = _plan(settings, identity=True)
    archive = _open_archive(plan.db_url)
    if plan.size_policy is not None:
        archive.size_watch = ByteBudget(plan.size_policy)
    try:
        asyncio.run(
            run_node(
                archive,
                plan.config,
                plan.relay,
                lambda node, relay_addrs: _started(plan, archive, node.url, relay_addrs),
                plan.web,
            )
        )
    except OSError as exc:
        raise fail(f"cannot listen on {settings['listen']}: {exc}") from None
    except LocalProtocolError as exc:  # a bad --relay-listen, --relay-peer or --web-address
        raise fail(f"cannot start the relay: {exc}") from None
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise fail(f"the relay needs the 'p2p' extra ({exc})") from None
    print("sdsync store: stopped", flush=True)


def _plan(settings: dict[str, Any], *, identity: bool) -> NodePlan:
    """The node of the options, or the usage error of the first one it cannot use."""
    from sdsync.errors import OptionError

    try:
        return plan_node(settings, identity=identity)
    except OptionError as exc:
        raise typer.BadParameter(str(exc), param_hint=BY_NAME[exc.option].flag) from None


def _started(plan: NodePlan, archive: SqlArchive, url: str, relay_addrs: list[str]) -> None:
    """The lines that say the node runs: where, on what, and for whom."""
    config, identity = plan.config, plan.identity
    token = plan.values["token"]
    print(
        f"sdsync store: listening on {url} ({archive.backend} archive {_redacted(plan.db_url)};"
        f" writes {'need the token' if token else 'disabled'})",
        flush=True,
    )
    if relay_addrs:
        print(
            f"sdsync store: relay on {', '.join(relay_addrs)}, "
            f"archiving {', '.join(config.relay_topics)} (Waku relay, cluster "
            f"{plan.relay.cluster_id}); serving {', '.join(plan.relay.protocols)}"
            + _identity(identity),
            flush=True,
        )
    if plan.web is not None:
        _print_chat_help(url, relay_addrs)
    logging.getLogger("sdsync.store").info(
        "started: peer id %s, HTTP %s, relay %s, %s archive %s (schema %d), topics %s",
        identity.key.peer_id if identity is not None else "none (no relay)",
        url,
        " ".join(relay_addrs) or "none",
        archive.backend,
        _redacted(plan.db_url),
        archive.schema_version,
        " ".join(config.relay_topics) or "none",
    )


def _identity(identity: NodeKeySource | None) -> str:
    """The end of the relay line: where the node key came from, and any warning on it."""
    if identity is None:
        return ""
    warning = f" (warning: {identity.warning})" if identity.warning else ""
    return f"; node key {identity.origin}{warning}"


def _print_chat_help(url: str, relay_addrs: list[str]) -> None:
    """Where to open the chat page, and the terminal chat that joins the same channel, or
    why there is none (a terminal chat dials TCP only)."""
    print(f"sdsync store: chat page on {url}/chat/?channel=room", flush=True)
    tcp = next((addr for addr in relay_addrs if "/ws" not in addr), None)
    if tcp is None:
        print(
            "sdsync store: terminal chat: none, the node listens on no TCP address "
            "(a terminal chat dials TCP): add --relay-listen /ip4/127.0.0.1/tcp/0",
            flush=True,
        )
        return
    print(
        f"sdsync store: terminal chat: {_sdsync()} chat --channel room --peer {tcp} --store {tcp}",
        flush=True,
    )


def _sdsync() -> str:
    """How to run this ``sdsync`` from where it was started: its bare name only if that
    is what the PATH finds (after ``make``, it is ``.venv/bin/sdsync`` until the venv is
    activated)."""
    ours = Path(sys.argv[0])
    found = shutil.which("sdsync")
    if found is not None and ours.exists() and Path(found).resolve() == ours.resolve():
        return "sdsync"
    return str(ours) if ours.name == "sdsync" else f"{sys.executable} -m sdsync.cli"


def _redacted(url: str) -> str:
    """``url`` without a password, for logs."""
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{location}"


@store_app.command(cls=LISTED)
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

    url = db_url(db, data_dir)
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


@store_app.command(cls=LISTED)
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

    url = db_url(db, data_dir)
    if db is None and not Path(url).exists():
        raise fail(f"no archive at {url} (give --db or --data-dir)")
    archive = _open_archive(url)
    try:
        report = export_parquet(archive, parquet, start=start, end=end, overwrite=overwrite)
    except (pa.ArrowException, OSError) as exc:
        raise fail(f"cannot export to {parquet}: {exc}") from None
    finally:
        archive.close()
    if not report.rows:
        span = "" if start is None and end is None else " in the range given"
        raise fail(f"nothing to export: no messages{span} in {url}; {parquet} not written", 1)
    print(f"exported {report.rows:,} messages in {report.files:,} files to {parquet}")


@store_app.command(cls=LISTED)
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

    url = db_url(db, data_dir)
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
