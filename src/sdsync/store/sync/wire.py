"""What Store Sync puts on the wire: routes, headers, and message batches.

Theory of operation
-------------------
Store Sync runs over the store node's HTTP server, under ``/sync/v1/``; a session opens
at ``/sync/v1/{method}`` for every method of :data:`sdsync.reconcile.METHODS` (a method
the node lacks answers 404), and every node speaks :data:`BASE_METHOD`. Reconciliation
frames travel as they are (``application/octet-stream``); the session they belong to is
named in a header. A method that streams (``streaming``, RIBLT) sends a whole turn in one
body instead, ``application/vnd.sdsync.frames``: each frame as
``varint(len(frame)) frame``. The responder's symbols arrive that way as one streamed HTTP
response, which the initiator stops reading (and closes) once it has decoded. Messages
travel in *batches*: a concatenation of entries ::

    entry = varint(len(pubsub_topic)) pubsub_topic varint(len(message)) message

where ``message`` is the WakuMessage protobuf. The hash is not sent: the receiver
recomputes it from the content (:meth:`StoredMessage.of`), and a receiver only accepts
messages whose recomputed hash it expected — what its reconciliation found the sender
holds and it lacks. So a sync peer cannot write anything else into the archive.

A batch is at most :data:`MAX_BATCH_BYTES` unless a single entry is larger (a
WakuMessage is at most ~154 KiB, so that never happens between well-behaved nodes).
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from sdsync.errors import RemoteProtocolError
from sdsync.reconcile import Method, RbsrSession, varint
from sdsync.reconcile.codec import Reader
from sdsync.waku.messages import StoredMessage
from sdsync.wire.waku import MAX_WAKU_MESSAGE_BYTES, decode_waku_message

PREFIX = "/sync/"
"""Where a store node mounts Store Sync."""
VERSION = "v1"
BASE_METHOD: Method = RbsrSession.name
"""The method every Store Sync node speaks: a peer that lacks ours, or a RIBLT round that
does not decode, is synced by it."""
SESSION_HEADER = "Sdsync-Session"
NEXT_HEADER = "Sdsync-Next"
FRAME_TYPE = "application/octet-stream"
FRAMES_TYPE = "application/vnd.sdsync.frames"
MAX_FRAMES_BODY = 16 << 20
"""Bytes of a frame-stream request at most (a turn that is longer takes several)."""
BATCH_TYPE = "application/vnd.sdsync.messages"
MAX_BATCH_BYTES = 1 << 20
MAX_TOPIC_BYTES = 1024


def open_path(method: Method) -> str:
    """Path (under the node's base URL) that opens a session with its first frame."""
    return f"{PREFIX}{VERSION}/{method}"


def session_path(session_id: str) -> str:
    """Path of an open session: POST a frame, DELETE to close it."""
    return f"{PREFIX}{VERSION}/sessions/{session_id}"


def messages_path(session_id: str) -> str:
    """Path of a session's transfer: POST pushes a batch, GET pulls one."""
    return f"{session_path(session_id)}/messages"


def encode_frames(frames: Iterable[bytes]) -> bytes:
    """A frame stream: each frame prefixed by its length."""
    return b"".join(varint(len(frame)) + frame for frame in frames)


def decode_frames(body: bytes, max_frame_size: int) -> list[bytes]:
    """The frames of a frame stream; RemoteProtocolError if it is malformed."""
    reader = Reader(body)
    frames: list[bytes] = []
    while not reader.at_end:
        frames.append(reader.take(reader.varint(max_frame_size + 1)))
    return frames


def encode_entry(message: StoredMessage) -> bytes:
    topic = message.pubsub_topic.encode()
    body = message.message.to_bytes()
    return b"".join((varint(len(topic)), topic, varint(len(body)), body))


def decode_batch(body: bytes, expected: Container[bytes]) -> list[StoredMessage]:
    """The messages of a batch; RemoteProtocolError if any is malformed or unexpected."""
    reader = Reader(body)
    messages: list[StoredMessage] = []
    while not reader.at_end:
        try:
            topic = reader.take(reader.varint(MAX_TOPIC_BYTES + 1)).decode()
        except UnicodeDecodeError:
            raise RemoteProtocolError("a pubsub topic is not UTF-8") from None
        waku = decode_waku_message(reader.take(reader.varint(MAX_WAKU_MESSAGE_BYTES + 1)))
        message = StoredMessage.of(topic, waku)
        if message.message_hash not in expected:
            raise RemoteProtocolError(
                f"message {message.message_hash.hex()} was not found missing by this session"
            )
        messages.append(message)
    return messages
