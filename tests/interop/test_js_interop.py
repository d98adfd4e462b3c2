"""Interop with the real @waku/sds 0.0.8, driven through Node (tests/interop/js/driver.mjs).

Same inputs and the same clock must give the same bytes; messages must flow, be delivered,
acknowledged and repaired in both directions.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from sdsync.core import BloomFilter, BloomParams
from sdsync.wire import HistoryEntry, Message, decode, encode, message_id_for

pytestmark = pytest.mark.interop

# @waku/sds 0.0.8 hardcodes its filter at 10,000 / 0.001; the driver honours other sizes by
# replacing the channel's private `filter` field. Tests that use this end in
# _patched_private_bloom, and every behaviour they cover also has a case against the stock
# package with its default filter.
PATCHED_SMALL_BLOOM: dict[str, Any] = {"bloom_capacity": 100, "bloom_error_rate": 0.01}
STOCK_BLOOM = BloomParams()  # what the stock package uses


def types(reply: dict[str, Any]) -> list[str]:
    return [e["type"] for e in reply["events"]]


def ids_of(reply: dict[str, Any], event_type: str) -> list[str]:
    return [e["message_id"] for e in reply["events"] if e["type"] == event_type]


def both(peers: list[Any], op: str, **fields: Any) -> list[dict[str, Any]]:
    return [p.ok(op, **fields) for p in peers]


def test_same_inputs_give_identical_wire_and_bloom_bytes(js_peer: Any, py_peer: Any) -> None:
    """Alice in JS and alice in Python see the same traffic; every byte they emit matches."""
    alices = [js_peer("alice"), py_peer("alice")]
    bob = js_peer("bob", seed=7)
    bob.ok("clock", now_ms=1_000)
    both(alices, "clock", now_ms=1_000)
    for i in range(12):
        now = 1_000 + 37 * i
        both(alices, "clock", now_ms=now)
        bob.ok("clock", now_ms=now)
        if i % 3 == 2:
            incoming = bob.ok("send", payload_hex=f"b0b{i:03d}", retrieval_hint_hex=f"{i:064x}")
            hint = hashlib.sha256(bytes.fromhex(incoming["wire_hex"])).hexdigest()
            replies = both(
                alices, "receive", wire_hex=incoming["wire_hex"], retrieval_hint_hex=hint
            )
            assert all("message_delivered" in types(r) for r in replies)
        sends = both(
            alices, "send", payload_hex=f"a11ce{i:03d}", retrieval_hint_hex=f"{i:02x}" * 32
        )
        assert sends[0]["message_id"] == sends[1]["message_id"]
        assert sends[0]["wire_hex"] == sends[1]["wire_hex"], f"send {i} differs"
    states = both(alices, "state")
    for key in ("lamport", "log", "bloom_hex", "outgoing"):
        assert states[0][key] == states[1][key], key
    assert len(states[0]["bloom_hex"]) == 2 * 18_752


def test_bloom_bytes_identical_with_many_ids(js_peer: Any, py_peer: Any) -> None:
    assert_bloom_bytes_identical(js_peer, py_peer, {}, 150, {})


@pytest.mark.parametrize(
    ("count", "py_only"),
    [
        (90, {}),
        # Past capacity js-waku keeps filling; we roll over unless told not to.
        (150, {"bloom_rollover": False}),
    ],
)
def test_bloom_bytes_identical_with_many_ids_patched_private_bloom(
    js_peer: Any, py_peer: Any, count: int, py_only: dict[str, Any]
) -> None:
    assert_bloom_bytes_identical(js_peer, py_peer, PATCHED_SMALL_BLOOM, count, py_only)


def assert_bloom_bytes_identical(
    js_peer: Any, py_peer: Any, options: dict[str, Any], count: int, py_only: dict[str, Any]
) -> None:
    alices = [js_peer("alice", **options), py_peer("alice", **options, **py_only)]
    bob = js_peer("bob", **options)
    bob.ok("clock", now_ms=5)
    both(alices, "clock", now_ms=5)
    for i in range(count):
        wire = bob.ok("send", payload_hex=f"{i:08x}")["wire_hex"]
        both(alices, "receive", wire_hex=wire)
    states = both(alices, "state")
    assert states[0]["bloom_hex"] == states[1]["bloom_hex"]
    assert states[0]["log"] == states[1]["log"]
    assert int(states[1]["bloom_hex"], 16) != 0


def ones(bloom_hex: str) -> int:
    return bin(int(bloom_hex, 16)).count("1")


def test_rollover_keeps_our_filter_useful_past_capacity_patched_private_bloom(
    js_peer: Any, py_peer: Any
) -> None:
    """At 3x capacity js-waku's filter is nearly all ones; ours still rejects strangers."""
    js, py = js_peer("alice", **PATCHED_SMALL_BLOOM), py_peer("alice", **PATCHED_SMALL_BLOOM)
    bob = js_peer("bob", **PATCHED_SMALL_BLOOM)
    for i in range(300):
        wire = bob.ok("send", payload_hex=f"{i:08x}")["wire_hex"]
        both([js, py], "receive", wire_hex=wire)
    fill = {peer.name: ones(peer.ok("state")["bloom_hex"]) for peer in (js, py)}
    assert fill["py:alice"] < 0.6 * fill["js:alice"], fill


# Past the stock capacity without a patched filter: 3x capacity ids, each in a content
# message that names one id nobody has and carries no filter. Every id enters the
# receiver's filter, while the message waits in its incoming buffer; delivered messages
# would enter @waku/sds's log, which it re-sorts on every insert (minutes at this count).
PAST_CAPACITY = 3 * STOCK_BLOOM.capacity


@pytest.fixture(scope="module")
def stock_filters_past_capacity(module_js_peer: Any, py_peer: Any) -> dict[str, dict[str, Any]]:
    room = {"max_incoming_buffer": PAST_CAPACITY}
    js = module_js_peer("alice")
    ours = [py_peer("alice", **room), py_peer("alice-no-rollover", bloom_rollover=False, **room)]
    never = (HistoryEntry("never-sent", sender_id="bob"),)
    wires = [
        encode(Message("bob", f"m{i}", "0", 1_000 + i, never, None, b"x")).hex()
        for i in range(PAST_CAPACITY)
    ]

    def feed(peer: Any) -> dict[str, Any]:
        peer.ok("clock", now_ms=1_000)
        for wire in wires:
            peer.ok("receive", wire_hex=wire)
        state: dict[str, Any] = peer.ok("state")
        return state

    # The Node process works while this one feeds our peers.
    with ThreadPoolExecutor(1) as pool:
        js_state = pool.submit(feed, js)
        states = {peer.name: feed(peer) for peer in ours}
        states[js.name] = js_state.result()
    return states


@pytest.mark.xdist_group("stock-past-capacity")  # one worker builds the fixture
def test_bloom_bytes_identical_past_capacity_without_rollover(
    stock_filters_past_capacity: dict[str, dict[str, Any]],
) -> None:
    js = stock_filters_past_capacity["js:alice"]
    py = stock_filters_past_capacity["py:alice-no-rollover"]
    assert len(js["incoming"]) == len(py["incoming"]) == PAST_CAPACITY  # every id taken in
    assert len(js["bloom_hex"]) == 2 * STOCK_BLOOM.n_bytes
    assert js["bloom_hex"] == py["bloom_hex"]


@pytest.mark.xdist_group("stock-past-capacity")  # one worker builds the fixture
def test_rollover_keeps_our_filter_useful_past_capacity(
    stock_filters_past_capacity: dict[str, dict[str, Any]],
) -> None:
    """At 3x capacity js-waku's filter is nearly all ones; ours still rejects strangers."""
    js = ones(stock_filters_past_capacity["js:alice"]["bloom_hex"])
    py = ones(stock_filters_past_capacity["py:alice"]["bloom_hex"])
    assert 0 < py < 0.6 * js, (py, js)


def test_ephemeral_bytes_identical_and_understood(js_peer: Any, py_peer: Any) -> None:
    js, py = js_peer("alice"), py_peer("alice")
    replies = [p.ok("ephemeral", payload_hex="e9e9") for p in (js, py)]
    assert replies[0]["wire_hex"] == replies[1]["wire_hex"]
    other = py_peer("bob")
    got = other.ok("receive", wire_hex=replies[0]["wire_hex"])
    assert types(got) == ["ephemeral_received"]
    assert got["events"][0]["payload_hex"] == "e9e9"
    assert other.ok("state")["log"] == []
    assert js.ok("receive", wire_hex=other.ok("ephemeral", payload_hex="ab")["wire_hex"])


def test_sync_messages_match_except_their_random_id(js_peer: Any, py_peer: Any) -> None:
    alices = [js_peer("alice"), py_peer("alice")]
    both(alices, "clock", now_ms=100)
    empty = both(alices, "sync")
    assert empty[0]["wire_hex"] is None and empty[1]["wire_hex"] is None
    both(alices, "send", payload_hex="01")
    both(alices, "clock", now_ms=100)
    syncs = [decode(bytes.fromhex(r["wire_hex"])) for r in both(alices, "sync")]
    assert syncs[0].message_id.startswith("sync-") and syncs[1].message_id.startswith("sync-")
    for field in ("sender_id", "channel_id", "lamport_timestamp", "causal_history", "bloom_filter"):
        assert getattr(syncs[0], field) == getattr(syncs[1], field), field
    assert syncs[0].content is None and syncs[1].content is None


@pytest.mark.parametrize("direction", ["js->py", "py->js"])
def test_delivery_and_acknowledgement_by_causal_history(
    js_peer: Any, py_peer: Any, direction: str
) -> None:
    js, py = js_peer("j"), py_peer("p")
    sender, receiver = (js, py) if direction == "js->py" else (py, js)
    for peer in (js, py):
        peer.ok("clock", now_ms=10_000)
    first = sender.ok("send", payload_hex="6669727374")
    got = receiver.ok("receive", wire_hex=first["wire_hex"])
    assert ids_of(got, "message_delivered") == [first["message_id"]]
    assert receiver.ok("state")["log"] == [first["message_id"]]

    reply = receiver.ok("send", payload_hex="7265706c79")
    ack = sender.ok("receive", wire_hex=reply["wire_hex"])
    assert first["message_id"] in ids_of(ack, "message_acknowledged")
    assert ids_of(ack, "message_delivered") == [reply["message_id"]]
    assert sender.ok("sweep_outgoing")["unacknowledged"] == []
    assert sender.ok("state")["log"] == receiver.ok("state")["log"]


@pytest.mark.parametrize("direction", ["js->py", "py->js"])
def test_acknowledgement_by_bloom_filter_from_two_peers(
    js_peer: Any, py_peer: Any, direction: str
) -> None:
    """Sync messages whose causal history is too short to name the message ack via bloom."""
    if direction == "js->py":
        sender = js_peer("s")
        acks = [py_peer("r1", causal_history=1), py_peer("r2", causal_history=1)]
    else:
        sender = py_peer("s")
        acks = [js_peer("r1", causal_history=1), js_peer("r2", causal_history=1)]
    for peer in [sender, *acks]:
        peer.ok("clock", now_ms=50)
    # The sender hears from both receivers first: our threshold of 2 distinct peers never
    # exceeds the peers heard from, so with one known peer a single filter would do.
    hello = acks[1].ok("send", payload_hex="cc")["wire_hex"]
    for peer in (sender, acks[0]):
        peer.ok("receive", wire_hex=hello)
    target = sender.ok("send", payload_hex="aa")
    newer = sender.ok("send", payload_hex="bb")
    for peer in acks:
        peer.ok("receive", wire_hex=target["wire_hex"])
        peer.ok("receive", wire_hex=newer["wire_hex"])
    first = sender.ok("receive", wire_hex=acks[0].ok("sync")["wire_hex"])
    # r1's sync names only `newer` in its history; `target` is acknowledged by bloom alone.
    assert ids_of(first, "message_acknowledged") == [newer["message_id"]]
    possibly = [e for e in first["events"] if e["type"] == "message_possibly_acknowledged"]
    assert [(e["message_id"], e["count"]) for e in possibly] == [(target["message_id"], 1)]
    assert sender.ok("sweep_outgoing")["possibly_acknowledged"] == [target["message_id"]]
    second = sender.ok("receive", wire_hex=acks[1].ok("sync")["wire_hex"])
    assert target["message_id"] in ids_of(second, "message_acknowledged")
    assert sender.ok("sweep_outgoing") == {
        "ok": True,
        "unacknowledged": [],
        "possibly_acknowledged": [],
    }


@pytest.mark.parametrize("direction", ["js asks, py repairs", "py asks, js repairs"])
def test_repair_requests_are_understood_both_ways(
    js_peer: Any, py_peer: Any, direction: str
) -> None:
    if direction == "js asks, py repairs":
        origin, asker = py_peer("origin"), js_peer("asker")
    else:
        origin, asker = js_peer("origin"), py_peer("asker")
    for peer in (origin, asker):
        peer.ok("clock", now_ms=1_000)
    lost = origin.ok("send", payload_hex="6c6f7374")
    later = origin.ok("send", payload_hex="6c61746572")
    got = asker.ok("receive", wire_hex=later["wire_hex"])
    assert ids_of(got, "message_missing") == [lost["message_id"]]
    assert asker.ok("state")["incoming"] == [later["message_id"]]

    for peer in (origin, asker):
        peer.ok("clock", now_ms=1_000 + 120_001)  # past T_max: the request is due
    carrier = asker.ok("sync")
    assert ids_of(carrier, "repair_request_sent") == [lost["message_id"]]
    request = decode(bytes.fromhex(carrier["wire_hex"]))
    assert [r.message_id for r in request.repair_request] == [lost["message_id"]]

    heard = origin.ok("receive", wire_hex=carrier["wire_hex"])
    assert ids_of(heard, "repair_request_received") == [lost["message_id"]]
    sweep = origin.ok("repair_sweep")  # the original sender answers at once
    assert ids_of(sweep, "repair_response_sent") == [lost["message_id"]]
    assert len(sweep["wire_hex_list"]) == 1
    assert sweep["wire_hex_list"][0] == lost["wire_hex"]

    healed = asker.ok("receive", wire_hex=sweep["wire_hex_list"][0])
    delivered = ids_of(healed, "message_delivered")
    assert delivered[0] == lost["message_id"]
    # We cascade at once; js-waku releases the dependent on its next incoming sweep.
    delivered += ids_of(asker.ok("sweep_incoming"), "message_delivered")
    assert delivered == [lost["message_id"], later["message_id"]]
    assert asker.ok("state")["log"] == origin.ok("state")["log"]


def test_repair_request_timing_matches_js(js_peer: Any, py_peer: Any) -> None:
    """T_req uses the same hash: the request rides on the same send in both."""
    origin = js_peer("origin")
    askers = [js_peer("asker"), py_peer("asker")]
    origin.ok("clock", now_ms=0)
    both(askers, "clock", now_ms=0)
    lost = origin.ok("send", payload_hex="01")
    later = origin.ok("send", payload_hex="02")
    both(askers, "receive", wire_hex=later["wire_hex"])
    seen_at = []
    for step in range(0, 125_000, 5_000):
        both(askers, "clock", now_ms=step)
        replies = both(askers, "sync")
        sent = [bool(ids_of(r, "repair_request_sent")) for r in replies]
        assert sent[0] == sent[1], f"at {step} ms js={sent[0]} py={sent[1]}"
        if sent[0]:
            seen_at.append(step)
            # Both ask for the lost message, and only for it, in the sync they send.
            for who, reply in zip(("js", "py"), replies, strict=True):
                wire = decode(bytes.fromhex(reply["wire_hex"]))
                asked = [r.message_id for r in wire.repair_request]
                assert ids_of(reply, "repair_request_sent") == [lost["message_id"]], who
                assert asked == [lost["message_id"]], f"{who} at {step} ms"
    # Due once between T_min and T_max, then re-armed (ours) — js asks only once.
    assert seen_at and 30_000 <= seen_at[0] <= 120_000


def test_garbage_is_a_remote_error_for_both(js_peer: Any, py_peer: Any) -> None:
    for peer in (js_peer("x"), py_peer("x")):
        reply = peer.call("receive", wire_hex="ffffffff")
        assert reply["ok"] is False and reply["error"]["kind"] == "remote"
        assert peer.ok("state")["log"] == []


def test_wrong_size_bloom_from_js_view_patched_private_bloom(js_peer: Any, py_peer: Any) -> None:
    """A peer with a different bloom size: js aborts the message; we still deliver it."""
    odd = js_peer("odd", **PATCHED_SMALL_BLOOM)
    odd.ok("clock", now_ms=1)
    wire = odd.ok("send", payload_hex="0dd0")["wire_hex"]
    assert_wrong_size_bloom_handled(js_peer, py_peer, wire)


def test_wrong_size_bloom_from_js_view(js_peer: Any, py_peer: Any) -> None:
    """The same with a stock peer's message whose filter is swapped for a small one that
    holds the receivers' own id: js aborts it; we deliver it and take no ack from it."""
    odd = js_peer("odd")
    odd.ok("clock", now_ms=1)
    message = decode(bytes.fromhex(odd.ok("send", payload_hex="0dd0")["wire_hex"]))
    small = BloomFilter(
        BloomParams(PATCHED_SMALL_BLOOM["bloom_capacity"], PATCHED_SMALL_BLOOM["bloom_error_rate"])
    )
    small.insert(message_id_for(bytes.fromhex("0001")))  # what the receivers will have sent
    assert len(small.to_bytes()) != STOCK_BLOOM.n_bytes
    wire = encode(replace(message, bloom_filter=small.to_bytes())).hex()
    assert_wrong_size_bloom_handled(js_peer, py_peer, wire)


def assert_wrong_size_bloom_handled(js_peer: Any, py_peer: Any, wire: str) -> None:
    py = py_peer("p")
    py.ok("clock", now_ms=2)
    py.ok("send", payload_hex="0001")  # something of ours that the bad filter must not ack
    got = py.ok("receive", wire_hex=wire)
    assert "message_delivered" in types(got)
    assert py.ok("sweep_outgoing")["unacknowledged"] != []
    js = js_peer("j")
    js.ok("clock", now_ms=2)
    js.ok("send", payload_hex="0001")
    assert js.call("receive", wire_hex=wire)["ok"] is False  # js-waku throws here


def test_cli_peer_process_matches_js(js_peer: Any, cli_peer: Any) -> None:
    peers = [js_peer("alice"), cli_peer("alice")]
    both(peers, "clock", now_ms=77)
    sends = both(peers, "send", payload_hex="0c11")
    assert sends[0]["wire_hex"] == sends[1]["wire_hex"]
    bad = peers[1].exchange("{not json")
    assert bad["ok"] is False and bad["error"]["kind"] == "local"
    unknown = peers[1].call("frobnicate")
    assert unknown["error"]["kind"] == "local"
    assert peers[1].ok("state")["log"] == [sends[0]["message_id"]]


# SDS-R with several response groups (REFERENCE §3, computed here with hashlib): a holder
# answers a repair request only if hash(holder + id) mod G == hash(sender + id) mod G, at
# T_resp = (hash(holder) XOR hash(sender)) * hash(id) mod T_max after the request arrived.
RESPONSE_GROUPS = 3
GROUPED = {"repair_t_min_ms": 3_000, "repair_t_max_ms": 12_000}


def repair_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def response_group(participant: str, message_id: str) -> int:
    return repair_hash(participant + message_id) % RESPONSE_GROUPS


def response_delay(participant: str, sender: str, message_id: str) -> int:
    distance = repair_hash(participant) ^ repair_hash(sender)
    return distance * repair_hash(message_id) % GROUPED["repair_t_max_ms"]


def holder_names(kind: str, sender: str, message_id: str) -> tuple[str, str]:
    """The first names of this kind inside and outside the sender's response group."""
    names = [f"{kind}-holder-{i}" for i in range(100)]
    group = response_group(sender, message_id)
    inside = next(n for n in names if response_group(n, message_id) == group)
    outside = next(n for n in names if response_group(n, message_id) != group)
    return inside, outside


@pytest.mark.parametrize("origin_kind", ["js", "py"])
def test_only_the_senders_response_group_answers_a_repair_request(
    js_peer: Any, py_peer: Any, cli_peer: Any, origin_kind: str
) -> None:
    """@waku/sds and ours agree on who answers and when, with three response groups.

    The original sender, one holder of each implementation inside its group and one
    outside, and one `sdsync peer` process outside (its --repair-response-groups flag must
    take effect) all hold the message; the asker is of the other implementation.
    """
    options = {**GROUPED, "repair_response_groups": RESPONSE_GROUPS}
    start = {"js": js_peer, "py": py_peer, "cli": cli_peer}
    asker_kind = "py" if origin_kind == "js" else "js"
    payload = "6c6f7374"
    mid = hashlib.sha256(bytes.fromhex(payload)).hexdigest()  # @waku/sds's id
    names = {"origin": origin_kind, "asker": asker_kind}
    for kind in ("js", "py"):
        names.update(dict.fromkeys(holder_names(kind, "origin", mid), kind))
    names[holder_names("cli", "origin", mid)[1]] = "cli"
    seeds = iter(range(1, 100))
    peers = {
        name: start[kind](name, **options, **({"seed": next(seeds)} if kind == "js" else {}))
        for name, kind in names.items()
    }
    origin, asker = peers["origin"], peers["asker"]
    holders = {name: peer for name, peer in peers.items() if name != "asker"}

    def clock(now: int) -> None:
        for peer in peers.values():
            peer.ok("clock", now_ms=now)

    clock(1_000_000)
    lost = origin.ok("send", payload_hex=payload)
    later = origin.ok("send", payload_hex="6c61746572")
    assert lost["message_id"] == mid
    for name, peer in holders.items():
        if name != "origin":
            for wire in (lost["wire_hex"], later["wire_hex"]):
                assert "message_delivered" in types(peer.ok("receive", wire_hex=wire))
    asker.ok("receive", wire_hex=later["wire_hex"])

    asked_at = 1_000_000 + GROUPED["repair_t_max_ms"] + 1  # past T_req, whatever it is
    clock(asked_at)
    carrier = asker.ok("sync")
    assert ids_of(carrier, "repair_request_sent") == [mid]
    for peer in holders.values():
        heard = peer.ok("receive", wire_hex=carrier["wire_hex"])
        assert ids_of(heard, "repair_request_received") == [mid]

    # Rebroadcasts are not passed on, so nobody's answer cancels another's.
    answered: dict[str, int] = {}
    for now in range(asked_at, asked_at + GROUPED["repair_t_max_ms"] + 1, 250):
        clock(now)
        for name, peer in holders.items():
            sweep = peer.ok("repair_sweep")
            if sweep["wire_hex_list"]:
                assert sweep["wire_hex_list"] == [lost["wire_hex"]], name
                assert name not in answered, f"{name} answered twice"
                answered[name] = now
    in_group = {n for n in holders if response_group(n, mid) == response_group("origin", mid)}
    assert set(answered) == in_group
    assert {names[n] for n in holders if n not in in_group} == {"js", "py", "cli"}
    assert {names[n] for n in in_group - {"origin"}} == {"js", "py"}
    for name, at in answered.items():
        due = asked_at + response_delay(name, "origin", mid)
        assert due <= at < due + 250, (name, at - asked_at, due - asked_at)
    assert answered["origin"] == asked_at  # the original sender answers first, at once


# Lamport timestamps are uint64 on the wire; @waku/sds holds them as bigint, JSON numbers
# lose precision above 2^53. 2^60 + 1 does not survive a trip through a double.
BIG_LAMPORT = 2**60 + 1
assert float(BIG_LAMPORT) != BIG_LAMPORT


def test_lamport_above_2_53_crosses_the_json_contract_exactly(
    js_peer: Any, py_peer: Any, cli_peer: Any
) -> None:
    """Ours answer the exact integer as a JSON number; the @waku/sds driver, whose clock
    op takes only safe integers, answers Lamport values above 2^53 - 1 as decimal strings."""
    py, js, cli = py_peer("p"), js_peer("j"), cli_peer("c")
    assert js.call("clock", now_ms=BIG_LAMPORT)["error"]["kind"] == "local"
    js.ok("clock", now_ms=1_000)
    for ours in (py, cli):
        ours.ok("clock", now_ms=BIG_LAMPORT - 1)
    sent = py.ok("send", payload_hex="01")
    assert [e["lamport_timestamp"] for e in sent["events"]] == [BIG_LAMPORT]
    assert decode(bytes.fromhex(sent["wire_hex"])).lamport_timestamp == BIG_LAMPORT
    assert "message_delivered" in types(js.ok("receive", wire_hex=sent["wire_hex"]))
    assert js.ok("state")["lamport"] == str(BIG_LAMPORT)
    cli.ok("receive", wire_hex=sent["wire_hex"])

    reply = js.ok("send", payload_hex="02")  # bigint arithmetic: exactly one more
    assert decode(bytes.fromhex(reply["wire_hex"])).lamport_timestamp == BIG_LAMPORT + 1
    for ours in (py, cli):
        got = ours.ok("receive", wire_hex=reply["wire_hex"])
        received = [e for e in got["events"] if e["type"] == "message_received"]
        assert [e["lamport_timestamp"] for e in received] == [BIG_LAMPORT + 1]
        state = ours.ok("state")
        assert type(state["lamport"]) is int and state["lamport"] == BIG_LAMPORT + 1
    logs = [peer.ok("state")["log"] for peer in (py, js, cli)]
    assert logs[0] == logs[1] == logs[2] == [sent["message_id"], reply["message_id"]]
