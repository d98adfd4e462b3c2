"""Our WakuMessage bytes against the real @waku/proto encoder/decoder."""

from __future__ import annotations

import pytest
from peers import ProcessPeer

from sdsync.wire.waku import WakuMessage, decode_waku_message

pytestmark = pytest.mark.interop

CASES = [
    WakuMessage(payload=b"hello", content_topic="/sds/1/chat/proto"),
    WakuMessage(payload=b"", content_topic="/c", timestamp=1_700_000_000_123_456_789),
    WakuMessage(payload=bytes(range(256)), content_topic="/x/1/y/proto", meta=b"m", version=1),
    WakuMessage(payload=b"neg", content_topic="/c", timestamp=-5, ephemeral=True),
    WakuMessage(payload=b"\x00" * 1000, content_topic="/ü/1/ñ/proto", timestamp=0),
]


def _request(message: WakuMessage) -> dict[str, object]:
    return {
        "payload": message.payload.hex(),
        "contentTopic": message.content_topic,
        "timestamp": None if message.timestamp is None else str(message.timestamp),
        "meta": message.meta.hex() if message.meta else None,
        "version": message.version or None,
        "ephemeral": message.ephemeral or None,
    }


@pytest.mark.parametrize("message", CASES)
def test_identical_bytes_both_ways(js_waku_proto: ProcessPeer, message: WakuMessage) -> None:
    ours = message.to_bytes()
    theirs = bytes.fromhex(js_waku_proto.ok("encode", **_request(message))["bytes"])
    assert ours == theirs
    decoded = js_waku_proto.ok("decode", bytes=ours.hex())["message"]
    assert decoded["contentTopic"] == message.content_topic
    assert bytes.fromhex(decoded["payload"]) == message.payload
    assert decode_waku_message(theirs) == message
