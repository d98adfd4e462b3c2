"""Frames on py-libp2p streams: open, read, write and reset, as every stream of a host does.

Theory of operation
-------------------
These run on a host's trio thread (:mod:`sdsync.transport.libp2p_host` for
request/response and conversation streams, :mod:`sdsync.transport.push_lanes` for
pushes). A frame is a uvarint-length-prefixed body (:func:`~sdsync.waku.rpc.read_frame`,
:func:`~sdsync.waku.rpc.encode_frame`). An exchange that goes wrong midway is reset, not
closed: a half-written frame would corrupt whatever followed it on the stream, and a
half-done exchange must not linger on the peer. A peer's multistream "na" to a protocol
is a :class:`~sdsync.errors.ProtocolNotSupportedError`, not a broken connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.host.exceptions import StreamFailure
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID
from libp2p.protocol_muxer.exceptions import MultiselectClientError

from sdsync.errors import ProtocolNotSupportedError
from sdsync.waku.rpc import encode_frame, frame_prefix

_RESET_S = 2.0
#: Frames up to this size are written as one copy with their prefix (one yamux frame).
_COPY_FRAME_BYTES = 64 * 1024


async def open_stream(host: IHost, peer: ID, protocol: str) -> INetStream:
    """A new ``protocol`` stream to ``peer`` (connected already)."""
    try:
        return await host.new_stream(peer, [TProtocol(protocol)])
    except StreamFailure as exc:
        if _refused(exc):
            raise ProtocolNotSupportedError(peer.to_base58(), protocol) from exc
        raise


def _refused(exc: StreamFailure) -> bool:
    """Did the peer refuse the protocol (multistream-select "na")? py-libp2p 0.8.1 says
    so only in the message of the MultiselectClientError behind its StreamFailure."""
    cause = exc.__cause__
    return isinstance(cause, MultiselectClientError) and str(cause).startswith(
        "protocols not supported"
    )


async def write_frame(stream: INetStream, body: bytes) -> None:
    """``body`` as one frame.  A large one goes behind its prefix rather than copied into
    one with it: an answer held by a peer that does not read would be held twice."""
    if len(body) < _COPY_FRAME_BYTES:
        await stream.write(encode_frame(body))
        return
    await stream.write(frame_prefix(len(body)))
    await stream.write(body)


def frame_reader(stream: INetStream) -> Callable[[int], Awaitable[bytes]]:
    """``stream.read`` as :func:`~sdsync.waku.rpc.read_frame` wants it: ``b""`` at the
    end of the stream."""

    async def read(n: int) -> bytes:
        try:
            return await stream.read(n)
        except StreamEOF:
            return b""

    return read


async def reset(stream: INetStream) -> None:
    """Reset ``stream``, even from a cancelled task, within ``_RESET_S``."""
    with (
        trio.CancelScope(shield=True, deadline=trio.current_time() + _RESET_S),
        contextlib.suppress(Exception),
    ):
        await stream.reset()
