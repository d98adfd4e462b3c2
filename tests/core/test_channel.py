"""Protocol steps of MessageChannel, one behaviour per test."""

from __future__ import annotations

import pytest

from sdsync.core import (
    BloomParams,
    ChannelConfig,
    EphemeralReceived,
    Event,
    MemoryHistoryStore,
    MessageAcknowledged,
    MessageChannel,
    MessageDelivered,
    MessageDropped,
    MessageLost,
    MessageMissing,
    MessageMissingEvicted,
    MessagePossiblyAcknowledged,
    Outgoing,
    RepairConfig,
    RepairRequestReceived,
    RepairRequestSent,
    RepairResponseSent,
    SendFailed,
    SyncReceived,
)
from sdsync.core.bloom import BloomFilter
from sdsync.errors import LocalProtocolError, OutgoingBufferFullError, RemoteProtocolError
from sdsync.wire import (
    HistoryEntry,
    Message,
    decode,
    encode,
    message_id_for,
    message_id_for_sender,
)

SMALL = ChannelConfig(bloom=BloomParams(100, 0.01), causal_history_size=3)


def chan(pid: str, config: ChannelConfig = SMALL, now: int = 0) -> MessageChannel:
    return MessageChannel("c", pid, now_ms=now, config=config)


def of(events: list[Event], kind: type[Event]) -> list[str]:
    return [e.message_id for e in events if isinstance(e, kind)]


def test_lamport_send_is_max_of_increment_and_clock() -> None:
    a = chan("a", now=1_000)
    assert a.send(b"1", 500).message.lamport_timestamp == 1_001
    assert a.send(b"2", 5_000).message.lamport_timestamp == 5_000
    assert a.send(b"3", 5_000).message.lamport_timestamp == 5_001


def test_delivery_raises_lamport_to_the_message_and_never_lowers_it() -> None:
    a, b = chan("a", now=9_000), chan("b", now=10)
    b.receive(a.send(b"x", 9_000).data, 20)
    assert b.lamport_timestamp == 9_001
    b.receive(chan("z", now=5).send(b"y", 5).data, 30)
    assert b.lamport_timestamp == 9_001


def test_causal_history_is_the_tail_of_the_log_with_hints_and_senders() -> None:
    a, b = chan("a"), chan("b")
    for i in range(5):
        b.receive(a.send(f"m{i}".encode(), i).data, i, retrieval_hint=bytes([i]))
    out = b.send(b"reply", 10)
    ids = a.log_ids()
    assert [e.message_id for e in out.message.causal_history] == ids[-3:]
    assert [e.retrieval_hint for e in out.message.causal_history] == [b"\x02", b"\x03", b"\x04"]
    assert {e.sender_id for e in out.message.causal_history} == {"a"}


def test_bloom_sent_is_the_state_before_our_own_id() -> None:
    a = chan("a")
    first = a.send(b"1", 1)
    assert first.message.bloom_filter == bytes(SMALL.bloom.n_bytes)
    assert first.message_id in a.log  # entered log (and filter) when handed over
    assert a.send(b"2", 2).message.bloom_filter != first.message.bloom_filter


def test_log_is_ordered_by_lamport_then_id_whatever_the_arrival_order() -> None:
    senders = [chan(p, ChannelConfig(causal_history_size=0)) for p in "xyz"]
    wires = [s.send(f"from {s.participant_id}".encode(), 100).data for s in senders]
    wires.append(senders[0].send(b"later", 50).data)
    logs = []
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]):
        r = chan("r", ChannelConfig(causal_history_size=0))
        for i in order:
            r.receive(wires[i], 1)
        logs.append(r.log_ids())
        keys = [(e.lamport_timestamp, e.message_id) for e in r.log]
        assert keys == sorted(keys)
    assert logs[0] == logs[1] == logs[2]


def test_dependency_waiting_in_the_incoming_buffer_is_not_met() -> None:
    a, b = chan("a"), chan("b")
    m1, m2, m3 = (a.send(f"{i}".encode(), i).data for i in (1, 2, 3))
    ev3 = b.receive(m3, 10)
    assert of(ev3, MessageMissing) == [decode(m1).message_id, decode(m2).message_id]
    ev2 = b.receive(m2, 11)
    assert of(ev2, MessageDelivered) == []  # m1 still missing
    assert of(ev2, MessageMissing) == []  # m1 was already reported
    ev1 = b.receive(m1, 12)
    # Cascade: m1 releases m2, which releases m3, in log order.
    assert of(ev1, MessageDelivered) == a.log_ids()
    assert b.incoming_ids() == [] and b.log_ids() == a.log_ids()


def test_every_duplicate_content_message_is_dropped() -> None:
    a, b = chan("a"), chan("b")
    m1, m2 = a.send(b"1", 1).data, a.send(b"2", 2).data
    assert of(b.receive(m1, 3), MessageDelivered)
    assert of(b.receive(m1, 4), MessageDropped) == [decode(m1).message_id]  # js re-delivers
    b.receive(m2, 5)
    assert b.stats.dropped == {"duplicate": 1}
    buffered = chan("b2")
    buffered.receive(m2, 1)
    assert [e.reason for e in buffered.receive(m2, 2) if isinstance(e, MessageDropped)] == [
        "duplicate"
    ]


def test_own_and_foreign_channel_messages_are_dropped() -> None:
    a = chan("a")
    own = a.send(b"mine", 1).data
    assert [e.reason for e in a.receive(own, 2)] == ["own message"]  # type: ignore[attr-defined]
    other = MessageChannel("elsewhere", "z", now_ms=0, config=SMALL).send(b"x", 1).data
    assert [e.reason for e in a.receive(other, 2)] == ["wrong channel"]  # type: ignore[attr-defined]
    assert a.log_ids() == [decode(own).message_id]


def test_acknowledged_by_causal_history() -> None:
    a, b = chan("a"), chan("b")
    sent = a.send(b"x", 1)
    b.receive(sent.data, 2)
    events = a.receive(b.send(b"y", 3).data, 4)
    assert [
        (e.message_id, e.by_causal_history) for e in events if isinstance(e, MessageAcknowledged)
    ] == [(sent.message_id, True)]
    assert a.outgoing_ids() == []


def test_possible_acks_count_distinct_senders_only() -> None:
    config = ChannelConfig(bloom=BloomParams(100, 0.01), causal_history_size=0)
    a, b, c = chan("a", config), chan("b", config), chan("c", config)
    a.receive(c.send(b"c0", 0).data, 0)  # a knows of two peers: the threshold of 2 applies
    sent = a.send(b"x", 1)
    b.receive(sent.data, 2)
    c.receive(sent.data, 2)
    for t in (3, 4, 5):  # b repeats itself: still one possible ack
        events = a.receive(b.send(f"b{t}".encode(), t).data, t)
    assert [e.count for e in events if isinstance(e, MessagePossiblyAcknowledged)] == []
    assert a.outgoing_entry(sent.message_id).possible_ackers == {"b"}  # type: ignore[union-attr]
    assert [e.message_id for e in a.sweep_outgoing().possibly_acknowledged] == [sent.message_id]
    events = a.receive(c.send(b"c", 6).data, 6)
    assert of(events, MessageAcknowledged) == [sent.message_id]


def test_saturated_bloom_gives_no_ack_evidence() -> None:
    config = ChannelConfig(bloom=BloomParams(100, 0.01), possible_acks_threshold=1)
    a = chan("a", config)
    sent = a.send(b"x", 1)
    evil = Message("evil", "e1", "c", 5, (), b"\xff" * config.bloom.n_bytes, b"hi")
    events = a.receive(encode(evil), 2)
    assert of(events, MessageDelivered) == ["e1"]
    assert a.outgoing_ids() == [sent.message_id]
    assert a.stats.bloom_ignored == {"saturated": 1}


def test_wrong_size_bloom_is_ignored_but_the_message_still_processed() -> None:
    a = chan("a")
    sent = a.send(b"x", 1)
    other = chan("b", ChannelConfig(bloom=BloomParams(10, 0.1), causal_history_size=3))
    other.receive(sent.data, 2)
    odd = other.send(b"y", 3)  # acks x in its causal history, with a short bloom filter
    events = a.receive(odd.data, 4)
    assert of(events, MessageAcknowledged) == [sent.message_id]
    assert of(events, MessageDelivered) == [odd.message_id]
    bloom_only = Message("z", "z1", "c", 9, (), bytes(3), b"z")
    a.send(b"again", 5)
    a.receive(encode(bloom_only), 6)
    assert a.stats.bloom_ignored == {"wrong size": 1}


def test_full_incoming_buffer_drops_without_recording_the_message() -> None:
    config = ChannelConfig(bloom=BloomParams(100, 0.01), max_incoming_buffer=2)
    a, b = chan("a", config), chan("b", config)
    wires = [a.send(f"{i}".encode(), i).data for i in range(4)]
    for w in wires[1:]:
        b.receive(w, 10)
    assert len(b.incoming_ids()) == 2
    assert b.stats.dropped == {"incoming buffer full": 1}
    # The buffered messages are in the filter b sends; the dropped one is not (else a would
    # take it as acknowledged and never resend it).
    sent_filter = BloomFilter(config.bloom, b.bloom_bytes())
    assert [decode(w).message_id in sent_filter for w in wires] == [False, True, True, False]
    assert decode(wires[3]).message_id not in b.incoming_ids()
    b.receive(wires[0], 11)  # delivers 0, 1, 2 — 3 was dropped and is not a duplicate
    assert of(b.receive(wires[3], 12), MessageDelivered) == [decode(wires[3]).message_id]
    assert b.log_ids() == a.log_ids()


def test_lost_timeout_reports_missing_dependencies_and_delivers_the_waiting_message() -> None:
    config = ChannelConfig(bloom=BloomParams(100, 0.01), lost_timeout_ms=1_000)
    a, b = chan("a", config), chan("b", config)
    lost = a.send(b"lost", 1)
    kept = a.send(b"kept", 2)
    b.receive(kept.data, 100)
    early = b.sweep_incoming(1_099)
    assert [e.message_id for e in early.missing] == [lost.message_id]
    assert of(early.events, MessageDelivered) == []
    late = b.sweep_incoming(1_100)
    assert of(late.events, MessageLost) == [lost.message_id]
    assert of(late.events, MessageDelivered) == [kept.message_id]
    # If the lost message shows up after all, it is still delivered, in log order.
    assert of(b.receive(lost.data, 2_000), MessageDelivered) == [lost.message_id]
    assert b.log_ids() == a.log_ids()


def test_sync_messages_are_never_logged_buffered_or_filtered() -> None:
    a, b = chan("a"), chan("b")
    assert a.send_sync(1) is None  # no history, no repairs: nothing to say
    a.send(b"x", 2)
    sync = a.send_sync(3)
    assert sync is not None and sync.message.content is None
    bloom_before = b.bloom_bytes()
    events = b.receive(sync.data, 4)
    assert of(events, SyncReceived) == [sync.message_id]
    assert b.bloom_bytes() == bloom_before and b.incoming_ids() == []
    assert sync.message_id not in a.log and sync.message_id not in b.log
    assert len(of(events, MessageMissing)) == 1  # but what it names is noticed
    # No duplicate suppression for syncs; the gap is known already, so not news.
    assert b.receive(sync.data, 5) == [SyncReceived(sync.message_id, "a")]
    assert b.missing_ids() == of(events, MessageMissing)


def test_gaps_named_only_by_sync_messages_are_reported_until_obtained() -> None:
    """Seed 000: sync messages' causal histories are processed like content messages'."""
    config = ChannelConfig(causal_history_size=2, repair=RepairConfig(t_min_ms=10, t_max_ms=20))
    a, b = chan("a", config), chan("b", config)
    lost = a.send(b"never arrives", 1)
    sync = a.send_sync(2)
    assert sync is not None
    b.receive(sync.data, 3)
    for now in (100, 1_000, 100_000):  # every sweep, not just the first
        sweep = b.sweep_incoming(now)
        assert [e.message_id for e in sweep.missing] == [lost.message_id]
        assert of(sweep.events, MessageMissing) == [lost.message_id]
    known = b.missing_dependency(lost.message_id)
    assert known is not None and (known.named_by, known.first_seen_ms) == ("a", 3)
    # SDS-R asks for it too: the request rides on b's next message.
    out = b.send_sync(100_000)
    assert out is not None and [r.message_id for r in out.message.repair_request] == [
        lost.message_id
    ]
    b.receive(lost.data, 100_001)
    assert b.missing_ids() == [] and b.sweep_incoming(100_002).missing == []


def test_lost_timeout_applies_to_gaps_named_only_by_sync_messages() -> None:
    a, b = chan("a"), chan("b", ChannelConfig(lost_timeout_ms=1_000))
    gone = a.send(b"gone", 1)
    sync = a.send_sync(2)
    assert sync is not None
    b.receive(sync.data, 10)
    assert of(b.sweep_incoming(1_009).events, MessageLost) == []
    sweep = b.sweep_incoming(1_010)
    assert of(sweep.events, MessageLost) == [gone.message_id] and sweep.missing == []
    assert b.missing_ids() == []


def test_marking_met_ends_a_known_gap() -> None:
    a, b = chan("a"), chan("b")
    gap = a.send(b"gap", 1)
    sync = a.send_sync(2)
    assert sync is not None
    b.receive(sync.data, 3)
    b.mark_dependencies_met([gap.message_id])
    assert b.missing_ids() == [] and b.sweep_incoming(4).missing == []


def test_known_missing_is_bounded_and_evictions_are_reported() -> None:
    """A peer naming junk ids costs bounded memory; what falls out is said, and counted."""
    b = chan("b", ChannelConfig(max_known_missing=3))
    junk = [HistoryEntry(f"junk{i}") for i in range(5)]
    sync = Message("evil", "s1", "c", 10, tuple(junk), None)
    events = b.receive(encode(sync), 10)
    assert of(events, MessageMissingEvicted) == ["junk0", "junk1"]
    assert b.missing_ids() == ["junk2", "junk3", "junk4"]
    assert b.stats.missing_evicted == 2
    # Named again later, an evicted gap is tracked again.
    b.receive(encode(Message("evil", "s2", "c", 11, (junk[0],), None)), 11)
    assert b.missing_ids() == ["junk3", "junk4", "junk0"]


def test_ephemeral_messages_are_delivered_at_once_and_leave_no_trace() -> None:
    a, b = chan("a"), chan("b")
    out = a.send_ephemeral(b"typing...")
    assert out.message.lamport_timestamp is None and out.message.bloom_filter is None
    events = b.receive(out.data, 1)
    assert events == [EphemeralReceived(out.message_id, "a", b"typing...")]
    assert b.log_ids() == [] and a.outgoing_ids() == []


def test_repeated_message_id_is_a_local_error() -> None:
    a = chan("a")
    a.send(b"same", 1, message_id="custom-1")
    lamport = a.lamport_timestamp
    with pytest.raises(LocalProtocolError, match="supply a unique message_id"):
        a.send(b"other", 2, message_id="custom-1")
    assert a.lamport_timestamp == lamport  # refused: state untouched
    assert a.send(b"same", 3, message_id="custom-2").message_id == "custom-2"
    with pytest.raises(LocalProtocolError):
        a.send(b"", 4)


def test_default_ids_cover_sender_lamport_and_payload() -> None:
    """The same bytes, twice or from two participants, are distinct messages."""
    a, b, c = chan("a"), chan("b"), chan("c")
    first, again = a.send(b"ok", 1), a.send(b"ok", 1)
    theirs = b.send(b"ok", 1)
    assert len({first.message_id, again.message_id, theirs.message_id}) == 3
    assert first.message_id == message_id_for_sender(
        "a", first.message.lamport_timestamp or 0, b"ok"
    )
    for out in (first, again, theirs):
        assert of(c.receive(out.data, 2), MessageDelivered) == [out.message_id]
    payload_ids = chan("d", ChannelConfig(message_id_scheme="payload"))
    assert payload_ids.send(b"ok", 1).message_id == message_id_for(b"ok")


def test_id_collision_is_dropped_and_acknowledges_nothing() -> None:
    """js-waku derives ids from the payload alone: two senders' "ok" collide."""
    config = ChannelConfig(message_id_scheme="payload", causal_history_size=3)
    alice, bob, carol = chan("alice", config), chan("bob", config), chan("carol", config)
    alices = alice.send(b"ok", 1)
    carol.receive(alices.data, 2)
    bobs = bob.send(b"ok", 3)
    assert bobs.message_id == alices.message_id
    events = carol.receive(bobs.data, 4)
    assert [(e.message_id, e.reason) for e in events if isinstance(e, MessageDropped)] == [
        (bobs.message_id, "id collision")
    ]
    assert carol.stats.dropped == {"id collision": 1}
    assert carol.receive(alices.data, 5)[0] == MessageDropped(alices.message_id, "duplicate")
    # A colliding message names nothing of ours: bob's own "ok" stays unacknowledged
    # even when he receives alice's, whose id carol's history will name.
    assert of(bob.receive(alices.data, 6), MessageAcknowledged) == []
    assert bob.outgoing_ids() == [bobs.message_id]


def test_resend_returns_identical_bytes_and_counts_attempts() -> None:
    a = chan("a")
    sent = a.send(b"x", 1)
    assert a.resend(sent.message_id, 50) == sent.data
    entry = a.outgoing_entry(sent.message_id)
    assert entry is not None and (entry.attempts, entry.last_sent_ms) == (2, 50)
    assert a.abandon(sent.message_id) == [SendFailed(sent.message_id)]
    with pytest.raises(LocalProtocolError):
        a.resend(sent.message_id, 60)


def test_on_ack_policy_logs_our_message_only_once_acknowledged() -> None:
    config = ChannelConfig(bloom=BloomParams(100, 0.01), own_log_policy="on_ack")
    a, b = chan("a", config), chan("b", config)
    sent = a.send(b"x", 1)
    assert a.log_ids() == [] and a.send(b"y", 2).message.causal_history == ()
    b.receive(sent.data, 3)
    a.receive(b.send(b"z", 4).data, 5)
    assert sent.message_id in a.log


def test_retrieval_hint_of_our_message_reaches_later_histories() -> None:
    a = chan("a")
    first = a.send(b"x", 1)
    a.set_retrieval_hint(first.message_id, b"\xaa" * 32)
    assert a.send(b"y", 2).message.causal_history[-1].retrieval_hint == b"\xaa" * 32
    with pytest.raises(LocalProtocolError):
        a.set_retrieval_hint("unknown", b"")


def test_mark_dependencies_met_releases_waiting_messages() -> None:
    a, b = chan("a"), chan("b")
    first = a.send(b"1", 1)
    second = a.send(b"2", 2)
    b.receive(second.data, 3)
    events = b.mark_dependencies_met([first.message_id])
    assert of(events, MessageDelivered) == [second.message_id]
    assert of(b.receive(first.data, 4), MessageDropped) == [first.message_id]


def test_log_window_evicts_to_history_store_and_still_detects_duplicates() -> None:
    store = MemoryHistoryStore()
    config = ChannelConfig(bloom=BloomParams(100, 0.01), max_log_entries=3)
    a = chan("a", config)
    b = MessageChannel("c", "b", now_ms=0, config=config, history_store=store)
    wires = [a.send(f"{i}".encode(), i).data for i in range(6)]
    for w in wires:
        b.receive(w, 10)
    assert len(b.log) == 3 and len(store) == 3
    assert of(b.receive(wires[0], 11), MessageDropped) == [decode(wires[0]).message_id]


def test_repair_roundtrip_original_sender_answers_first() -> None:
    repair = RepairConfig(t_min_ms=1_000, t_max_ms=5_000)
    config = ChannelConfig(bloom=BloomParams(100, 0.01), repair=repair)
    a, b, c = chan("a", config), chan("b", config), chan("c", config)
    lost = a.send(b"lost", 1)
    later = a.send(b"later", 2)
    c.receive(lost.data, 3)
    b.receive(later.data, 3)
    assert b.send_sync(100) is None  # nothing in the log and no request due yet
    carrier = b.send_sync(10_000)
    assert carrier is not None
    assert of(carrier.events, RepairRequestSent) == [lost.message_id]
    for responder in (a, c):
        assert of(responder.receive(carrier.data, 10_001), RepairRequestReceived) == [
            lost.message_id
        ]
    answer = a.sweep_repair(10_001)  # distance 0: the original sender is due at once
    assert answer.data == [lost.data]
    assert of(answer.events, RepairResponseSent) == [lost.message_id]
    c.receive(answer.data[0], 10_002)  # c hears the answer: it cancels its own response
    assert c.sweep_repair(10_000_000).data == []
    events = b.receive(answer.data[0], 10_003)
    assert of(events, MessageDelivered) == [lost.message_id, later.message_id]


def test_someone_elses_request_defers_ours_instead_of_forgetting_it() -> None:
    repair = RepairConfig(t_min_ms=1_000, t_max_ms=5_000)
    config = ChannelConfig(bloom=BloomParams(100, 0.01), repair=repair)
    a, b, c = chan("a", config), chan("b", config), chan("c", config)
    a.send(b"lost", 1)
    later = a.send(b"later", 2).data
    b.receive(later, 3)
    c.receive(later, 3)
    request = c.send_sync(6_000)
    assert request is not None and request.message.repair_request
    b.receive(request.data, 6_001)  # the answer to c's request is lost...
    assert b.send_sync(6_002) is None  # deferred: nothing due
    retry = b.send_sync(6_001 + 5_000)  # ...so b asks itself after T_max
    assert retry is not None and len(retry.message.repair_request) == 1


def test_bad_bytes_leave_state_untouched() -> None:
    a, b = chan("a"), chan("b")
    b.receive(a.send(b"x", 1).data, 2)
    before = (b.lamport_timestamp, b.log_ids(), b.incoming_ids(), b.bloom_bytes())
    for junk in (b"\xff\xff", encode(Message("a", "m", "c", 1, content=b"x"))[:-3]):
        with pytest.raises(RemoteProtocolError):
            b.receive(junk, 3)
    assert (b.lamport_timestamp, b.log_ids(), b.incoming_ids(), b.bloom_bytes()) == before


def test_self_referencing_history_does_not_block_delivery() -> None:
    b = chan("b")
    msg = Message("evil", "loop", "c", 5, (HistoryEntry("loop"),), bytes(SMALL.bloom.n_bytes), b"x")
    assert of(b.receive(encode(msg), 1), MessageDelivered) == ["loop"]


def test_configuration_errors_are_local() -> None:
    with pytest.raises(LocalProtocolError):
        ChannelConfig(possible_acks_threshold=0)
    with pytest.raises(LocalProtocolError):
        RepairConfig(t_min_ms=10, t_max_ms=5)
    with pytest.raises(LocalProtocolError):
        MessageChannel("c", "", now_ms=0)


def test_timestamp_far_in_the_future_is_dropped_not_adopted() -> None:
    b = chan("b", ChannelConfig(bloom=BloomParams(100, 0.01), max_lamport_skew_ms=60_000))
    poison = Message("m", "p", "c", 10**15, (), bytes(b.config.bloom.n_bytes), b"x")
    assert [e.reason for e in b.receive(encode(poison), 1_000)] == [  # type: ignore[attr-defined]
        "lamport timestamp too far in the future"
    ]
    assert b.lamport_timestamp == 0 and b.log_ids() == []
    # Once our clock is within the skew, the same message is accepted.
    assert of(b.receive(encode(poison), 10**15 - 1_000), MessageDelivered) == ["p"]


def test_two_member_channel_acknowledges_by_the_one_peers_bloom_filter() -> None:
    """With one other member there can be only one filter: the threshold never exceeds it."""
    config = ChannelConfig(causal_history_size=1)
    alice, bob = chan("alice", config), chan("bob", config)
    sent = [alice.send(f"m{i}".encode(), i) for i in range(5)]
    for out in sent:
        bob.receive(out.data, 10)
    sync = bob.send_sync(11)
    assert sync is not None
    events = alice.receive(sync.data, 12)
    assert sorted(of(events, MessageAcknowledged)) == sorted(o.message_id for o in sent)
    assert alice.outgoing_ids() == [] and alice.peers_heard() == ["bob"]


def test_outgoing_buffer_cap_refuses_sends_and_changes_nothing() -> None:
    a = chan("a", ChannelConfig(max_outgoing_buffer=2))
    a.send(b"1", 1)
    a.send(b"2", 2)
    before = (a.lamport_timestamp, a.log_ids(), a.outgoing_ids())
    with pytest.raises(OutgoingBufferFullError, match="max_outgoing_buffer"):
        a.send(b"3", 3)
    assert (a.lamport_timestamp, a.log_ids(), a.outgoing_ids()) == before
    assert a.stats.outgoing_full == 1
    a.abandon(a.outgoing_ids()[0])
    assert a.send(b"3", 4).message_id in a.outgoing_ids()


def test_retrieval_hint_of_an_unacknowledged_message_enters_the_log_with_it() -> None:
    """own_log_policy="on_ack": the hint is set while the message is only outgoing."""
    config = ChannelConfig(own_log_policy="on_ack", causal_history_size=3)
    a, b = chan("a", config), chan("b", config)
    out = a.send(b"x", 1)
    assert out.message_id not in a.log
    a.set_retrieval_hint(out.message_id, b"\x01" * 32)
    b.receive(out.data, 2)
    assert of(a.receive(b.send(b"y", 3).data, 4), MessageAcknowledged) == [out.message_id]
    entry = a.log.get(out.message_id)
    assert entry is not None and entry.retrieval_hint == b"\x01" * 32
    with pytest.raises(LocalProtocolError, match="neither in the outgoing buffer"):
        a.set_retrieval_hint("unknown", b"\x02")


def implied_request_scene(window: int) -> tuple[MessageChannel, MessageChannel, Outgoing]:
    """c missed a's m1, and no message it got names m1: b sent m2 before it had m1, so the
    causal histories c sees (1 id each) never reach back to m1. Returns a, c and m1."""
    config = ChannelConfig(
        causal_history_size=1,
        bloom=BloomParams(100, 0.01),
        repair=RepairConfig(t_min_ms=1_000, t_max_ms=5_000, sync_repair_window=window),
    )
    a, b, c = chan("a", config), chan("b", config), chan("c", config)
    m1 = a.send(b"m1", 0)
    m2 = b.send(b"m2", 5)
    b.receive(m1.data, 10)
    a.receive(m2.data, 10)
    c.receive(m2.data, 10)
    assert c.missing_ids() == [] and m1.message_id not in c.log  # c cannot know of m1
    b_sync = b.send_sync(2_000)
    assert b_sync is not None
    a.receive(b_sync.data, 2_000)  # b's filter has m1: it asks for nothing
    return a, c, m1


def test_a_gap_nobody_names_is_rebroadcast_when_a_sync_shows_it() -> None:
    a, c, m1 = implied_request_scene(window=128)
    early = c.send_sync(500)  # too soon: m1 may still be on its way to c
    assert early is not None
    a.receive(early.data, 510)
    assert a.sweep_repair(10_000).data == []
    sync = c.send_sync(2_000)
    assert sync is not None
    a.receive(sync.data, 2_010)
    assert a.sweep_repair(2_010).data == [m1.data]  # the original sender answers at once
    assert of(c.receive(m1.data, 2_100), MessageDelivered) == [m1.message_id]
    # Answered once per t_min: c's sync sent before m1 arrived triggers nothing more.
    a.receive(sync.data, 2_500)
    assert a.sweep_repair(100_000).data == []


def test_sync_repair_window_zero_turns_implied_requests_off() -> None:
    a, c, _ = implied_request_scene(window=0)
    sync = c.send_sync(2_000)
    assert sync is not None
    a.receive(sync.data, 2_010)
    assert a.sweep_repair(100_000).data == []


def test_an_id_a_small_filter_no_longer_holds_is_not_taken_for_a_gap() -> None:
    """A rolling filter keeps only its newest capacity // 2 ids: older ones missing from a
    peer's filter are no evidence, or tiny filters would trigger rebroadcasts of everything."""
    config = ChannelConfig(
        causal_history_size=1,
        bloom=BloomParams(4, 0.01),
        repair=RepairConfig(t_min_ms=1_000, t_max_ms=5_000),
    )
    a, c = chan("a", config), chan("c", config)
    for i in range(6):  # c has them all; its filter remembers the newest few
        c.receive(a.send(f"m{i}".encode(), i).data, i)
    sync = c.send_sync(5_000)
    assert sync is not None
    a.receive(sync.data, 5_000)
    assert a.sweep_repair(100_000).data == []


def test_giving_up_on_a_message_never_reports_a_delivered_dependency_lost() -> None:
    """M waits for A and X, X for A. M's timeout declares A lost, which releases X, which
    releases M: X was delivered, so it is not lost, and nothing is delivered twice."""
    b = chan("b", ChannelConfig(lost_timeout_ms=10))
    x = Message("a", "X", "c", 2, (HistoryEntry("A"),), content=b"x")
    m = Message("a", "M", "c", 3, (HistoryEntry("A"), HistoryEntry("X")), content=b"m")
    b.receive(encode(m), 0)
    b.receive(encode(x), 5)
    events = b.sweep_incoming(10).events
    assert of(events, MessageLost) == ["A"]
    assert of(events, MessageDelivered) == ["X", "M"]
    assert b.log_ids() == ["X", "M"] and b.incoming_ids() == []
    assert b.sweep_incoming(100).events == [] and b.missing_ids() == []
