"""The conformance peer's JSON-lines contract, in process (sdsync.peer)."""

from __future__ import annotations

import json

from sdsync.core import BloomParams, ChannelConfig, DropReason
from sdsync.peer import PeerSession

CONFIG = ChannelConfig(bloom=BloomParams(100, 0.01))


def session(pid: str) -> PeerSession:
    return PeerSession("0", pid, CONFIG, clock=lambda: 0)


def call(peer: PeerSession, **request: object) -> dict[str, object]:
    return peer.handle(json.dumps(request))


def test_every_op_answers_with_the_documented_shape() -> None:
    a, b = session("a"), session("b")
    assert call(a, op="clock", now_ms=10) == {"ok": True}
    sent = call(a, op="send", payload_hex="6869", retrieval_hint_hex="ab")
    assert sent["ok"] and sent["events"] == [
        {"type": "message_sent", "message_id": sent["message_id"], "lamport_timestamp": 11}
    ]
    got = call(b, op="receive", wire_hex=sent["wire_hex"], retrieval_hint_hex="cd")
    assert [e["type"] for e in got["events"]] == ["message_received", "message_delivered"]  # type: ignore[union-attr, index]
    delivered = got["events"][1]  # type: ignore[index]
    assert delivered["payload_hex"] == "6869" and delivered["retrieval_hint_hex"] == "cd"
    assert call(b, op="sync")["wire_hex"]
    assert call(a, op="ephemeral", payload_hex="00")["wire_hex"]
    assert call(a, op="sweep_incoming") == {"ok": True, "missing": [], "events": []}
    assert call(a, op="sweep_outgoing") == {
        "ok": True,
        "unacknowledged": [sent["message_id"]],
        "possibly_acknowledged": [],
    }
    assert call(a, op="repair_sweep") == {"ok": True, "wire_hex_list": [], "events": []}
    state = call(b, op="state")
    assert (
        state["log"] == [sent["message_id"]] and state["lamport"] == 12
    )  # 11 delivered, +1 for the sync
    assert len(str(state["bloom_hex"])) == 2 * CONFIG.bloom.n_bytes


def test_errors_say_whose_fault_and_keep_the_session_alive() -> None:
    a = session("a")
    cases = {
        "{oops": "local",
        json.dumps({"op": "warp"}): "local",
        json.dumps([1, 2]): "local",
        json.dumps({"op": "clock", "now_ms": -1}): "local",
        json.dumps({"op": "send"}): "local",
        json.dumps({"op": "send", "payload_hex": "zz"}): "local",
        json.dumps({"op": "receive", "wire_hex": "ffff"}): "remote",
    }
    for line, kind in cases.items():
        reply = a.handle(line)
        assert reply["ok"] is False and reply["error"]["kind"] == kind, line  # type: ignore[index]
    assert call(a, op="state")["ok"] is True


def test_drop_reasons_keep_their_strings_in_json() -> None:
    """DropReason is an enum in the core; the JSON contract still carries the same text."""
    a, b = session("a"), session("b")
    sent = call(a, op="send", payload_hex="6869")
    call(b, op="receive", wire_hex=sent["wire_hex"])
    again = call(b, op="receive", wire_hex=sent["wire_hex"])
    assert json.loads(json.dumps(again["events"])) == [
        {"type": "message_dropped", "message_id": sent["message_id"], "reason": "duplicate"}
    ]
    assert {r.value for r in DropReason} >= {"duplicate", "id collision", "wrong channel"}
    assert [r for r in DropReason if r.bad_input] == [
        DropReason.WRONG_CHANNEL,
        DropReason.FUTURE_LAMPORT,
    ]
