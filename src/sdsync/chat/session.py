"""The chat's view of one ReliableChannel, built from its events.

Theory of operation
-------------------
:class:`ChatSession` follows the status of each of our messages (sent → possibly
acknowledged → acknowledged, or failed) and the text of every message, and shows each
change on a console. A message from others is shown as soon as it arrives — marked with
how many earlier messages are missing if it has to wait for them (``deliver_early``), and
confirmed in place once they arrived; one that lands before lines already shown (older by
Lamport timestamp) is marked as such. A store catch-up (the driver's sync status) is shown
when it starts and when it ends, with what it brought. The first time the channel ignores
a peer's bloom filter for its size (``stats.bloom_ignored``), one notice says so: that
peer's filters acknowledge nothing until the group agrees on one profile.

*Converged* (:meth:`ChatSession.wait_converged`) is a local judgement:

* nothing of ours unacknowledged, nothing waiting in the incoming buffer, no message we
  know of missing (the driver's sync status);
* messages or syncs heard from at least ``min_peers`` other participants;
* no acknowledgement owed: every message of theirs we delivered has since been named by a
  message of ours, or by another participant's, which its sender hears too (the channel's
  ``acknowledgements_owed``). Without it a chat could leave before its peer's last
  message was acknowledged, and the peer resent it to nobody;
* no change for a quiet period of a few sync intervals — long enough that every peer has
  sent a sync message naming its newest messages, so a message we never heard of would
  have shown up as missing. A received duplicate is a change: some peer is still
  resending.

:meth:`ChatSession.unmet` names the conditions that do not hold.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from sdsync.core import (
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageDeliveredEarly,
    MessageEvicted,
    MessageLost,
    MessagePossiblyAcknowledged,
    MessageReceived,
    SendFailed,
    SyncReceived,
    SyncSent,
    SyncStatus,
)
from sdsync.runtime import LogRecord, ReliableChannel

# Events that change nothing a converged judgement looks at. (A duplicate is not one of
# them: it is a peer resending, so that peer still lacks an acknowledgement.) A sync
# status comes with the events that changed it, or says a periodic catch-up ran.
_QUIET_EVENTS = (SyncSent, SyncReceived, SyncStatus)

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
        self.catching_up = False
        # The channel's counts when the running catch-up began: messages found, catch-ups
        # finished (one that failed finishes none).
        self._caught_up_before = (0, 0)
        self.bloom_mismatch_shown = False

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
        self.say(f"→ {_tag(message_id)} {escape(self.me)}: {escape(text)} · {SENT}")
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
            self._heard(event.sender_id)
            self._notice_bloom_mismatch()
        if isinstance(event, MessageDeliveredEarly):
            self.shown_early.add(mid)
            # On screen now, so a missing message that arrives later lands above it.
            self._shown_before(event.lamport_timestamp, mid)
            marker = f"⚠ ({event.missing_dependencies} earlier missing) "
            self._show(mid, event.sender_id, event.lamport_timestamp, event.content, marker)
        elif isinstance(event, MessageDelivered):
            self._delivered(event)
        elif isinstance(event, MessageLost):
            self.say(f"✗ {_tag(mid)} given up as lost", style="red")
        elif isinstance(event, MessageEvicted):
            # Shown early, it will not take its place unless it comes again.
            self.shown_early.discard(mid)
            self.say(f"✗ {_tag(mid)} dropped while waiting ({event.reason})", style="red")
        elif isinstance(event, MessagePossiblyAcknowledged) and mid in self.status:
            if self.status[mid] == SENT:
                self._set_status(mid, POSSIBLY_ACKNOWLEDGED, f"(seen by {event.acker_id})")
        elif isinstance(event, MessageAcknowledged) and mid in self.status:
            self._set_status(mid, ACKNOWLEDGED, f"by {event.acker_id}", style="green")
        elif isinstance(event, SendFailed) and mid in self.status:
            self._set_status(mid, FAILED, "no peer acknowledged it", style="red")
        elif isinstance(event, SyncStatus) and event.catching_up != self.catching_up:
            self._catch_up_changed(event.catching_up)

    def _heard(self, sender_id: str) -> None:
        # Everyone we heard from, and us, is the best count of the group the chat has: it
        # spreads SDS-R responses and, with the lean profile, stretches the sync interval
        # as the group grows.
        if sender_id not in self.heard_from:
            self.heard_from.add(sender_id)
            self.channel.set_participant_count(len(self.heard_from | {self.me}))

    def _notice_bloom_mismatch(self) -> None:
        """Once per channel: a received filter was ignored for its size (the core checks
        filters as it receives, so a receive event is when the count can have grown)."""
        chan = self.channel.channel
        offender = chan.stats.bloom_wrong_size
        if self.bloom_mismatch_shown or offender is None:
            return
        self.bloom_mismatch_shown = True
        peer, size = offender
        self.say(
            f"⚠ {peer}'s bloom filter is {size:,} bytes, this channel expects "
            f"{chan.config.bloom.n_bytes:,}: acknowledgements from it are not counted; "
            "every participant must use the same profile",
            style="yellow",
        )

    def _catch_up_changed(self, running: bool) -> None:
        self.catching_up = running
        counts = (self.channel.caught_up_messages, self.channel.catch_ups)
        if running:
            self._caught_up_before = counts
            self.say("⟳ catching up from the store…", style="dim")
        elif counts[1] == self._caught_up_before[1]:
            self.say("⟳ the store did not answer: catching up again later", style="yellow")
        else:
            new = counts[0] - self._caught_up_before[0]
            self.say(f"⟳ caught up: {new} message(s) we did not have", style="dim")

    def _delivered(self, event: MessageDelivered) -> None:
        mid = event.message_id
        if mid in self.shown_early:
            self.shown_early.discard(mid)
            self.say(f"  {_tag(mid)} the messages before it arrived: in place", style="dim")
            return
        earlier = self._shown_before(event.lamport_timestamp, mid)
        marker = "↑ (earlier in the log) " if earlier else ""
        self._show(mid, event.sender_id, event.lamport_timestamp, event.content, marker)

    def _show(self, mid: str, sender: str, lamport: int, content: bytes, marker: str) -> None:
        text = _text(content)
        self.lines[mid] = Line(mid, sender, lamport, text)
        self.say(f"{marker}{escape(sender)}: {escape(text)}", style="bold")

    def _shown_before(self, lamport: int, mid: str) -> bool:
        """Whether a message later in log order is already on screen."""
        earlier = (lamport, mid) < self._newest_shown
        self._newest_shown = max(self._newest_shown, (lamport, mid))
        return earlier

    def _set_status(self, mid: str, status: str, detail: str, style: str = "") -> None:
        self.status[mid] = status
        line = self.lines.get(mid)
        text = escape(line.text[:40]) if line is not None else ""
        self.say(f"  {_tag(mid)} {text} · {status} {escape(detail)}", style=style)

    def say(self, markup: str, style: str = "") -> None:
        """One line on the chat's console (rich markup: escape what others wrote)."""
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
            self.say(f"{len(outgoing)} message(s) of ours not acknowledged yet: resending")

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

    def unmet(self, quiet_s: float, min_peers: int) -> list[str]:
        """The conditions of converged (module doc) that do not hold now, in words."""
        status = self.channel.driver.sync_status()
        unmet = []
        if status.outstanding:
            unmet.append(f"{status.outstanding} of ours unacknowledged")
        if status.waiting:
            unmet.append(f"{status.waiting} waiting for earlier messages")
        if status.missing:
            unmet.append(f"{status.missing} missing")
        if len(self.heard_from) < min_peers:
            unmet.append(f"heard from {len(self.heard_from)} of {min_peers} peers")
        owed = self.channel.channel.acknowledgements_owed()
        if owed:
            unmet.append(f"{owed} of theirs not yet acknowledged to their senders")
        quiet_for = time.monotonic() - self.changed_at
        if quiet_for < quiet_s:
            unmet.append(f"quiet for {quiet_for:.0f} s of {quiet_s:g} s")
        return unmet

    async def wait_converged(self, timeout_s: float, quiet_s: float, min_peers: int) -> bool:
        """True once converged (see the module doc), False at the timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if not self.unmet(quiet_s, min_peers):
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
