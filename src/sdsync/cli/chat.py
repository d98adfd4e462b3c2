"""`sdsync chat`: a terminal group chat over gossipsub that survives restarts.

Theory of operation
-------------------
One process is one participant of one channel: a :class:`ReliableChannel` over a
:class:`~sdsync.transport.Libp2pTransport`. The state directory holds who we are
(``chat.json``: participant id, libp2p key, the address we last listened on — reused so
the ``--peer`` addresses others were given stay valid) next to the channel's own state.

:class:`ChatSession` is the chat's view of the channel, built from its events: the status
of each of our messages (sent → possibly acknowledged → acknowledged, or failed) and the
text of every message. A message from others is shown as soon as it arrives — marked with
how many earlier messages are missing if it has to wait for them (``deliver_early``), and
confirmed in place once they arrived; one that lands before lines already shown (older by
Lamport timestamp) is marked as such.

*Converged* (``--wait-converged``) is a local judgement: nothing of ours unacknowledged,
nothing waiting in the incoming buffer, no message we know of missing (the driver's sync
status), messages or syncs heard from at least ``--min-peers`` other participants, and no
change for a quiet period of a few sync intervals — long enough that every peer has sent a
sync message naming its newest messages, so a message we never heard of would have shown
up as missing. A received duplicate is a change: some peer is still resending. A
converged chat lingers one more quiet period before it exits: peers still catching up may
need its syncs and repairs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from sdsync.core import (
    ChannelConfig,
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageDeliveredEarly,
    MessageLost,
    MessagePossiblyAcknowledged,
    MessageReceived,
    RepairConfig,
    SendFailed,
    SyncReceived,
    SyncSent,
)
from sdsync.errors import LocalProtocolError, OutgoingBufferFullError
from sdsync.runtime import LogRecord, ReliableChannel, RuntimeConfig

if TYPE_CHECKING:
    from sdsync.store.client import HttpStoreClient
    from sdsync.transport.libp2p import Libp2pTransport

CHAT_FILE = "chat.json"
DEFAULT_LISTEN = "/ip4/127.0.0.1/tcp/0"
# Events that change nothing a converged judgement looks at. (A duplicate is not one of
# them: it is a peer resending, so that peer still lacks an acknowledgement.)
_QUIET_EVENTS = (SyncSent, SyncReceived)


# ------------------------------------------------------------------ identity


@dataclass(frozen=True, slots=True)
class Identity:
    participant_id: str
    key: bytes
    listen: str | None = None


def load_identity(state_dir: Path | None, name: str | None) -> Identity:
    """Who we are: from the state directory, else new (and then stored there)."""
    from sdsync.transport.libp2p import new_identity_key

    path = state_dir / CHAT_FILE if state_dir is not None else None
    if path is None or not path.exists():
        identity = Identity(name or f"user-{secrets.token_hex(4)}", new_identity_key())
        if state_dir is not None:
            save_identity(state_dir, identity)
        return identity
    try:
        stored = json.loads(path.read_text())
        identity = Identity(
            stored["participant_id"], bytes.fromhex(stored["key_hex"]), stored.get("listen")
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LocalProtocolError(f"{path} is not a chat identity file: {exc}") from None
    if name is not None and name != identity.participant_id:
        raise LocalProtocolError(
            f"{state_dir} belongs to {identity.participant_id!r}, not {name!r}: "
            "use another --state-dir, or leave --name out"
        )
    return identity


def save_identity(state_dir: Path, identity: Identity) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / CHAT_FILE
    tmp = path.with_suffix(".tmp")
    record = {
        "participant_id": identity.participant_id,
        "key_hex": identity.key.hex(),
        "listen": identity.listen,
    }
    # The file holds a private key: owner-only, written whole or not at all.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


# ------------------------------------------------------------------ options


@dataclass(frozen=True, slots=True)
class ChatOptions:
    channel: str = "0"
    name: str | None = None
    state_dir: Path | None = None
    listen: str | None = None
    peers: tuple[str, ...] = ()
    store: str | None = None
    drop_rate: float = 0.0
    seed: int | None = None
    sends: tuple[str, ...] = ()
    send_interval_ms: int = 0
    wait_converged_s: float | None = None
    quiet_ms: int | None = None
    min_peers: int = 0
    print_log: bool = False
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    config: ChannelConfig = field(default_factory=ChannelConfig)

    @property
    def scripted(self) -> bool:
        return bool(self.sends) or self.wait_converged_s is not None or self.print_log

    @property
    def quiet_s(self) -> float:
        """Default: three sync intervals, so every peer has synced meanwhile."""
        ms = self.quiet_ms if self.quiet_ms is not None else 3 * self.runtime.sync_interval_ms
        return ms / 1000


# ------------------------------------------------------------------ session

SENT = "sent"
POSSIBLY_ACKNOWLEDGED = "possibly acknowledged"
ACKNOWLEDGED = "acknowledged"
FAILED = "failed"


@dataclass(slots=True)
class Line:
    """One message of the log as the chat shows and prints it."""

    message_id: str
    sender_id: str
    lamport_timestamp: int
    text: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "message_id": self.message_id,
                "sender_id": self.sender_id,
                "lamport_timestamp": self.lamport_timestamp,
                "text": self.text,
            },
            ensure_ascii=False,
        )


class ChatSession:
    """The chat's view of one ReliableChannel."""

    def __init__(self, channel: ReliableChannel, console: Console) -> None:
        self.channel = channel
        self.console = console
        self.me = channel.channel.participant_id
        self.status: dict[str, str] = {}
        self.lines: dict[str, Line] = {}
        self.shown_early: set[str] = set()
        self.heard_from: set[str] = set()
        self.changed_at = time.monotonic()
        self._last_ns = 0
        self._newest_shown: tuple[int, str] = (0, "")

    # Sending

    async def send(self, text: str) -> str:
        # Our own id (sender, time, text): identical texts must not collide, which the
        # default id (hash of the payload) would.
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        seed = f"{self.me}\x00{self._last_ns}\x00{text}".encode()
        message_id = hashlib.sha256(seed).hexdigest()
        # Known before sending: an acknowledgement may be processed while we publish.
        self.status[message_id] = SENT
        self.lines[message_id] = line = Line(message_id, self.me, 0, text)
        try:
            await self.channel.send(text.encode(), message_id=message_id)
        except BaseException:
            del self.status[message_id], self.lines[message_id]
            raise
        entry = self.channel.channel.log.get(message_id)
        line.lamport_timestamp = entry.lamport_timestamp if entry is not None else 0
        self._shown_before(line.lamport_timestamp, message_id)
        self._say(f"→ {_tag(message_id)} {escape(self.me)}: {escape(text)} · {SENT}")
        return message_id

    # Events

    async def pump(self, events: AsyncIterator[Event]) -> None:
        async for event in events:
            self.on_event(event)

    def on_event(self, event: Event) -> None:
        if not isinstance(event, _QUIET_EVENTS):
            self.changed_at = time.monotonic()
        mid = event.message_id
        if isinstance(event, SyncReceived | MessageReceived):
            self.heard_from.add(event.sender_id)
        if isinstance(event, MessageDeliveredEarly):
            self.shown_early.add(mid)
            # On screen now, so a missing message that arrives later lands above it.
            self._shown_before(event.lamport_timestamp, mid)
            marker = f"⚠ ({event.missing_dependencies} earlier missing) "
            self._show(mid, event.sender_id, event.lamport_timestamp, event.content, marker)
        elif isinstance(event, MessageDelivered):
            self._delivered(event)
        elif isinstance(event, MessageLost):
            self._say(f"✗ {_tag(mid)} given up as lost", style="red")
        elif isinstance(event, MessagePossiblyAcknowledged) and mid in self.status:
            if self.status[mid] == SENT:
                self._set_status(mid, POSSIBLY_ACKNOWLEDGED, f"(seen by {event.acker_id})")
        elif isinstance(event, MessageAcknowledged) and mid in self.status:
            self._set_status(mid, ACKNOWLEDGED, f"by {event.acker_id}", style="green")
        elif isinstance(event, SendFailed) and mid in self.status:
            self._set_status(mid, FAILED, "no peer acknowledged it", style="red")

    def _delivered(self, event: MessageDelivered) -> None:
        mid = event.message_id
        if mid in self.shown_early:
            self.shown_early.discard(mid)
            self._say(f"  {_tag(mid)} the messages before it arrived: in place", style="dim")
            return
        earlier = self._shown_before(event.lamport_timestamp, mid)
        marker = "↑ (earlier in the log) " if earlier else ""
        self._show(mid, event.sender_id, event.lamport_timestamp, event.content, marker)

    def _show(self, mid: str, sender: str, lamport: int, content: bytes, marker: str) -> None:
        text = _text(content)
        self.lines[mid] = Line(mid, sender, lamport, text)
        self._say(f"{marker}{escape(sender)}: {escape(text)}", style="bold")

    def _shown_before(self, lamport: int, mid: str) -> bool:
        """Whether a message later in log order is already on screen."""
        earlier = (lamport, mid) < self._newest_shown
        self._newest_shown = max(self._newest_shown, (lamport, mid))
        return earlier

    def _set_status(self, mid: str, status: str, detail: str, style: str = "") -> None:
        self.status[mid] = status
        line = self.lines.get(mid)
        text = escape(line.text[:40]) if line is not None else ""
        self._say(f"  {_tag(mid)} {text} · {status} {escape(detail)}", style=style)

    def _say(self, markup: str, style: str = "") -> None:
        self.console.print(markup, style=style or None, highlight=False, soft_wrap=True)

    # Reading the state

    def resume(self) -> None:
        """After a restart: know the texts and statuses of our unacknowledged messages."""
        chan = self.channel.channel
        outgoing = set(chan.outgoing_ids())
        for record in self.channel.history():
            if record.message_id in outgoing:
                line = _line(record)
                self.lines[line.message_id] = line
                entry = chan.outgoing_entry(line.message_id)
                possibly = entry is not None and entry.possible_ackers
                self.status[line.message_id] = POSSIBLY_ACKNOWLEDGED if possibly else SENT
        if outgoing:
            self._say(f"{len(outgoing)} message(s) of ours not acknowledged yet: resending")

    def log(self) -> list[Line]:
        """The local log in order (what --print-log prints)."""
        if self.channel.state is not None:
            return [_line(record) for record in self.channel.history()]
        return [self.lines[mid] for mid in self.channel.channel.log_ids() if mid in self.lines]

    def settled(self) -> bool:
        """Nothing missing, waiting or unacknowledged (the driver's sync status)."""
        return self.channel.driver.sync_status().synced

    def failed(self) -> list[str]:
        return [mid for mid, status in self.status.items() if status == FAILED]

    async def wait_converged(self, timeout_s: float, quiet_s: float, min_peers: int) -> bool:
        """True once converged (see the module doc), False at the timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            quiet = time.monotonic() - self.changed_at >= quiet_s
            if quiet and self.settled() and len(self.heard_from) >= min_peers:
                return True
            await asyncio.sleep(0.05)
        return False


def _text(content: bytes | None) -> str:
    return (content or b"").decode("utf-8", errors="replace")


def _line(record: LogRecord) -> Line:
    return Line(
        record.message_id, record.sender_id, record.lamport_timestamp, _text(record.content)
    )


def _tag(message_id: str) -> str:
    """A short, markup-safe reference to a message."""
    return escape(f"[{message_id[:8]}]")


# ------------------------------------------------------------------ running


async def run_chat(options: ChatOptions, console: Console) -> int:
    """The whole chat; returns the exit code."""
    from sdsync.transport.libp2p import Libp2pTransport

    identity = load_identity(options.state_dir, options.name)
    transport = Libp2pTransport(
        listen=[options.listen or identity.listen or DEFAULT_LISTEN],
        peers=options.peers,
        key=identity.key,
        drop_rate=options.drop_rate,
        seed=options.seed,
    )
    await transport.start()
    try:
        address = transport.listen_addrs[0]
        if options.state_dir is not None:
            bound = address.split("/p2p/")[0]
            save_identity(options.state_dir, Identity(identity.participant_id, identity.key, bound))
        console.print(f"listening on {address}", highlight=False, soft_wrap=True)
        console.print(
            f"you are {escape(identity.participant_id)} in channel {escape(options.channel)}",
            highlight=False,
            soft_wrap=True,
        )
        store = HttpStoreClient(options.store) if options.store is not None else None
        channel = ReliableChannel(
            transport,
            options.channel,
            identity.participant_id,
            config=options.config,
            runtime=options.runtime,
            store=store,
            rng=random.Random(options.seed),
            state_dir=options.state_dir,
        )
        session = ChatSession(channel, console)
        if channel.state is not None:
            session.resume()
        await channel.start()
        pump = asyncio.create_task(session.pump(channel.events()))
        try:
            if options.scripted:
                return await _script(session, transport, options)
            await _interact(session, transport)
            return 0
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            await channel.close()
            if store is not None:
                await store.close()
    finally:
        await transport.close()


async def _script(session: ChatSession, transport: Libp2pTransport, options: ChatOptions) -> int:
    topic = session.channel.topic
    patience = options.wait_converged_s if options.wait_converged_s is not None else 10.0
    if options.sends and not await transport.wait_for_mesh(
        topic, max(1, options.min_peers), patience
    ):
        session._say("no peer joined the channel yet; sending anyway", style="yellow")
    for index, text in enumerate(options.sends):
        if index and options.send_interval_ms:
            await asyncio.sleep(options.send_interval_ms / 1000)
        await session.send(text)
    code = 0
    if options.wait_converged_s is not None:
        converged = await session.wait_converged(
            options.wait_converged_s, options.quiet_s, options.min_peers
        )
        failed = session.failed()
        session._say(
            "converged" if converged else "not converged (timeout)",
            style="green" if converged else "red",
        )
        if converged:
            # Peers that are not there yet may still need our syncs and repairs.
            await asyncio.sleep(options.quiet_s)
        if failed:
            session._say(f"{len(failed)} message(s) failed", style="red")
        code = 0 if converged and not failed else 1
    session._say(
        f"frames received {transport.received}, dropped by --drop-rate "
        f"{transport.randomly_dropped}, rejected {sum(transport.rejected.values())}",
        style="dim",
    )
    if options.print_log:
        for line in session.log():
            sys.stdout.write(line.to_json() + "\n")
        sys.stdout.flush()
    return code


async def _interact(session: ChatSession, transport: Libp2pTransport) -> None:
    session._say("type a message and Enter to send; /log, /peers, /quit", style="dim")
    async for text in _stdin_lines():
        command = text.strip()
        if command == "/quit":
            return
        if command == "/log":
            for line in session.log():
                status = session.status.get(line.message_id, "")
                suffix = f" · {status}" if status else ""
                session._say(f"{escape(line.sender_id)}: {escape(line.text)}{suffix}")
            continue
        if command == "/peers":
            peers = await transport.mesh_peers(session.channel.topic)
            session._say(f"{len(peers)} peer(s) in the channel: {', '.join(peers) or '-'}")
            continue
        if command:
            try:
                await session.send(command)
            except OutgoingBufferFullError as exc:  # the user may wait and type it again
                session._say(f"[red]not sent:[/red] {escape(str(exc))}")


async def _stdin_lines() -> AsyncIterator[str]:
    """Lines typed on stdin, without blocking the event loop; ends at end of input.

    A daemon thread reads (stdin may be a file, a pipe or a terminal alike); it is left
    blocked in read() at exit, which ends with the process.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line.rstrip("\n"))
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, name="chat-stdin", daemon=True).start()
    while (line := await queue.get()) is not None:
        yield line


def configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s: %(message)s")
    # py-libp2p reports routine connection churn as warnings.
    logging.getLogger("libp2p").setLevel(logging.ERROR)


def chat_main(options: ChatOptions) -> int:
    configure_logging()
    console = Console(stderr=options.scripted, soft_wrap=True)
    try:
        return asyncio.run(run_chat(options, console))
    except LocalProtocolError as exc:
        Console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130


# ------------------------------------------------------------------ command

ListOption = list[str] | None
_RUNTIME = RuntimeConfig()
_REPAIR = RepairConfig()


def chat_command(
    channel: Annotated[str, typer.Option(help="Channel id (the spec's default is 0).")] = "0",
    name: Annotated[
        str | None,
        typer.Option(help="Participant id; generated and kept in --state-dir if not given."),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Keep identity and channel state here; restart with it to resume.",
        ),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(
            metavar="MULTIADDR",
            help=f"Listen address (default: the last one in --state-dir, else {DEFAULT_LISTEN}).",
        ),
    ] = None,
    peer: Annotated[
        ListOption,
        typer.Option(
            metavar="MULTIADDR",
            help="A peer to connect to, /ip4/HOST/tcp/PORT/p2p/ID; repeatable. Redialled "
            "until connected, and after it goes away.",
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="A store node (sdsync store serve) to fetch missing messages from by their "
            "retrieval hints, e.g. http://127.0.0.1:8645.",
        ),
    ] = None,
    drop_rate: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Drop this share of received frames (testing)."),
    ] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Seed of --drop-rate and of timers.")] = None,
    send: Annotated[
        ListOption,
        typer.Option(
            metavar="TEXT",
            help="Send TEXT, one message per --send, in order; then exit (or wait, with "
            "--wait-converged). Disables the interactive prompt.",
        ),
    ] = None,
    send_interval_ms: Annotated[
        int, typer.Option(min=0, help="Pause between --send messages.")
    ] = 0,
    wait_converged: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="Wait until converged (see docs/chat.md); exit 0 if so, 1 at the timeout.",
        ),
    ] = None,
    quiet_ms: Annotated[
        int | None,
        typer.Option(min=0, help="Quiet period of --wait-converged (default 3 sync intervals)."),
    ] = None,
    min_peers: Annotated[
        int,
        typer.Option(
            min=0,
            help="Converged needs messages from this many other participants; --send also "
            "waits (up to the --wait-converged time) for this many peers in the mesh.",
        ),
    ] = 0,
    print_log: Annotated[
        bool,
        typer.Option("--print-log", help="At the end, print the local log as JSON lines."),
    ] = False,
    sync_interval_ms: Annotated[
        int, typer.Option(min=1, help="Base interval of sync messages.")
    ] = _RUNTIME.sync_interval_ms,
    retry_ms: Annotated[
        int,
        typer.Option(
            min=1,
            help="First resend of an unacknowledged message (then backoff, x3 if "
            "possibly acknowledged).",
        ),
    ] = _RUNTIME.resend_interval_ms,
    repair_min_ms: Annotated[
        int, typer.Option(min=0, help="SDS-R: earliest repair request/response.")
    ] = _REPAIR.t_min_ms,
    repair_max_ms: Annotated[
        int, typer.Option(min=1, help="SDS-R: latest repair request/response.")
    ] = _REPAIR.t_max_ms,
) -> None:
    """Group chat over libp2p gossipsub; run one per terminal (docs/chat.md).

    It prints its own address: give that to the others with --peer.

    Type a line to send it; its status follows. /log, /peers, /quit.

    Scripted (--send, --wait-converged, --print-log): exit 0 done, 1 not converged, 2 bad usage.
    """
    try:
        options = ChatOptions(
            channel=channel,
            name=name,
            state_dir=state_dir,
            listen=listen,
            peers=tuple(peer or ()),
            store=store,
            drop_rate=drop_rate,
            seed=seed,
            sends=tuple(send or ()),
            send_interval_ms=send_interval_ms,
            wait_converged_s=wait_converged,
            quiet_ms=quiet_ms,
            min_peers=min_peers,
            print_log=print_log,
            runtime=RuntimeConfig(
                sync_interval_ms=sync_interval_ms,
                resend_interval_ms=retry_ms,
                resend_possibly_acknowledged_ms=3 * retry_ms,
            ),
            config=ChannelConfig(
                deliver_early=True,
                repair=RepairConfig(t_min_ms=repair_min_ms, t_max_ms=repair_max_ms),
            ),
        )
    except LocalProtocolError as exc:
        raise typer.BadParameter(str(exc)) from None
    raise typer.Exit(chat_main(options))
