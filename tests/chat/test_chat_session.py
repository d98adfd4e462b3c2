"""The chat's library: its identity file and its view of a channel (sdsync.chat), in
process over a MemoryNetwork."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from sdsync.chat import ChatSession, load_identity
from sdsync.core import (
    BloomParams,
    ChannelConfig,
    MessageChannel,
    MessageDelivered,
    MessageDeliveredEarly,
    MessageReceived,
    SyncReceived,
    SyncStatus,
)
from sdsync.errors import LocalProtocolError
from sdsync.runtime import ReliableChannel, RuntimeConfig
from sdsync.runtime.profiles import profile
from sdsync.testing.memory import Faults, MemoryNetwork


def test_identity_is_generated_once_and_kept(tmp_path: Path) -> None:
    first = load_identity(tmp_path, None)
    again = load_identity(tmp_path, None)
    assert again == first and first.participant_id.startswith("user-")
    assert oct((tmp_path / "chat.json").stat().st_mode & 0o777) == "0o600"
    assert load_identity(tmp_path, first.participant_id) == first
    with pytest.raises(LocalProtocolError, match="belongs to"):
        load_identity(tmp_path, "someone-else")
    (tmp_path / "chat.json").write_text("{not json")
    with pytest.raises(LocalProtocolError, match="not a chat identity"):
        load_identity(tmp_path, None)


def test_session_shows_statuses_early_deliveries_and_prints_the_log_in_order() -> None:
    # Resends and syncs 300 ms apart: "first" comes back only after "second" went out,
    # even when a loaded machine stalls the loop between the two sends.
    fast = RuntimeConfig(sync_interval_ms=300, resend_interval_ms=300, incoming_sweep_ms=50)
    config = ChannelConfig(bloom=BloomParams(1_000, 0.01), deliver_early=True)

    async def scenario() -> tuple[str, str, list[str], list[str]]:
        net = MemoryNetwork(seed=3)
        screens = [io.StringIO(), io.StringIO()]
        channels = [
            ReliableChannel(net.transport(n), "0", n, config=config, runtime=fast)
            for n in ("alice", "bob")
        ]
        sessions = [
            ChatSession(channel, Console(file=screen, width=200))
            for channel, screen in zip(channels, screens, strict=True)
        ]
        pumps = []
        for channel, session in zip(channels, sessions, strict=True):
            await channel.start()
            pumps.append(asyncio.create_task(session.pump(channel.events())))
        alice, bob = sessions
        # bob misses alice's first message, so her second arrives before it.
        net.faults = Faults(loss=1.0)
        await alice.send("first")
        net.faults = Faults()
        await alice.send("second")
        await alice.send("second")  # same text again: a message of its own
        await bob.send("reply")
        async with asyncio.timeout(30):
            while not (alice.settled() and bob.settled() and len(bob.log()) == 4):
                await asyncio.sleep(0.02)
        for pump in pumps:
            pump.cancel()
        for channel in channels:
            await channel.close()
        return (
            screens[0].getvalue(),
            screens[1].getvalue(),
            [line.text for line in alice.log()],
            [line.text for line in bob.log()],
        )

    alice_screen, bob_screen, alice_log, bob_log = asyncio.run(scenario())
    assert alice_log == bob_log
    # "reply" is concurrent with alice's messages; hers keep their causal order.
    assert [text for text in alice_log if text != "reply"] == ["first", "second", "second"]
    assert "alice: first · sent" in alice_screen
    assert re.search(r"first · acknowledged by bob", alice_screen)
    assert "reply · acknowledged by alice" in bob_screen
    # bob saw "second" before "first" had arrived: marked, then put in place.
    assert "(1 earlier missing) alice: second" in bob_screen
    assert "↑ (earlier in the log) alice: first" in bob_screen
    assert "in place" in bob_screen


def test_a_message_arriving_after_a_later_one_shown_early_is_marked_as_earlier() -> None:
    # The order the in-process test above can take when bob replies before alice's
    # messages reach him: nothing but the early "second" is above "first" on screen.
    screen = io.StringIO()
    channel = ReliableChannel(MemoryNetwork(seed=1).transport("bob"), "0", "bob")
    session = ChatSession(channel, Console(file=screen, width=200))
    session.on_event(MessageDeliveredEarly("m2", "alice", 10, b"second", None, 1))
    session.on_event(MessageDelivered("m1", "alice", 9, b"first", None))
    session.on_event(MessageDelivered("m2", "alice", 10, b"second", None))
    shown = screen.getvalue().splitlines()
    assert shown[0] == "⚠ (1 earlier missing) alice: second"
    assert shown[1] == "↑ (earlier in the log) alice: first"
    assert shown[2].endswith("the messages before it arrived: in place")


def test_the_group_the_chat_heard_from_sets_the_participant_count() -> None:
    # The lean profile stretches the sync interval with the group: 600 ms a member, once
    # above its 30 s floor.
    runtime = profile("lean").runtime
    channel = ReliableChannel(MemoryNetwork(seed=1).transport("bob"), "0", "bob", runtime=runtime)
    session = ChatSession(channel, Console(file=io.StringIO(), width=200))
    assert channel.driver.sync_interval_ms == runtime.sync_interval_for(None)
    for n in range(60):
        session.on_event(MessageReceived(f"m{n}", f"member-{n}", n + 1, 0))
    session.on_event(SyncReceived("s", "member-0"))  # heard before: counted once
    session.on_event(SyncReceived("s", "bob"))  # our own sync, echoed: we count already
    assert channel.driver.sync_interval_ms == runtime.sync_interval_for(61) == 61 * 600


def test_a_catch_up_the_store_did_not_answer_is_not_shown_as_caught_up() -> None:
    """Issue 39: with the store down, a chat printed "⟳ caught up: 0 message(s)"."""
    screen = io.StringIO()
    channel = ReliableChannel(MemoryNetwork(seed=1).transport("bob"), "0", "bob")
    session = ChatSession(channel, Console(file=screen, width=200))
    session.on_event(SyncStatus("", 0, 0, 0, catching_up=True))
    session.on_event(SyncStatus("", 0, 0, 0, catching_up=False))  # failed: no catch-up done
    session.on_event(SyncStatus("", 0, 0, 0, catching_up=True))
    channel.catch_ups += 1
    channel.caught_up_messages += 3
    session.on_event(SyncStatus("", 0, 0, 0, catching_up=False))
    shown = screen.getvalue().splitlines()
    assert shown[1] == "⟳ the store did not answer: catching up again later"
    assert shown[3] == "⟳ caught up: 3 message(s) we did not have"


def test_converged_waits_until_what_we_delivered_is_acknowledged_to_its_sender() -> None:
    """Issue 39: one side left before the other's last message was acknowledged; now a
    chat is converged only once everything of theirs it delivered was named since by a
    message of ours or a third participant's — not by the sender's own — and it says
    which conditions did not hold."""
    channel = ReliableChannel(MemoryNetwork(seed=1).transport("bob"), "0", "bob")
    bob = channel.channel
    alice, carol = (MessageChannel("0", name, now_ms=1) for name in ("alice", "carol"))
    session = ChatSession(channel, Console(file=io.StringIO(), width=200))

    def hear(data: bytes, now_ms: int) -> None:
        for event in bob.receive(data, now_ms):
            session.on_event(event)
        session.changed_at -= 10

    session.changed_at -= 10
    assert session.unmet(quiet_s=5, min_peers=0) == []
    assert session.unmet(quiet_s=5, min_peers=1) == ["heard from 0 of 1 peers"]
    hi = alice.send(b"hi", 10)
    carol.receive(hi.data, 11)
    hear(hi.data, 11)
    owed = ["1 of theirs not yet acknowledged to their senders"]
    assert session.unmet(quiet_s=5, min_peers=0) == owed
    own = alice.send_sync(12)
    assert own is not None
    hear(own.data, 12)  # the sender naming its own message tells it nothing about us
    assert session.unmet(quiet_s=5, min_peers=0) == owed
    third = carol.send_sync(13)
    assert third is not None
    hear(third.data, 13)
    assert session.unmet(quiet_s=5, min_peers=0) == []
    hear(alice.send(b"again", 14).data, 14)
    assert session.unmet(quiet_s=5, min_peers=0) == owed
    assert bob.send_sync(15) is not None  # ours, carrying everything we delivered
    assert session.unmet(quiet_s=5, min_peers=0) == []
    assert session.unmet(quiet_s=60, min_peers=0)[0].startswith("quiet for 10 s of 60 s")
