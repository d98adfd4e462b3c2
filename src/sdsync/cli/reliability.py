"""``sdsync reliability serve``: the seed-004 reliability API over gRPC (:mod:`sdsync.reliability`).

The server listens on loopback unless ``--allow-remote`` says otherwise: the service has
no transport security, and its token (``--token``, or ``SDSYNC_RELIABILITY_TOKEN`` to keep
it out of the process list) only keeps other local users out. The first line on stdout is
``listening on HOST:PORT`` with the real port (``--listen 127.0.0.1:0`` picks a free one),
for a supervisor or a test to read; logs go to stderr. It runs until SIGINT or SIGTERM,
then closes the manager and its state.

The protocol parameters are the ``--profile``'s, each flag given overriding its value, as
for ``sdsync peer``; the message ids are the profile's scheme by default (sdsync's
never-colliding one) rather than the peer's @waku/sds-compatible one.

The server acknowledges events only when the application does (``AckEvents`` or an
``Events`` resume point) and, with ``--state-dir``, reopens at start every channel stored
there that the application did not close (``CloseChannel``); more than
``--max-channels`` of them is an error at start.

Event streams are bounded (``--max-event-streams`` in all,
``--max-event-streams-per-peer`` per client connection) and a stream whose reader takes
nothing for ``--event-write-timeout-s`` is cancelled (:mod:`sdsync.reliability.server`).

Without ``--participant`` the participant id is a random one, kept in
``<state-dir>/participant`` when there is a state directory, so that a restart from the
same directory is the same participant.

Exit codes: 0 — stopped by a signal; 2 — bad options, an unusable state directory, or an
address it cannot listen on.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import signal
import sys
import threading
import uuid
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from sdsync.cli.errors import fail
from sdsync.cli.help import LISTED
from sdsync.cli.options import (
    DEFAULT_PROFILE,
    NOT_GIVEN,
    BloomCapacity,
    BloomErrorRate,
    CausalHistory,
    LostTimeoutMs,
    PossibleAcksThreshold,
    ProfileOption,
    Repair,
    RepairResponseGroups,
    RepairTMaxMs,
    RepairTMinMs,
    chosen_profile,
    given,
    message_id_scheme,
)
from sdsync.cli.peer import peer_config
from sdsync.core.config import MessageIdScheme
from sdsync.errors import LocalProtocolError
from sdsync.runtime.event_log import DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_EVENTS, EventLimits

if TYPE_CHECKING:
    from sdsync.reliability import ReliabilityServer

reliability_app = typer.Typer(
    help="The seed-004 reliability API (wrap, unwrap, events) for applications in any "
    "language, over gRPC.",
    no_args_is_help=True,
    add_completion=False,
)

DEFAULT_LISTEN = "127.0.0.1:50051"
_PARTICIPANT_FILE = "participant"


def split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as host and port; ValueError if malformed."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65_535:
        raise ValueError(f"{listen!r} is not HOST:PORT")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def participant_id(given_id: str | None, state_dir: Path | None) -> str:
    """The id given; else the one kept in the state directory; else a new one (kept)."""
    if given_id is not None:
        return given_id
    if state_dir is None:
        return uuid.uuid4().hex
    kept = state_dir / _PARTICIPANT_FILE
    if kept.exists():
        return kept.read_text().strip()
    new = uuid.uuid4().hex
    kept.write_text(new + "\n")
    return new


@reliability_app.command("serve", cls=LISTED)
def serve_command(
    listen: Annotated[
        str, typer.Option(help="HOST:PORT to listen on; port 0 picks a free one.")
    ] = DEFAULT_LISTEN,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote", help="Allow a non-loopback --listen (the service has no TLS)."
        ),
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False, help="Keep every channel's state here (crash-consistent SQLite)."
        ),
    ] = None,
    participant: Annotated[
        str | None,
        typer.Option(
            help="Our participant (sender) id. Default: a random one, kept in "
            "<state-dir>/participant so that a restart is the same participant.",
            show_default=False,
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SDSYNC_RELIABILITY_TOKEN",
            help="Require call metadata 'authorization: Bearer TOKEN'.",
        ),
    ] = None,
    profile: ProfileOption = DEFAULT_PROFILE,
    causal_history: CausalHistory = None,
    bloom_capacity: BloomCapacity = None,
    bloom_error_rate: BloomErrorRate = None,
    possible_acks_threshold: PossibleAcksThreshold = None,
    lost_timeout_ms: LostTimeoutMs = None,
    repair: Repair = None,
    repair_t_min_ms: RepairTMinMs = None,
    repair_t_max_ms: RepairTMaxMs = None,
    repair_response_groups: RepairResponseGroups = None,
    message_id: Annotated[
        str | None,
        typer.Option(
            "--message-id",
            help="Default message ids: 'payload' (sha256 of the payload, as @waku/sds) or"
            " 'sender-lamport-payload' (never colliding); default: the profile's.",
        ),
    ] = None,
    sync_interval_ms: Annotated[int | None, typer.Option(min=1, help=NOT_GIVEN)] = None,
    resend_interval_ms: Annotated[int | None, typer.Option(min=1, help=NOT_GIVEN)] = None,
    max_attempts: Annotated[int | None, typer.Option(min=1, help=NOT_GIVEN)] = None,
    max_channels: Annotated[int, typer.Option(min=1, help="Open channels at most.")] = 1_000,
    max_incoming_buffer_bytes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Bytes of received messages waiting for dependencies, per channel; beyond,"
            " the one missing the most gives way [default: 64 MiB].",
        ),
    ] = None,
    max_events: Annotated[
        int,
        typer.Option(
            min=2,
            help="Unacknowledged events kept per channel; beyond, the oldest are discarded"
            " and an EventsDiscarded event says which.",
        ),
    ] = DEFAULT_MAX_EVENTS,
    max_event_bytes: Annotated[
        int,
        typer.Option(
            min=1, help="Bytes of unacknowledged events (payloads, transmits) kept per channel."
        ),
    ] = DEFAULT_MAX_EVENT_BYTES,
    # Defaults: the server's (grpc is imported only once the options are checked).
    max_event_streams: Annotated[
        int | None,
        typer.Option(min=1, help="Events/EventBatches streams open at once [default: 8]."),
    ] = None,
    max_event_streams_per_peer: Annotated[
        int | None,
        typer.Option(min=1, help="Event streams on one client connection [default: 4]."),
    ] = None,
    event_write_timeout_s: Annotated[
        float | None,
        typer.Option(
            min=0.1,
            help="Cancel an event stream whose reader takes nothing for this long [default: 10].",
        ),
    ] = None,
) -> None:
    """Serve one participant's reliability state over gRPC until SIGINT or SIGTERM."""
    from sdsync.reliability import ReliabilityServer
    from sdsync.runtime.manager import ReliabilityManager

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    try:
        host, _ = split_listen(listen)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--listen") from None
    if not is_loopback(host) and not allow_remote:
        raise typer.BadParameter(
            f"{host} is not a loopback address; add --allow-remote to listen there",
            param_hint="--listen",
        )
    chosen = chosen_profile(profile)
    scheme: MessageIdScheme = (
        chosen.channel.message_id_scheme if message_id is None else message_id_scheme(message_id)
    )
    try:
        config = peer_config(
            chosen,
            scheme,
            causal_history=causal_history,
            bloom_capacity=bloom_capacity,
            bloom_error_rate=bloom_error_rate,
            possible_acks_threshold=possible_acks_threshold,
            lost_timeout_ms=lost_timeout_ms,
            repair=repair,
            repair_t_min_ms=repair_t_min_ms,
            repair_t_max_ms=repair_t_max_ms,
            repair_response_groups=repair_response_groups,
        )
        config = dataclasses.replace(
            config,
            own_log_policy="on_ack",  # seed 004
            **given(max_incoming_buffer_bytes=max_incoming_buffer_bytes),
        )
        runtime = dataclasses.replace(
            chosen.runtime,
            **given(
                sync_interval_ms=sync_interval_ms,
                resend_interval_ms=resend_interval_ms,
                max_attempts=max_attempts,
            ),
        )
    except (ValueError, LocalProtocolError) as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)
        manager = ReliabilityManager(
            participant_id(participant, state_dir),
            config=config,
            runtime=runtime,
            state_dir=state_dir,
            max_channels=max_channels,
            acknowledge="explicit",
            event_limits=EventLimits(max_events, max_event_bytes),
        )
        manager.reopen_channels()
    except (OSError, LocalProtocolError) as exc:
        raise fail(str(exc)) from None
    try:
        server = ReliabilityServer(
            manager,
            listen,
            token=token,
            **given(
                max_subscribers=max_event_streams,
                max_subscribers_per_peer=max_event_streams_per_peer,
                write_timeout_s=event_write_timeout_s,
            ),
        )
    except OSError as exc:
        manager.close()
        raise fail(str(exc)) from None
    _run(server, f"{host}:{server.port}")  # and closes the manager


def _run(server: ReliabilityServer, address: str) -> None:
    """Start, say where, wait for SIGINT or SIGTERM, stop."""
    stopping = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    server.start()
    print(f"listening on {address}", flush=True)
    while not stopping.wait(0.5):
        pass
    server.stop()
