"""The Waku store, LightPush, Filter and metadata RPCs, their framing, and autosharding.

The ``interop`` tests hold our bytes against the real @waku/proto 0.0.15 (and @waku/utils'
autosharding) through tests/interop/js/waku_protocols.mjs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from interop.peers import ProcessPeer

from sdsync import waku as rpc
from sdsync.errors import LocalProtocolError, RejectReason, RemoteProtocolError
from sdsync.waku.filter import waku_filter_pb2 as filter_pb
from sdsync.waku.relay.topics import (
    TWN_CLUSTER_ID,
    TWN_SHARD_COUNT,
    ContentTopic,
    parse_content_topic,
    shard_pubsub_topic,
)
from sdsync.waku.rpc import encode_frame, read_frame
from sdsync.waku.store import waku_store_pb2 as store_pb
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES, WakuMessage

R = RejectReason
JS_SCRIPT = Path(__file__).parents[1] / "interop" / "js" / "waku_protocols.mjs"
HASH = bytes(range(32))
MESSAGE = WakuMessage(b"sds", "/sds/1/chat/proto", timestamp=1_700_000_000_123_456_789)
FULL_MESSAGE = WakuMessage(
    bytes(range(256)), "/ü/1/ñ/proto", timestamp=-5, meta=b"m", version=1, ephemeral=True
)

CASES: list[Any] = [
    rpc.StoreQueryRequest("r1"),
    rpc.StoreQueryRequest(
        "r2",
        include_data=True,
        pubsub_topic="/waku/2/rs/1/7",
        content_topics=("/sds/1/probe/proto", "/sds/1/chat/proto"),
        time_start=-(1 << 63) + 1,
        time_end=(1 << 63) - 1,
        pagination_cursor=HASH,
        pagination_forward=True,
        pagination_limit=(1 << 64) - 1,
    ),
    rpc.StoreQueryRequest("r3", message_hashes=(HASH, bytes(32)), pagination_limit=0),
    rpc.StoreQueryResponse("r1"),
    rpc.StoreQueryResponse(
        "r2",
        status_code=200,
        status_desc="OK",
        messages=(
            rpc.WakuMessageKeyValue(HASH, MESSAGE, "/waku/2/rs/1/7"),
            rpc.WakuMessageKeyValue(bytes(32), FULL_MESSAGE, ""),
            rpc.WakuMessageKeyValue(HASH),
        ),
        pagination_cursor=HASH,
    ),
    rpc.StoreQueryResponse("", status_code=0, status_desc=""),
    rpc.LightPushRequestV3("p1"),
    rpc.LightPushRequestV3("p2", pubsub_topic="/waku/2/rs/1/7", message=MESSAGE),
    rpc.LightPushRequestV3("p3", pubsub_topic="", message=FULL_MESSAGE),
    rpc.LightPushResponseV3("p1"),
    rpc.LightPushResponseV3("p2", status_code=200, status_desc="", relay_peer_count=0),
    rpc.LightPushResponseV3("p3", status_code=503, status_desc="no peers", relay_peer_count=7),
    rpc.PushRpc("v2"),
    rpc.PushRpc("v2", request=rpc.PushRequest()),
    rpc.PushRpc("v2", request=rpc.PushRequest("/waku/2/rs/1/7", MESSAGE)),
    rpc.PushRpc("v2", response=rpc.PushResponse()),
    rpc.PushRpc("v2", response=rpc.PushResponse(True, "", 200, "OK", 3)),
    rpc.FilterSubscribeRequest("f1"),
    *(
        rpc.FilterSubscribeRequest("f2", kind, "/waku/2/rs/1/7", ("/sds/1/chat/proto",))
        for kind in rpc.FilterSubscribeType
    ),
    rpc.FilterSubscribeRequest("f3", rpc.FilterSubscribeType.UNSUBSCRIBE_ALL, pubsub_topic=""),
    rpc.FilterSubscribeResponse("f1"),
    rpc.FilterSubscribeResponse("f2", status_code=404, status_desc="peer has no subscriptions"),
    rpc.MessagePush(),
    rpc.MessagePush(MESSAGE, "/waku/2/rs/1/7"),
    rpc.MessagePush(FULL_MESSAGE),
    rpc.WakuMetadata(),
    rpc.WakuMetadata(cluster_id=0),
    rpc.WakuMetadata(cluster_id=1, shards=(0, 1, 7, 300, (1 << 32) - 1)),
]


def _case_id(value: Any) -> str:
    return type(value).__name__


# --- round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("value", CASES, ids=_case_id)
def test_representative_values_round_trip(value: Any) -> None:
    assert type(value).from_bytes(value.to_bytes()) == value


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


texts = st.text(max_size=30)
hashes = st.binary(min_size=32, max_size=32)
int64s = st.integers(-(1 << 63), (1 << 63) - 1)
uint32s = st.integers(0, (1 << 32) - 1)
waku_messages = st.builds(
    WakuMessage,
    payload=st.binary(max_size=100),
    content_topic=st.text(min_size=1, max_size=30),
    timestamp=_optional(int64s),
    meta=st.binary(max_size=20),
    version=uint32s,
    ephemeral=st.booleans(),
)
key_values = st.builds(
    rpc.WakuMessageKeyValue, _optional(hashes), _optional(waku_messages), _optional(texts)
)
values = st.one_of(
    st.builds(
        rpc.StoreQueryRequest,
        texts,
        st.booleans(),
        _optional(texts),
        st.lists(texts, max_size=3).map(tuple),
        _optional(int64s),
        _optional(int64s),
        st.lists(hashes, max_size=3).map(tuple),
        _optional(hashes),
        st.booleans(),
        _optional(st.integers(0, (1 << 64) - 1)),
    ),
    st.builds(
        rpc.StoreQueryResponse,
        texts,
        _optional(uint32s),
        _optional(texts),
        st.lists(key_values, max_size=3).map(tuple),
        _optional(hashes),
    ),
    st.builds(rpc.LightPushRequestV3, texts, _optional(texts), _optional(waku_messages)),
    st.builds(rpc.LightPushResponseV3, texts, uint32s, _optional(texts), _optional(uint32s)),
    st.builds(
        rpc.PushRpc,
        texts,
        _optional(st.builds(rpc.PushRequest, texts, _optional(waku_messages))),
        _optional(
            st.builds(
                rpc.PushResponse,
                st.booleans(),
                _optional(texts),
                _optional(uint32s),
                _optional(texts),
                _optional(uint32s),
            )
        ),
    ),
    st.builds(
        rpc.FilterSubscribeRequest,
        texts,
        st.sampled_from(rpc.FilterSubscribeType),
        _optional(texts),
        st.lists(texts, max_size=3).map(tuple),
    ),
    st.builds(rpc.FilterSubscribeResponse, texts, uint32s, _optional(texts)),
    st.builds(rpc.MessagePush, _optional(waku_messages), _optional(texts)),
    st.builds(rpc.WakuMetadata, _optional(uint32s), st.lists(uint32s, max_size=5).map(tuple)),
)


@given(values)
def test_round_trip(value: Any) -> None:
    assert type(value).from_bytes(value.to_bytes()) == value


@given(values)
def test_frames_round_trip_in_any_chunks(value: Any) -> None:
    body = value.to_bytes()
    for chunk in (1, 3, len(body) + 10):
        stream = Stream(encode_frame(body) + encode_frame(body), chunk=chunk)
        assert run(read_frame(stream.read)) == body
        assert run(read_frame(stream.read)) == body
        assert run(read_frame(stream.read)) is None


# --- what a peer may send ------------------------------------------------------------


def _hashes(*hashes: bytes) -> bytes:
    return store_pb.StoreQueryRequest(message_hashes=hashes).SerializeToString()


def _bad_type() -> bytes:
    request = filter_pb.FilterSubscribeRequest(request_id="f")
    request.filter_subscribe_type = 7  # type: ignore[assignment]
    return request.SerializeToString()


REJECTED = [
    pytest.param(rpc.StoreQueryRequest, b"\xff\xff\xff", R.MALFORMED_RPC, id="garbage"),
    pytest.param(rpc.StoreQueryResponse, b"\x0a\x05ab", R.MALFORMED_RPC, id="truncated"),
    pytest.param(rpc.LightPushResponseV3, b"\x0a\x02\xc3\x28", R.MALFORMED_RPC, id="bad utf-8"),
    pytest.param(rpc.StoreQueryRequest, _hashes(HASH, b"short"), R.MALFORMED_RPC, id="short hash"),
    pytest.param(
        rpc.StoreQueryResponse,
        store_pb.StoreQueryResponse(pagination_cursor=HASH + b"!").SerializeToString(),
        R.MALFORMED_RPC,
        id="long cursor",
    ),
    pytest.param(rpc.FilterSubscribeRequest, _bad_type(), R.MALFORMED_RPC, id="unknown type"),
    pytest.param(
        rpc.MessagePush,
        filter_pb.MessagePush(waku_message=b"\x0a\x01x").SerializeToString(),
        R.NOT_WAKU_MESSAGE,
        id="message without content topic",
    ),
    pytest.param(
        rpc.LightPushRequestV3,
        rpc.LightPushRequestV3("p").to_bytes() + b"\xaa\x01\x03\xff\xff\xff",
        R.NOT_WAKU_MESSAGE,
        id="message that does not parse",
    ),
    pytest.param(
        rpc.StoreQueryResponse,
        rpc.StoreQueryResponse(
            "r",
            messages=(
                rpc.WakuMessageKeyValue(
                    HASH, WakuMessage(bytes(MAX_WAKU_MESSAGE_BYTES), "/c"), "/waku/2/rs/1/0"
                ),
            ),
        ).to_bytes(),
        R.OVERSIZED,
        id="oversized message",
    ),
    pytest.param(
        rpc.PushRpc,
        b"\x12\x03\x12\x01\xff",
        R.NOT_WAKU_MESSAGE,
        id="v2 request with a bad message",
    ),
]


@pytest.mark.parametrize(("rpc", "data", "reason"), REJECTED)
def test_each_rejection_has_its_reason(rpc: Any, data: bytes, reason: RejectReason) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        rpc.from_bytes(data)
    assert caught.value.reason is reason


def test_unknown_fields_are_skipped() -> None:
    data = rpc.WakuMetadata(1, (2,)).to_bytes() + b"\xf8\x01\x05"  # field 31, varint 5
    assert rpc.WakuMetadata.from_bytes(data) == rpc.WakuMetadata(1, (2,))


def test_metadata_writes_the_shards_unpacked_in_field_2_then_packed_in_field_3() -> None:
    """As nwaku writes them: js-waku reads field 2 (one tag each), go-waku field 3 only."""
    value = rpc.WakuMetadata(cluster_id=1, shards=(0, 7, 300))
    assert value.to_bytes().hex() == "0801" + "1000" + "1007" + "10ac02" + "1a04" + "0007ac02"
    assert rpc.WakuMetadata(cluster_id=1).to_bytes().hex() == "0801"
    assert rpc.WakuMetadata().to_bytes() == b""


@pytest.mark.parametrize(
    ("data", "shards"),
    [
        # nwaku: field 2 one tag per shard, then field 3 packed.
        pytest.param("0801" + "1001100710ac02" + "1a040107ac02", (1, 7, 300), id="nwaku"),
        pytest.param("0801" + "12040107ac02", (1, 7, 300), id="packed 2 only"),
        pytest.param("0801" + "1001100710ac02", (1, 7, 300), id="unpacked 2 only (js-waku)"),
        pytest.param("0801" + "1a040107ac02", (1, 7, 300), id="3 only"),
        pytest.param("0801" + "1001" + "1a0107", (7,), id="field 3 wins over 2"),
        pytest.param("0801" + "1001" + "1a00", (1,), id="an empty field 3 gives way to 2"),
    ],
)
def test_metadata_reads_field_3_else_field_2_packed_or_not(data: str, shards: Any) -> None:
    """As nwaku reads them: field 3 when it holds a shard, else field 2 in either encoding."""
    assert rpc.WakuMetadata.from_bytes(bytes.fromhex(data)) == rpc.WakuMetadata(1, shards)


@pytest.mark.parametrize(
    "build",
    [
        lambda: rpc.StoreQueryRequest("r", message_hashes=(b"short",)),
        lambda: rpc.StoreQueryRequest("r", pagination_cursor=bytes(33)),
        lambda: rpc.WakuMessageKeyValue(bytes(31)),
    ],
)
def test_a_hash_of_another_size_is_our_callers_error(build: Any) -> None:
    with pytest.raises(LocalProtocolError, match="32-byte hash"):
        build()


@pytest.mark.parametrize(
    "value",
    [
        rpc.StoreQueryRequest("r", pagination_limit=-1),
        rpc.StoreQueryRequest("r", time_start=1 << 63),
        rpc.LightPushResponseV3("p", status_code=1 << 32),
        rpc.WakuMetadata(shards=(-1,)),
        rpc.PushRpc("v2", response=rpc.PushResponse(relay_peer_count=-1)),
        rpc.FilterSubscribeRequest("\udc80"),
    ],
    ids=_case_id,
)
def test_values_that_cannot_be_encoded_are_our_callers_error(value: Any) -> None:
    with pytest.raises(LocalProtocolError, match="cannot encode"):
        value.to_bytes()


# --- framing --------------------------------------------------------------------------


class Stream:
    """A byte stream handing out at most ``chunk`` bytes per read; records every request."""

    def __init__(self, data: bytes, chunk: int = 1 << 30) -> None:
        self.data = data
        self.chunk = chunk
        self.pos = 0
        self.requests: list[int] = []

    async def read(self, n: int) -> bytes:
        self.requests.append(n)
        out = self.data[self.pos : self.pos + min(n, self.chunk)]
        self.pos += len(out)
        return out


def run(coroutine: Coroutine[Any, Any, bytes | None]) -> bytes | None:
    """Run ``read_frame`` without an event loop: it awaits nothing but ``read``."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: bytes | None = done.value
        return result
    raise AssertionError("read_frame suspended on something other than read")


@pytest.mark.parametrize(
    ("length", "prefix"),
    [(0, "00"), (1, "01"), (127, "7f"), (128, "8001"), (300, "ac02"), (16384, "808001")],
)
def test_length_prefix_is_a_uvarint(length: int, prefix: str) -> None:
    frame = encode_frame(bytes(length))
    assert frame[: len(prefix) // 2].hex() == prefix
    assert len(frame) == length + len(prefix) // 2


def test_an_empty_frame_is_an_empty_body() -> None:
    assert run(read_frame(Stream(b"\x00").read)) == b""


def test_a_stream_closed_before_a_frame_has_none() -> None:
    assert run(read_frame(Stream(b"").read)) is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"\x05abc", R.TRUNCATED_FRAME, id="body cut short"),
        pytest.param(b"\x80", R.TRUNCATED_FRAME, id="length prefix cut short"),
        pytest.param(b"\x80" * 10 + b"\x00", R.MALFORMED_RPC, id="11-byte length prefix"),
        pytest.param(b"\xff" * 11, R.OVERSIZED, id="huge length prefix"),
    ],
)
def test_bad_frames_are_remote_errors(data: bytes, reason: RejectReason) -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        run(read_frame(Stream(data).read, max_length=1 << 40))
    assert caught.value.reason is reason


def test_a_length_above_the_max_is_refused_before_the_body() -> None:
    stream = Stream(encode_frame(bytes(1001)), chunk=1)
    with pytest.raises(RemoteProtocolError, match="exceeds 1000") as caught:
        run(read_frame(stream.read, max_length=1000))
    assert caught.value.reason is R.OVERSIZED
    assert stream.requests == [1, 1] and stream.pos == 2  # the two bytes of the prefix


def test_a_huge_length_is_refused_as_soon_as_its_prefix_shows_it() -> None:
    stream = Stream(b"\xff" * 9 + b"\x01")  # 2**64 - 1
    with pytest.raises(RemoteProtocolError):
        run(read_frame(stream.read, max_length=1 << 20))
    assert stream.pos == 3  # 21 bits of length already exceed 2**20


def test_a_length_at_the_max_is_read() -> None:
    assert run(read_frame(Stream(encode_frame(bytes(1000))).read, max_length=1000)) == bytes(1000)


# --- autosharding ---------------------------------------------------------------------


def test_reference_vector() -> None:
    """REFERENCE §7: ``/sds/1/probe/proto`` on cluster 1 is ``/waku/2/rs/1/7``."""
    topic = parse_content_topic("/sds/1/probe/proto")
    assert topic == ContentTopic("sds", "1", "probe", "proto")
    assert topic.pubsub_topic(TWN_CLUSTER_ID, TWN_SHARD_COUNT) == "/waku/2/rs/1/7"


@pytest.mark.parametrize(
    "topic", ["/sds/1/probe/proto", "/sds/1/chat/proto", "/toychat/2/huilong/proto", "/ü/1/ñ/rlp"]
)
def test_shard_is_the_last_8_bytes_of_sha256_of_application_and_version(topic: str) -> None:
    _, application, version, *_ = topic.split("/")
    digest = hashlib.sha256(f"{application}{version}".encode()).digest()
    for shard_count in (1, 8, 1024):
        expected = int(digest[24:].hex(), 16) % shard_count
        assert parse_content_topic(topic).shard(shard_count) == expected


def test_the_name_and_encoding_do_not_move_a_topic() -> None:
    shards = {parse_content_topic(f"/sds/1/{n}/{e}").shard(8) for n in "ab" for e in "cd"}
    assert shards == {7}


def test_generation_zero_is_the_same_topic() -> None:
    assert parse_content_topic("/0/sds/1/probe/proto") == parse_content_topic("/sds/1/probe/proto")


BAD_TOPICS = [
    "",
    "/",
    "sds/1/probe/proto",
    "/sds/1/probe",
    "/sds/1/probe/proto/extra/more",
    "/sds//probe/proto",
    "//1/probe/proto",
    "/sds/1/probe/",
    "/1/sds/1/probe/proto",
]


@pytest.mark.parametrize("topic", BAD_TOPICS)
def test_a_bad_topic_is_the_fault_of_whoever_gave_it(topic: str) -> None:
    with pytest.raises(LocalProtocolError):
        parse_content_topic(topic)
    with pytest.raises(RemoteProtocolError) as caught:
        parse_content_topic(topic, remote=True)
    assert caught.value.reason is R.MALFORMED_CONTENT_TOPIC


def test_pubsub_topic_of_a_shard() -> None:
    assert shard_pubsub_topic(1, 0) == "/waku/2/rs/1/0"
    with pytest.raises(LocalProtocolError):
        shard_pubsub_topic(1, -1)
    with pytest.raises(LocalProtocolError):
        parse_content_topic("/a/1/b/c").shard(0)


# --- against @waku/proto and @waku/utils ---------------------------------------------


@pytest.fixture(scope="module")
def js() -> Iterator[ProcessPeer]:
    if shutil.which("node") is None:
        pytest.fail("Node.js is required for interop tests (make test installs the JS driver)")
    peer = ProcessPeer("js:waku-protocols", ["node", str(JS_SCRIPT)])
    yield peer
    peer.close()


_BIGINT_FIELDS = {"time_start", "time_end", "pagination_limit", "timestamp"}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def to_js(value: Any, name: str = "") -> Any:
    """``value`` as @waku/proto's fields in the driver's JSON, as its decoder returns them."""
    if isinstance(value, WakuMessage):  # the optional fields WakuMessage.to_bytes writes
        fields = {
            "payload": value.payload,
            "content_topic": value.content_topic,
            "version": value.version or None,
            "timestamp": value.timestamp,
            "meta": value.meta or None,
            "ephemeral": value.ephemeral or None,
        }
        return {_camel(k): to_js(v, k) for k, v in fields.items() if v is not None}
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {_camel(k): to_js(v, k) for k, v in fields.items() if v is not None}
    if isinstance(value, rpc.FilterSubscribeType):
        return value.name
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, tuple):
        return [to_js(item, name) for item in value]
    if name in _BIGINT_FIELDS:
        return {"bigint": str(value)}
    return value


def _js_types(value: Any) -> list[str]:
    name = type(value).__name__
    return [f"{name}Request", f"{name}Response"] if name == "WakuMetadata" else [name]


def _byte_identical(value: Any) -> bool:
    """Whether @waku/proto writes ``value``'s very bytes: all but metadata with shards,
    which we also write packed in field 3, a field @waku/proto does not know."""
    return not (isinstance(value, rpc.WakuMetadata) and value.shards)


@pytest.mark.interop
@pytest.mark.parametrize("value", CASES, ids=_case_id)
def test_identical_bytes_both_ways(js: ProcessPeer, value: Any) -> None:
    ours = value.to_bytes()
    for js_type in _js_types(value):
        theirs = bytes.fromhex(js.ok("encode", type=js_type, fields=to_js(value))["bytes"])
        if _byte_identical(value):
            assert ours == theirs
        assert js.ok("decode", type=js_type, bytes=ours.hex())["fields"] == to_js(value)
        assert type(value).from_bytes(theirs) == value


@pytest.mark.interop
def test_metadata_with_shards_is_read_both_ways_though_bytes_differ(js: ProcessPeer) -> None:
    """@waku/proto writes the shards in field 2 only; we add field 3. Each reads the other's
    cluster and shards."""
    value = rpc.WakuMetadata(cluster_id=1, shards=(0, 7, 300))
    ours = value.to_bytes()
    for js_type in _js_types(value):
        theirs = bytes.fromhex(js.ok("encode", type=js_type, fields=to_js(value))["bytes"])
        assert theirs.hex() == "0801" + "1000" + "1007" + "10ac02"  # field 2, one tag each
        assert ours == theirs + bytes.fromhex("1a04" + "0007ac02")
        assert js.ok("decode", type=js_type, bytes=ours.hex())["fields"] == {
            "clusterId": 1,
            "shards": [0, 7, 300],
        }
        assert rpc.WakuMetadata.from_bytes(theirs) == value


def _protons_miswrites(fields: Any) -> bool:
    """Whether ``fields`` hold a number that protons-runtime 5.6 (under @waku/proto) writes
    wrongly: a sint64 of at most -2**53 whose low 32 bits are zero (its two's complement of
    a bigint drops the carry out of the low word), or a uint64 pagination limit in
    [2**31, 2**32) (its varint writer takes them for negative 32-bit numbers: 2**31 comes
    out as five zero bytes)."""
    if isinstance(fields, dict):
        if "bigint" in fields:
            value = int(fields["bigint"])
            return value <= -(1 << 53) and value % (1 << 32) == 0
        limit = fields.get("paginationLimit")
        if isinstance(limit, dict) and (1 << 31) <= int(limit["bigint"]) < (1 << 32):
            return True
        return any(map(_protons_miswrites, fields.values()))
    return isinstance(fields, list) and any(map(_protons_miswrites, fields))


@pytest.mark.interop
@given(values)
def test_js_reads_what_we_write(js: ProcessPeer, value: Any) -> None:
    ours = value.to_bytes()
    fields = to_js(value)
    for js_type in _js_types(value):
        assert js.ok("decode", type=js_type, bytes=ours.hex())["fields"] == fields
        if _protons_miswrites(fields):
            continue
        theirs = js.ok("encode", type=js_type, fields=fields)["bytes"]
        if _byte_identical(value):
            assert theirs == ours.hex()
        else:
            assert type(value).from_bytes(bytes.fromhex(theirs)) == value


@pytest.mark.interop
def test_protons_miswrites_some_negative_int64s_but_reads_them(js: ProcessPeer) -> None:
    """The one known difference, for the values ``_protons_miswrites`` names: we write the
    zigzag varint protobuf defines, protons one that reads back as another number; both
    read ours right."""
    value = rpc.StoreQueryRequest("", time_start=-(1 << 63))
    ours = value.to_bytes().hex()
    assert ours == "60" + "ff" * 9 + "01"
    fields = to_js(value)
    assert js.ok("encode", type="StoreQueryRequest", fields=fields)["bytes"] != ours
    assert js.ok("decode", type="StoreQueryRequest", bytes=ours)["fields"] == fields


@pytest.mark.interop
def test_protons_miswrites_pagination_limits_from_2_31_to_2_32_but_reads_ours(
    js: ProcessPeer,
) -> None:
    """The other difference ``_protons_miswrites`` names (hypothesis found it): we write
    the uint64 varint, protons five zero bytes; it reads ours right."""
    for limit in (1 << 31, (1 << 32) - 1):
        value = rpc.StoreQueryRequest("", pagination_limit=limit)
        ours = value.to_bytes().hex()
        fields = to_js(value)
        assert _protons_miswrites(fields)
        assert js.ok("encode", type="StoreQueryRequest", fields=fields)["bytes"] != ours
        assert js.ok("decode", type="StoreQueryRequest", bytes=ours)["fields"] == fields
    for limit in ((1 << 31) - 1, 1 << 32):  # either side of the range: identical
        value = rpc.StoreQueryRequest("", pagination_limit=limit)
        fields = to_js(value)
        assert not _protons_miswrites(fields)
        assert js.ok("encode", type="StoreQueryRequest", fields=fields)["bytes"] == (
            value.to_bytes().hex()
        )


# Lone surrogates (category Cs) have no UTF-8 form: such a topic is refused (below).
names = st.text(
    st.characters(exclude_characters="/", exclude_categories=("Cs",)), min_size=1, max_size=12
)


def test_a_content_topic_without_a_utf8_form_is_refused() -> None:
    with pytest.raises(LocalProtocolError):
        parse_content_topic("/0/\ud800/0/0")


@pytest.mark.interop
@given(st.lists(st.tuples(names, names, names, names), min_size=1, max_size=20))
def test_autosharding_agrees_with_waku_utils(js: ProcessPeer, parts: list[Any]) -> None:
    topics = ["/" + "/".join(p) for p in parts] + ["/sds/1/probe/proto", "/0/sds/1/x/proto"]
    for cluster_id, shard_count in ((TWN_CLUSTER_ID, TWN_SHARD_COUNT), (16, 1), (3, 1000)):
        theirs = js.ok(
            "autoshard", contentTopics=topics, clusterId=cluster_id, shardCount=shard_count
        )["pubsubTopics"]
        ours = [parse_content_topic(t).pubsub_topic(cluster_id, shard_count) for t in topics]
        assert ours == theirs
