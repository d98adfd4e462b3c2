"""`sdsync peer --stdio`: the command's flags, as a process."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.core import MessageChannel
from sdsync.runtime import profile
from sdsync.wire import Message, decode, encode, message_id_for, message_id_for_sender


def test_peer_requires_stdio() -> None:
    result = CliRunner().invoke(app, ["peer", "--participant", "a"])
    assert result.exit_code == 2


def peer_lines(*flags: str, requests: list[dict[str, object]]) -> list[str]:
    """The reply lines, as written, of a `sdsync peer --stdio` process."""
    argv = [sys.executable, "-m", "sdsync.cli", "peer", "--stdio", "--participant", "p"]
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run(
        [*argv, *flags], input=lines, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.splitlines()


def peer_process(*flags: str, requests: list[dict[str, object]]) -> list[dict[str, object]]:
    return [json.loads(line) for line in peer_lines(*flags, requests=requests)]


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


# Above 2^53 a JSON reader that goes through a double rounds: 2^60 + 1 would become 2^60.
BIG_LAMPORT = 2**60 + 1


def test_lamport_above_2_53_is_written_as_the_exact_integer() -> None:
    incoming = Message("q", "from-q", "0", BIG_LAMPORT + 5, content=b"q")
    requests: list[dict[str, object]] = [
        {"op": "clock", "now_ms": BIG_LAMPORT - 1},
        {"op": "send", "payload_hex": "6f6b"},
        {"op": "receive", "wire_hex": encode(incoming).hex()},
        {"op": "state"},
    ]
    lines = peer_lines(requests=requests)
    _, sent, got, state = (json.loads(line) for line in lines)
    assert float(BIG_LAMPORT) != BIG_LAMPORT
    assert sent["events"] == [
        {"type": "message_sent", "message_id": sent["message_id"], "lamport_timestamp": BIG_LAMPORT}
    ]
    assert decode(bytes.fromhex(sent["wire_hex"])).lamport_timestamp == BIG_LAMPORT
    received = [e for e in got["events"] if e["type"] == "message_received"]
    assert [e["lamport_timestamp"] for e in received] == [BIG_LAMPORT + 5]
    assert state["lamport"] == BIG_LAMPORT + 5 and type(state["lamport"]) is int
    # Written as integer literals, so any JSON reader with big integers gets them exactly.
    assert f'"lamport_timestamp":{BIG_LAMPORT}' in lines[1]
    assert f'"lamport":{BIG_LAMPORT + 5}' in lines[3]


def test_state_counts_the_filters_of_a_peer_on_another_profile() -> None:
    """A js-compatible peer's 18,752-byte filters give a lean peer no ack evidence."""
    stock = MessageChannel("0", "q", now_ms=5, config=profile("js-compatible").channel)
    requests: list[dict[str, object]] = [
        {"op": "clock", "now_ms": 5},
        {"op": "send", "payload_hex": "6f6b"},  # unacknowledged: q's filters are read
        *(
            {"op": "receive", "wire_hex": stock.send(text, now_ms=6).data.hex()}
            for text in (b"one", b"two")
        ),
        {"op": "state"},
    ]
    *_, lean_state = peer_process("--profile", "lean", requests=requests)
    assert lean_state["bloom_ignored"] == {"wrong size": 2}
    assert len(str(lean_state["bloom_hex"])) == 2 * profile("lean").channel.bloom.n_bytes
    *_, stock_state = peer_process(requests=requests)
    assert stock_state["bloom_ignored"] == {}
