"""Push lanes: a host's unanswered frames to a peer, on one long-lived stream per protocol.

Theory of operation
-------------------
Everything here runs on the host's trio thread (:class:`PushLanes` is a part of its
:class:`~sdsync.transport.libp2p_host.TrioHost`, which hands it each push).

A Filter service pushes every message to every subscriber unanswered. A stream per push
fails against js-waku, which never closes its side of a push stream and refuses a peer's
101st inbound stream of a protocol (and then drops the whole connection). So all pushes
to one (peer, protocol) are written, one at a time, on one long-lived stream, the *lane*.
A watcher task reads the lane (nothing ever comes back) to notice at once when the
remote closes or resets it; the next push then opens a fresh stream. A push whose write
fails on a stream it did not open is written once more on a fresh stream
(``push_retries``) before it fails; a deadline mid-write resets the stream, since half a
frame would corrupt the rest of the lane.

go-waku 0.9.0's Filter client reads exactly one MessagePush per stream and closes it;
frames written after that are dropped unread by its muxer, without a reset. That must be
learnt per (peer, protocol) without losing a push while learning. The race: we cannot
tell "reads one frame and closes" from "keeps the stream" until the close arrives, and
anything written before it arrives is lost. Decision: the first frame on a lane whose
reader is unknown is a *probe*: the push waits (under the lane's lock, so nothing else is
written on the stream meanwhile) up to ``_PROBE_S`` for the remote to close it. Closed
(or answered: a request/response protocol) → a one-frame reader: that frame was read, and
from then on every push goes on a stream of its own, closed by us. Still open → the lane
is kept and reused. A one-frame reader slower to close than the probe (a long round
trip) is still caught: the lane remembers the frames after the first that it carried
while younger than ``_RECALL_S``, and if the remote closes it that young, the peer is
relearnt as a one-frame reader and those frames are pushed again on streams of their own
(``pushes_resent``). A reader that really read them all and then closed soon after gets
them twice (at least once over lost; a Waku message's hash identifies a duplicate). The
probe costs a lane reader one wait of ``_PROBE_S`` per peer, once.

The receiving end (a served push protocol, whose streams may carry any number of
frames) is the host's :meth:`~sdsync.transport.libp2p_host.TrioHost.serve_pushes`.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from libp2p.abc import IHost, INetStream
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.network.stream.net_stream import NetStream
from libp2p.peer.id import ID
from libp2p.stream_muxer.mplex.mplex_stream import MplexStream

from sdsync.errors import ProtocolNotSupportedError
from sdsync.transport.libp2p_shared import HostCounters
from sdsync.transport.libp2p_streams import open_stream, reset
from sdsync.waku.rpc import encode_frame

logger = logging.getLogger("sdsync.transport.libp2p")

#: How long a push lane's first frame waits for the reader to close the stream (a
#: one-frame reader, go-waku's Filter client) before the lane is taken as reusable.
_PROBE_S = 0.5
#: A lane stream the remote closes this young, after more than one frame, was a
#: one-frame reader's: the frames after the first are pushed again (at most this many).
_RECALL_S = 10.0
_RECALL_FRAMES = 256
_RESEND_TIMEOUT_S = 10.0
_LANES_BEFORE_PRUNING = 512


class _Reader(enum.Enum):
    """What we know of how a peer reads a push protocol's streams."""

    UNKNOWN = "unknown"
    KEEPS_STREAMS = "keeps streams"  # every frame, until we close (js-waku, sdsync)
    ONE_FRAME = "one frame"  # one frame, then closes the stream (go-waku's Filter client)


_CLOSED = "closed"
_RESET = "reset"
_ANSWERED = "answered"


@dataclass(eq=False)
class _LaneStream:
    """One outbound push stream; ``ended`` once the remote closed or reset it (``how``)."""

    stream: INetStream
    opened_at: float
    ended: trio.Event = field(default_factory=trio.Event)
    how: str = ""
    frames: int = 0
    recall: list[bytes] = field(default_factory=list)  # frames after the first, while young


@dataclass(eq=False)
class _PushLane:
    """The pushes to one (peer, protocol): written one at a time on ``current``."""

    lock: trio.Lock = field(default_factory=trio.Lock)
    reader: _Reader = _Reader.UNKNOWN
    current: _LaneStream | None = None


class PushLanes:
    """A host's push lanes, one per (peer, protocol) pushed to. ``start_soon(task,
    *args)`` runs a lane's watcher in the host's nursery; ``counters`` count the streams
    opened, the retries and the resent pushes."""

    def __init__(
        self, host: IHost, counters: HostCounters, start_soon: Callable[..., object]
    ) -> None:
        self._host = host
        self._counters = counters
        self._start_soon = start_soon
        self._lanes: dict[tuple[ID, str], _PushLane] = {}
        # Set when the host hangs up: its peers then end every lane, young or not, and
        # none of them is a one-frame reader for that.
        self.hanging_up = False

    async def push(self, peer: ID, protocol: str, payload: bytes, timeout_s: float) -> None:
        """Write ``payload`` as one frame on the push lane to ``(peer, protocol)``."""
        frame = encode_frame(payload)
        lane = self._lane(peer, protocol)
        with trio.fail_after(timeout_s):
            async with lane.lock:
                if lane.reader is _Reader.ONE_FRAME:
                    await self._push_alone(peer, protocol, frame)
                    return
                reused = lane.current is not None and not lane.current.ended.is_set()
                try:
                    await self._write_lane(lane, peer, protocol, frame)
                except ProtocolNotSupportedError:
                    raise
                except Exception as exc:
                    if not reused:
                        raise
                    self._counters.push_retries[protocol] += 1
                    logger.debug("push to %s on a fresh stream after %r", peer, exc)
                    await self._write_lane(lane, peer, protocol, frame)

    def _lane(self, peer: ID, protocol: str) -> _PushLane:
        lane = self._lanes.get((peer, protocol))
        if lane is None:
            if len(self._lanes) >= _LANES_BEFORE_PRUNING:
                self._forget_lanes_of_gone_peers()
            lane = self._lanes[(peer, protocol)] = _PushLane()
        return lane

    def _forget_lanes_of_gone_peers(self) -> None:
        network = self._host.get_network()
        for key, lane in list(self._lanes.items()):
            if not lane.lock.locked() and not network.get_connections(key[0]):
                del self._lanes[key]

    async def _write_lane(self, lane: _PushLane, peer: ID, protocol: str, frame: bytes) -> None:
        """Write ``frame`` on the lane's stream (opened first if it has none, or the remote
        ended it); the first frame of a lane whose reader we do not know yet is a probe."""
        current = lane.current
        if current is None or current.ended.is_set():
            current = lane.current = await self._open_lane(lane, peer, protocol)
        try:
            await current.stream.write(frame)
        except BaseException:
            if lane.current is current:
                lane.current = None
            await reset(current.stream)
            raise
        current.frames += 1
        if trio.current_time() - current.opened_at >= _RECALL_S:
            current.recall.clear()  # too old to be a one-frame reader's: nothing to resend
        elif current.frames > 1 and len(current.recall) < _RECALL_FRAMES:
            current.recall.append(frame)
        if lane.reader is _Reader.UNKNOWN:
            await self._probe(lane, current, peer, protocol)

    async def _probe(self, lane: _PushLane, current: _LaneStream, peer: ID, protocol: str) -> None:
        """Learn whether ``peer`` reads one frame per stream: it closes the stream right
        after our first frame, or (a lane reader) keeps it open past ``_PROBE_S``."""
        with trio.move_on_after(_PROBE_S):
            await current.ended.wait()
        if not current.ended.is_set():
            lane.reader = _Reader.KEEPS_STREAMS
            return
        if current.how == _RESET:
            raise ConnectionError(f"{peer} reset our {protocol} stream")
        # Closed, or answered (a request/response protocol): one frame per stream.
        lane.reader = _Reader.ONE_FRAME
        logger.info("%s takes one %s frame per stream: one stream per push", peer, protocol)

    async def _open_lane(self, lane: _PushLane, peer: ID, protocol: str) -> _LaneStream:
        current = _LaneStream(await open_stream(self._host, peer, protocol), trio.current_time())
        self._counters.push_streams[protocol] += 1
        self._start_soon(self._watch, lane, current, peer, protocol)
        return current

    async def _watch(self, lane: _PushLane, current: _LaneStream, peer: ID, protocol: str) -> None:
        """Notice the remote ending a lane stream; nothing ever comes back on it."""
        current.how = await _remote_end(current.stream)
        current.ended.set()
        if current.how == _RESET:
            return
        with contextlib.suppress(Exception):
            await current.stream.close()
        young = trio.current_time() - current.opened_at < _RECALL_S
        if current.recall and young and not self.hanging_up:
            # A one-frame reader slower to close than the probe: it read the first frame
            # only, and dropped the rest unread (see the theory of operation).
            lane.reader = _Reader.ONE_FRAME
            await self._resend(lane, peer, protocol, current.recall)

    async def _resend(self, lane: _PushLane, peer: ID, protocol: str, frames: list[bytes]) -> None:
        logger.info("%s closed a push stream after one frame: pushing %d again", peer, len(frames))
        async with lane.lock:
            for frame in frames:
                try:
                    with trio.fail_after(_RESEND_TIMEOUT_S):
                        await self._push_alone(peer, protocol, frame)
                except (Exception, trio.TooSlowError) as exc:
                    logger.warning("pushing again to %s failed: %r", peer, exc)
                    return
                self._counters.pushes_resent[protocol] += 1

    async def _push_alone(self, peer: ID, protocol: str, frame: bytes) -> None:
        """``frame`` on a stream of its own, closed by us (for a one-frame reader)."""
        stream = await open_stream(self._host, peer, protocol)
        self._counters.push_streams[protocol] += 1
        try:
            await stream.write(frame)
        except BaseException:
            await reset(stream)
            raise
        with contextlib.suppress(Exception):
            await stream.close()


async def _remote_end(stream: INetStream) -> str:
    """Wait until the remote ends ``stream`` (an outbound stream we only write on); how.

    A read that waits would do, but py-libp2p's mplex stream (js-libp2p's muxer with us)
    holds its read-write lock through it, and every write would wait behind it; its
    close and reset events are waited on instead."""
    muxed = stream.muxed_stream if isinstance(stream, NetStream) else None
    if not isinstance(muxed, MplexStream):
        try:
            return _ANSWERED if await stream.read(1) else _CLOSED
        except StreamEOF:
            return _CLOSED
        except Exception:
            return _RESET
    how: list[str] = []
    async with trio.open_nursery() as nursery:

        async def first(event: trio.Event, name: str) -> None:
            await event.wait()
            how.append(name)
            nursery.cancel_scope.cancel()

        nursery.start_soon(first, muxed.event_remote_closed, _CLOSED)
        nursery.start_soon(first, muxed.event_reset, _RESET)
    return _RESET if muxed.event_reset.is_set() else how[0]
