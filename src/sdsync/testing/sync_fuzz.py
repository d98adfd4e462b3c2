"""Hostile-input harness for Store Sync message batches (tests and ``bench/fuzz_decoders.py``).

:func:`~sdsync.store.sync.wire.decode_batch` parses what a sync peer pushes or serves. A
corpus of real batches is mutated (with :func:`sdsync.testing.reconcile_fuzz.mutate`, method
``"batch"``) or written from scratch entry by entry, and :func:`check_batch` compares what
the decoder accepts with :func:`reference_batch`, a reader written from the batch format
alone: the same messages, or a :class:`~sdsync.errors.RemoteProtocolError` and nothing.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from sdsync.errors import RemoteProtocolError
from sdsync.store.sync.wire import MAX_TOPIC_BYTES, decode_batch, encode_entry
from sdsync.testing.reconcile_fuzz import HUGE, Outcome, encode_varint
from sdsync.waku.messages import StoredMessage
from sdsync.wire import waku_message_pb2 as wpb
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES, WakuMessage

BATCH_NOW_NS = 1_700_000_000 * 10**9
"""Timestamps of the corpus messages: in the past, as archived messages are."""


@dataclass(frozen=True, slots=True)
class BatchCorpus:
    entries: tuple[bytes, ...]
    """Valid batch entries, one message each."""
    expected: frozenset[bytes]
    """Their hashes: what a session found missing."""
    batches: tuple[bytes, ...]
    """Real batches of one to six entries."""
    messages: tuple[bytes, ...]
    """WakuMessage encodings, valid ones and ones no archive takes (no timestamp,
    ephemeral, no content topic)."""


def batch_corpus(seed: int = 0) -> BatchCorpus:

    rng = random.Random(seed)
    topics = ["/waku/2/rs/1/0", "/waku/2/default-waku/proto", "é\u4e2d\U0001f600", "t"]
    stored = [
        StoredMessage.of(
            rng.choice(topics),
            WakuMessage(
                payload=rng.randbytes(rng.choice([0, 1, 30, 300])),
                content_topic=rng.choice(["/app/1/chat/proto", "c", "/x/1/é/proto"]),
                timestamp=BATCH_NOW_NS - rng.randrange(10**13),
                meta=rng.choice([b"", rng.randbytes(8)]),
                version=rng.choice([0, 1]),
            ),
        )
        for _ in range(40)
    ]
    entries = tuple(encode_entry(m) for m in stored)
    batches = tuple(b"".join(rng.sample(entries, rng.randint(1, 6))) for _ in range(60))
    odd = [
        WakuMessage(payload=b"x", content_topic="c").to_bytes(),  # no timestamp
        WakuMessage(payload=b"x", content_topic="c", timestamp=1, ephemeral=True).to_bytes(),
        b"\x0a\x01x\x50\x02",  # payload and a timestamp, no content topic
    ]
    messages = tuple(m.message.to_bytes() for m in stored) + tuple(odd)
    return BatchCorpus(entries, frozenset(m.message_hash for m in stored), batches, messages)


def random_batch(rng: random.Random, corpus: BatchCorpus) -> bytes:
    """A batch written entry by entry: odd topics, odd messages, wrong lengths."""
    out = bytearray()
    for _ in range(rng.choice([0, 1, 1, 2, 3, rng.randrange(12)])):
        topic = rng.choice(
            [
                b"/waku/2/rs/1/0",
                b"",
                rng.randbytes(rng.randrange(8)),
                b"\xed\xa0\x80",  # a UTF-8 surrogate
                b"\xc0\x80",  # overlong NUL
                "é".encode() * 512,  # 1,024 bytes
                b"t" * 1025,
            ]
        )
        message = rng.choice(
            [
                rng.choice(corpus.messages),
                rng.randbytes(rng.randrange(40)),
                b"\x12\x01c\x50" + encode_varint(rng.choice(HUGE)),  # timestamp varints
                b"\x12\x03\xed\xa0\x80\x50\x02",  # a surrogate content topic
                b"\x0b" * rng.randrange(1, 64),  # groups
            ]
        )
        for part in (topic, message):
            roll = rng.random()
            if roll < 0.8:
                length = len(part)
            elif roll < 0.9:
                length = max(0, len(part) + rng.choice([-1, 1, 2]))
            else:
                length = rng.choice(HUGE)
            out += encode_varint(length) + part
    if out and rng.random() < 0.1:
        del out[rng.randrange(len(out)) :]
    return bytes(out)


def _ref_varint(data: bytes, pos: int, limit: int) -> tuple[int, int] | None:
    value = 0
    for _ in range(10):
        if pos >= len(data):
            return None
        byte = data[pos]
        pos += 1
        value = value << 7 | byte & 0x7F
        if not byte & 0x80:
            return (value, pos) if value < limit else None
    return None


def reference_batch(body: bytes, expected: frozenset[bytes]) -> list[tuple[str, bytes]] | None:
    """The (pubsub topic, hash) of each message a batch holds, or None if a receiver must
    refuse it, written from the batch format alone (``sdsync.store.sync.wire``)."""

    out: list[tuple[str, bytes]] = []
    pos = 0
    while pos < len(body):
        read = _ref_varint(body, pos, MAX_TOPIC_BYTES + 1)
        if read is None or read[1] + read[0] > len(body):
            return None
        topic_bytes, pos = body[read[1] : read[1] + read[0]], read[1] + read[0]
        read = _ref_varint(body, pos, MAX_WAKU_MESSAGE_BYTES + 1)
        if read is None or read[1] + read[0] > len(body):
            return None
        raw, pos = body[read[1] : read[1] + read[0]], read[1] + read[0]
        try:
            topic = topic_bytes.decode("utf-8")
            message = wpb.WakuMessage.FromString(raw)
        except (UnicodeDecodeError, DecodeError):
            return None
        if not message.content_topic or not message.HasField("timestamp") or message.ephemeral:
            return None
        digest = hashlib.sha256(
            topic_bytes
            + message.payload
            + message.content_topic.encode()
            + message.meta
            + (message.timestamp % (1 << 64)).to_bytes(8, "big")
        ).digest()
        if digest not in expected:
            return None
        out.append((topic, digest))
    return out


def check_batch(body: bytes, expected: frozenset[bytes], *, valid: bool = False) -> Outcome:
    """``decode_batch`` on untrusted bytes: only RemoteProtocolError escapes, and what it
    accepts is what :func:`reference_batch` finds (``valid``: the batch is a real one,
    which must be accepted)."""

    out = Outcome(steps=1)
    try:
        got = [(m.pubsub_topic, m.message_hash) for m in decode_batch(body, expected)]
    except RemoteProtocolError:
        if valid:
            out.failures.append("a real batch was refused")
        return out
    except Exception as exc:  # the property: nothing else may escape
        out.failures.append(f"decode_batch raised {type(exc).__name__}: {exc}")
        return out
    out.accepted = True
    ref = reference_batch(body, expected)
    if ref != got:
        out.failures.append(f"decode_batch accepted {got!r}; the batch format says {ref!r}")
    return out
