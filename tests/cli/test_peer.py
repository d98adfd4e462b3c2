from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.cli.peer import PeerSession
from sdsync.core import BloomParams, ChannelConfig, DropReason
from sdsync.wire import message_id_for, message_id_for_sender

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


def test_demo_converges_and_prints_the_table() -> None:
    result = CliRunner().invoke(app, ["demo", "--quick", "--participants", "4", "--messages", "40"])
    assert result.exit_code == 0, result.output
    assert "converged" in result.output and "same log" in result.output


def test_peer_requires_stdio() -> None:
    result = CliRunner().invoke(app, ["peer", "--participant", "a"])
    assert result.exit_code == 2


def peer_process(*flags: str, requests: list[dict[str, object]]) -> list[dict[str, object]]:
    argv = [sys.executable, "-m", "sdsync.cli", "peer", "--stdio", "--participant", "p"]
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run(
        [*argv, *flags], input=lines, capture_output=True, text=True, timeout=60, check=True
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_message_id_flag_chooses_the_default_id_derivation() -> None:
    """The conformance peer derives ids as @waku/sds does unless told otherwise."""
    requests: list[dict[str, object]] = [
        {"op": "clock", "now_ms": 5},
        {"op": "send", "payload_hex": "6f6b"},
        {"op": "send", "payload_hex": "6f6b"},
    ]
    _, first, second = peer_process(requests=requests)
    assert first["message_id"] == message_id_for(b"ok")
    assert second["ok"] is False  # the same payload twice is the same id
    assert "already used" in second["error"]["message"]  # type: ignore[index]
    _, first, second = peer_process("--message-id", "sender-lamport-payload", requests=requests)
    assert first["message_id"] == message_id_for_sender("p", 6, b"ok")
    assert second["ok"] and second["message_id"] != first["message_id"]
    bad = CliRunner().invoke(app, ["peer", "--stdio", "--participant", "p", "--message-id", "x"])
    assert bad.exit_code == 2 and "--message-id" in bad.output


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
