"""Prolly-tree sync (75/WAKU2-SYNC): walk two content-defined trees down to what differs.

Theory of operation
-------------------
**The tree.** Every item ``(timestamp, hash)`` has a *coin*, the last eight bytes of its
hash read as a big-endian ``u64`` (uniform: the hash is a sha256 output). An item is a
*boundary* at level ``L >= 1`` when ``coin < 2**64 / fanout**L``, so each level keeps about
``1/fanout`` of the level below and boundaries at ``L + 1`` are boundaries at ``L``. Within a
sync window, a level-``L`` node starts at a level-``L`` boundary (or, for the *head* node,
the fake root of the level, at the window start) and runs to the next one; its children are
the level-``L - 1`` nodes inside it, and level 0 holds the items themselves. The *root* is
the head of the lowest level with no boundary: it spans the whole window.

The shape depends only on the item set (keys are ``(timestamp, hash)``, so equal timestamps
do not collide), never on insertion order. Inserting an item changes only the nodes that
contain it: :meth:`~sdsync.reconcile.items.MemoryItemStore.insert` is the whole update,
because a node's ``merkle_hash`` is the sum-then-hash fingerprint of its item range,
(:mod:`sdsync.reconcile.fingerprint`), which the store answers in O(1) and which, like a
Merkle hash, a peer cannot match with different content short of breaking sha256.

**The walk** (client = initiator, server = responder):

1. ``ExchangeRootRequest``: the client's root (window start in ``timestamp``, end in
   ``right``); the server answers ``ExchangeRootResponse`` with its root over the same
   window. Equal ``merkle_hash`` ends the sync.
2. ``GetNonBoundaryNodesRequest``: the client names nodes whose hashes differ; the server
   answers with their children, each list closed by a tail sentinel (``is_tail``). The
   client compares each child's hash with the fingerprint of *the same key range* in its
   own store: equal means the range holds the same items, whatever the client's own tree
   looks like there, so the diff is exact (no false-positive keys). Differing children
   are asked for next; children at level 0 are items, and the client diffs them against
   its own items in the parent's range.
3. ``SyncDone`` (our extension): the client tells the server what it learned, so both
   sides end with both directions.

A frame that would overflow ``max_frame_size`` is cut after a whole child; the client
asks again for the rest of a cut node. ``GetIntermediateNodeRequest`` (a node by
timestamp and level) is served as the specification describes.

Frames are ``version:u8 type:u8 protobuf`` with the messages of ``prolly.proto``.

**Hostile frames.** A server answers only for nodes that can exist: start nodes inside
the window, at levels up to its own root's, each key asked once. The nodes a client asks
for cover disjoint key ranges, so the server reads each node's children lazily, in
growing chunks, and only up to the next key asked in the same request: a node that would
run into it is refused. A request therefore passes over each item of the window about
twice (to find node ends, and the children's cuts), and reads items and cut points only
as far as its response has room for.
``GetIntermediateNodeRequest`` searches back from the asked position in growing chunks.
The client accepts children only inside their parent, in order and one level down, so
each answer covers disjoint ranges; a server that never lets the walk end (asks answered
with nothing, one child at a time forever) is cut off by the session's round limit.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import chain, pairwise
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError, Message

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reconcile import prolly_pb2 as pb
from sdsync.reconcile.codec import minimal_bound
from sdsync.reconcile.fingerprint import FINGERPRINT_SIZE, fingerprint_of_sum
from sdsync.reconcile.items import INFINITY_TS, MAX_TIMESTAMP, Bound, Item
from sdsync.reconcile.session import FrameOutcome, MethodSession, default_max_rounds
from sdsync.wire.waku import HASH_SIZE

if TYPE_CHECKING:
    from collections.abc import Callable

PROLLY_VERSION = 1
MAX_LEVEL = 64
_NODE_OVERHEAD = 3
"""Tag and length bytes around each embedded Node (lengths stay under 2**14)."""
_TAIL = pb.Node(is_tail=True)
_CHUNK = 256
"""Positions of the first chunk a lazy scan reads; each next chunk is four times larger."""


class MessageType(IntEnum):
    EXCHANGE_ROOT_REQUEST = 1
    EXCHANGE_ROOT_RESPONSE = 2
    GET_INTERMEDIATE_NODE_REQUEST = 3
    GET_INTERMEDIATE_NODE_RESPONSE = 4
    GET_NON_BOUNDARY_NODES_REQUEST = 5
    GET_NON_BOUNDARY_NODES_RESPONSE = 6
    SYNC_DONE = 7


MESSAGE_TYPES: dict[MessageType, type[Message]] = {
    MessageType.EXCHANGE_ROOT_REQUEST: pb.ExchangeRootRequest,
    MessageType.EXCHANGE_ROOT_RESPONSE: pb.ExchangeRootResponse,
    MessageType.GET_INTERMEDIATE_NODE_REQUEST: pb.GetIntermediateNodeRequest,
    MessageType.GET_INTERMEDIATE_NODE_RESPONSE: pb.GetIntermediateNodeResponse,
    MessageType.GET_NON_BOUNDARY_NODES_REQUEST: pb.GetNonBoundaryNodesRequest,
    MessageType.GET_NON_BOUNDARY_NODES_RESPONSE: pb.GetNonBoundaryNodesResponse,
    MessageType.SYNC_DONE: pb.SyncDone,
}


@dataclass(frozen=True, slots=True)
class ProllyParams:
    """The tree's shape; both sides must use the same fanout to share node boundaries."""

    fanout: int = 8

    def __post_init__(self) -> None:
        if not 2 <= self.fanout <= 1 << 16:
            raise LocalProtocolError(f"fanout {self.fanout} outside [2, 65536]")

    def threshold(self, level: int) -> int:
        """Items whose coin is below this are boundaries at ``level`` (>= 1)."""
        return int((1 << 64) // self.fanout**level)

    @property
    def min_frame_size(self) -> int:
        """Room for a header, one asked node and two children with a tail (with margin)."""
        return 512

    def default_max_rounds(self, max_frame_size: int) -> int:
        """The round limit of a session with these parameters (see :func:`default_max_rounds`)."""
        return default_max_rounds(self.fanout, max_frame_size)


def encode(kind: MessageType, message: Message) -> bytes:
    """A frame: version, message type, protobuf."""
    return bytes([PROLLY_VERSION, kind]) + message.SerializeToString()


def decode(frame: bytes) -> tuple[MessageType, Message]:
    """The message in a frame; :class:`RemoteProtocolError` if it is not one."""
    if len(frame) < 2:
        raise RemoteProtocolError("Prolly frame shorter than its two-byte header")
    if frame[0] != PROLLY_VERSION:
        raise RemoteProtocolError(f"Prolly version {frame[0]}, we speak {PROLLY_VERSION}")
    if frame[1] not in MessageType._value2member_map_:
        raise RemoteProtocolError(f"unknown Prolly message type {frame[1]}")
    kind = MessageType(frame[1])
    message = MESSAGE_TYPES[kind]()
    try:
        message.ParseFromString(frame[2:])
    except DecodeError as exc:
        raise RemoteProtocolError(f"malformed {kind.name}: {exc}") from exc
    return kind, message


@dataclass(frozen=True, slots=True)
class _Pending:
    """A server node whose children the client still needs: ``[start, end)`` at ``level``."""

    start: Bound
    end: Bound
    level: int


def _key(node: pb.Node) -> Bound:
    if node.timestamp < 0 or len(node.node_hash) > HASH_SIZE:
        raise RemoteProtocolError("node key out of range")
    return node.timestamp, node.node_hash


def _item(node: pb.Node) -> Item:
    if not 0 <= node.timestamp <= MAX_TIMESTAMP or len(node.data) != HASH_SIZE:
        raise RemoteProtocolError("a level-0 node carries a timestamp and a 32-byte hash")
    return node.timestamp, node.data


def _item_node(item: Item) -> pb.Node:
    return pb.Node(timestamp=item[0], data=item[1])


class ProllySession(MethodSession[ProllyParams]):
    """One side of a Prolly-tree sync (see the module docstring)."""

    Params = ProllyParams
    name = "prolly"
    # The walk's state, replaced by each commit; these values hold before the first frame.
    _asked: Sequence[_Pending] = ()
    """Client: the nodes asked for whose children are due (a reply answers a prefix)."""
    _unsent: tuple[list[Item], list[Item]] | None = None
    """Client: what ``SyncDone`` still has to tell the server."""
    _root_level = 0
    """Server: the level of our root over the window (asked nodes lie below it)."""

    # -- the tree over the store ------------------------------------------------------

    def _positions(self, start: Bound, end: Bound) -> tuple[int, int]:
        return self.store.lower_bound(start), self.store.lower_bound(end)

    def _fingerprint(self, start: Bound, end: Bound) -> bytes:
        return fingerprint_of_sum(*self.store.summary(*self._positions(start, end)))

    def _root(self, start: Bound, end: Bound) -> pb.Node:
        lo, hi = self._positions(start, end)
        level = 1
        while level < MAX_LEVEL and self.store.next_cut(lo, hi, self.params.threshold(level)) < hi:
            level += 1
        right = 0 if end[0] >= INFINITY_TS else end[0]
        return pb.Node(
            timestamp=start[0],
            level=level,
            right=right,
            merkle_hash=self._fingerprint(start, end),
        )

    def _bound_at(self, position: int, window_lo: int) -> Bound:
        prev = self.store.item(position - 1) if position > window_lo else self._start
        return minimal_bound(prev, self.store.item(position))

    def _children(
        self, start: Bound, level: int, window: tuple[int, int], stop: int
    ) -> Iterator[pb.Node]:
        """The server's children of the level-``level`` node that starts at ``start``.

        Read lazily, in growing chunks, so a caller that stops early reads little. The node
        must end by position ``stop`` (where the next node asked for starts): one that runs
        past it overlaps that node, which no honest client asks for.
        """
        store = self.store
        window_lo, window_hi = window
        pos = max(store.lower_bound(start), window_lo)
        first = pos if start == self._start else min(pos + 1, window_hi)
        limit = min(stop + 1, window_hi)  # a cut at `stop` itself ends the node in time
        threshold = self.params.threshold(level)
        below = self.params.threshold(level - 1) if level > 1 else 0
        key, key_pos = start, pos
        search, chunk = first, _CHUNK
        while True:
            hi = min(limit, search + chunk)
            end = store.next_cut(search, hi, threshold)
            if level == 1:
                for item in store.items(key_pos, end):
                    yield _item_node(item)
                key_pos = end
            else:
                for p in store.cut_points(search, end, below):
                    yield self._node(key, key_pos, p, level - 1)
                    key, key_pos = self._bound_at(p, window_lo), p
            if end < hi or hi >= window_hi:
                if level > 1:
                    yield self._node(key, key_pos, end, level - 1)
                return
            if hi >= limit:
                raise RemoteProtocolError("asked nodes overlap: a node runs past the next one")
            search, chunk = hi, chunk * 4

    def _node(self, key: Bound, start: int, stop: int, level: int) -> pb.Node:
        return pb.Node(
            timestamp=key[0],
            node_hash=key[1],
            level=level,
            merkle_hash=fingerprint_of_sum(*self.store.summary(start, stop)),
        )

    # -- client -----------------------------------------------------------------------

    def _initiate(self) -> bytes:
        assert self._end is not None
        root = self._root(self._start, self._end)
        return encode(MessageType.EXCHANGE_ROOT_REQUEST, pb.ExchangeRootRequest(root=root))

    def _evaluate(self, frame: bytes) -> FrameOutcome:
        kind, message = decode(frame)
        handler = self._client_handler(kind) if self.initiator else self._server_handler(kind)
        if handler is None:
            role = "client" if self.initiator else "server"
            raise RemoteProtocolError(f"a {role} does not expect {kind.name} here")
        return handler(message)

    def _client_handler(self, kind: MessageType) -> Callable[[Message], FrameOutcome] | None:
        if kind is MessageType.EXCHANGE_ROOT_RESPONSE and not self._asked and not self._unsent:
            return self._on_root_response
        if kind is MessageType.GET_NON_BOUNDARY_NODES_RESPONSE and self._asked:
            return self._on_children
        if kind is MessageType.SYNC_DONE and self._unsent:
            return self._on_done_ack
        return None

    def _on_root_response(self, message: Message) -> FrameOutcome:
        assert isinstance(message, pb.ExchangeRootResponse) and self._end is not None
        root = message.root
        right = 0 if self._end[0] >= INFINITY_TS else self._end[0]
        if root.timestamp != self._start[0] or root.right != right:
            raise RemoteProtocolError("ExchangeRootResponse is for another window")
        if not 1 <= root.level <= MAX_LEVEL or len(root.merkle_hash) != FINGERPRINT_SIZE:
            raise RemoteProtocolError("ExchangeRootResponse root is malformed")
        if root.merkle_hash == self._fingerprint(self._start, self._end):
            return FrameOutcome(None, finished=True)
        return self._next_request([_Pending(self._start, self._end, root.level)], [], [])

    def _on_children(self, message: Message) -> FrameOutcome:
        assert isinstance(message, pb.GetNonBoundaryNodesResponse)
        groups = self._groups(list(message.non_boundary_nodes))
        pending: list[_Pending] = []
        have: list[Item] = []
        need: list[Item] = []
        for parent, (children, complete) in zip(self._asked, groups, strict=False):
            if parent.level == 1:
                gain = self._diff_items(parent, children, complete, pending)
            else:
                gain = self._compare_nodes(parent, children, complete, pending), []
            have += gain[0]
            need += gain[1]
        pending += self._asked[len(groups) :]
        return self._next_request(pending, have, need)

    def _groups(self, nodes: list[pb.Node]) -> list[tuple[list[pb.Node], bool]]:
        """Children per asked node, and whether each list was closed by its tail sentinel."""
        groups: list[tuple[list[pb.Node], bool]] = []
        current: list[pb.Node] = []
        for node in nodes:
            if node.is_tail:
                groups.append((current, True))
                current = []
            else:
                current.append(node)
        if current:
            groups.append((current, False))
        if len(groups) > len(self._asked) or (groups and not groups[-1][1] and len(current) < 2):
            raise RemoteProtocolError("children do not match the nodes asked for")
        return groups

    def _diff_items(
        self, parent: _Pending, nodes: list[pb.Node], complete: bool, pending: list[_Pending]
    ) -> tuple[list[Item], list[Item]]:
        theirs = [_item(n) for n in nodes]
        end = parent.end
        if not complete:
            end = theirs.pop()
            pending.append(_Pending(end, parent.end, 1))
        if any(b <= a for a, b in pairwise(theirs)) or (
            theirs and (theirs[0] < parent.start or theirs[-1] >= end)
        ):
            raise RemoteProtocolError("level-0 nodes out of order or outside their parent")
        ours = self.store.items(*self._positions(parent.start, end))
        mine, listed = set(ours), set(theirs)
        return [it for it in ours if it not in listed], [it for it in theirs if it not in mine]

    def _compare_nodes(
        self, parent: _Pending, nodes: list[pb.Node], complete: bool, pending: list[_Pending]
    ) -> list[Item]:
        keys = [_key(n) for n in nodes]
        if (
            not keys
            or keys[0] != parent.start
            or any(b <= a for a, b in pairwise(keys))
            or keys[-1] >= parent.end
            or any(n.level != parent.level - 1 for n in nodes)
            or any(len(n.merkle_hash) != FINGERPRINT_SIZE for n in nodes)
        ):
            raise RemoteProtocolError("child nodes malformed or outside their parent")
        ends = [*keys[1:], parent.end]
        if not complete:
            pending.append(_Pending(keys[-1], parent.end, parent.level))
            nodes, keys, ends = nodes[:-1], keys[:-1], ends[:-1]
        for node, key, end in zip(nodes, keys, ends, strict=True):
            if node.merkle_hash != self._fingerprint(key, end):
                pending.append(_Pending(key, end, parent.level - 1))
        return []

    def _next_request(
        self, pending: list[_Pending], have: list[Item], need: list[Item]
    ) -> FrameOutcome:
        if not pending:
            return self._sync_done(sorted(self.have + have), sorted(self.need + need), have, need)
        asked: list[_Pending] = []
        request = pb.GetNonBoundaryNodesRequest()
        size = 2
        for p in pending:
            node = pb.Node(timestamp=p.start[0], node_hash=p.start[1], level=p.level)
            size += node.ByteSize() + _NODE_OVERHEAD
            if asked and size > self.max_frame_size:
                break
            request.start_nodes.append(node)
            asked.append(p)
        rest = pending[len(asked) :]

        def commit() -> None:
            self._asked = asked + rest

        # Ask for what fits; the rest waits in _asked's tail and is re-asked after the reply.
        frame = encode(MessageType.GET_NON_BOUNDARY_NODES_REQUEST, request)
        return FrameOutcome(frame, have, need, commit=commit)

    def _sync_done(
        self, has: list[Item], needs: list[Item], have: list[Item], need: list[Item]
    ) -> FrameOutcome:
        """Tell the server what we learned, in as many frames as that takes."""
        done = pb.SyncDone()
        size = 4  # header and the `more` flag
        sent = 0
        for side, item in chain(
            ((done.client_has, it) for it in has), ((done.client_needs, it) for it in needs)
        ):
            node = _item_node(item)
            size += node.ByteSize() + _NODE_OVERHEAD
            if size > self.max_frame_size:
                break
            side.append(node)
            sent += 1
        has, needs = has[sent:], needs[max(0, sent - len(has)) :]
        unsent = (has, needs) if has or needs else None
        done.more = unsent is not None

        def commit() -> None:
            self._asked = []
            self._unsent = unsent

        frame = encode(MessageType.SYNC_DONE, done)
        return FrameOutcome(frame, have, need, finished=unsent is None, commit=commit)

    def _on_done_ack(self, message: Message) -> FrameOutcome:
        assert self._unsent is not None
        return self._sync_done(list(self._unsent[0]), list(self._unsent[1]), [], [])

    # -- server -----------------------------------------------------------------------

    def _server_handler(self, kind: MessageType) -> Callable[[Message], FrameOutcome] | None:
        if self._end is None:
            return self._on_root_request if kind is MessageType.EXCHANGE_ROOT_REQUEST else None
        return {
            MessageType.GET_NON_BOUNDARY_NODES_REQUEST: self._on_children_request,
            MessageType.GET_INTERMEDIATE_NODE_REQUEST: self._on_node_request,
            MessageType.SYNC_DONE: self._on_sync_done,
        }.get(kind)

    def _on_root_request(self, message: Message) -> FrameOutcome:
        assert isinstance(message, pb.ExchangeRootRequest)
        root = message.root
        if root.timestamp < 0 or root.right < 0 or (root.right and root.right <= root.timestamp):
            raise RemoteProtocolError("ExchangeRootRequest names no window")
        if len(root.merkle_hash) != FINGERPRINT_SIZE:
            raise RemoteProtocolError("ExchangeRootRequest root has no 16-byte merkle_hash")
        start: Bound = (root.timestamp, b"")
        end: Bound = (root.right or INFINITY_TS, b"")
        ours = self._root(start, end)

        def commit() -> None:
            self._start, self._end = start, end
            self._root_level = ours.level

        frame = encode(MessageType.EXCHANGE_ROOT_RESPONSE, pb.ExchangeRootResponse(root=ours))
        return FrameOutcome(frame, finished=ours.merkle_hash == root.merkle_hash, commit=commit)

    def _on_children_request(self, message: Message) -> FrameOutcome:
        assert isinstance(message, pb.GetNonBoundaryNodesRequest) and self._end is not None
        starts = [(_key(n), n.level) for n in message.start_nodes]
        if any(
            not 1 <= lvl <= self._root_level or not self._start <= k < self._end
            for k, lvl in starts
        ):
            raise RemoteProtocolError("start node outside the window or at a bad level")
        keys = sorted(k for k, _ in starts)
        if any(a == b for a, b in pairwise(keys)):
            raise RemoteProtocolError("a start node is asked for twice")
        window = self._positions(self._start, self._end)
        response = pb.GetNonBoundaryNodesResponse()
        room = self.max_frame_size - 2
        size = 0
        for key, level in starts:
            later = bisect.bisect_right(keys, key)
            stop = self.store.lower_bound(keys[later]) if later < len(keys) else window[1]
            group: list[pb.Node] = []
            group_size = _TAIL.ByteSize() + _NODE_OVERHEAD
            for child in self._children(key, level, window, stop):
                group_size += child.ByteSize() + _NODE_OVERHEAD
                if size + group_size > room:
                    break
                group.append(child)
            else:
                response.non_boundary_nodes.extend([*group, _TAIL])
                size += group_size
                continue
            if not response.non_boundary_nodes:  # a node too big for one frame: send a part
                response.non_boundary_nodes.extend(group)
            break
        frame = encode(MessageType.GET_NON_BOUNDARY_NODES_RESPONSE, response)
        return FrameOutcome(frame)

    def _on_node_request(self, message: Message) -> FrameOutcome:
        assert isinstance(message, pb.GetIntermediateNodeRequest) and self._end is not None
        if message.node_id < 0 or not 0 <= message.level <= MAX_LEVEL:
            raise RemoteProtocolError("GetIntermediateNodeRequest out of range")
        node = self._node_at(message.node_id, message.level)
        response = pb.GetIntermediateNodeResponse(node=node)
        return FrameOutcome(encode(MessageType.GET_INTERMEDIATE_NODE_RESPONSE, response))

    def _node_at(self, timestamp: int, level: int) -> pb.Node:
        """The level-``level`` node holding the first item at or after ``timestamp``."""
        assert self._end is not None
        store = self.store
        window_lo, window_hi = self._positions(self._start, self._end)
        pos = max(store.lower_bound((timestamp, b"")), window_lo)
        if level == 0:
            return _item_node(store.item(pos)) if pos < window_hi else pb.Node()
        threshold = self.params.threshold(level)
        cut = self._last_cut(window_lo, min(pos + 1, window_hi), threshold)
        first = window_lo if cut is None else cut
        key = self._start if cut is None else self._bound_at(cut, window_lo)
        end = store.next_cut(first if cut is None else first + 1, window_hi, threshold)
        right = store.item(end)[0] if end < window_hi else 0
        return pb.Node(
            timestamp=key[0],
            node_hash=key[1],
            level=level,
            right=right,
            merkle_hash=fingerprint_of_sum(*store.summary(first, end)),
        )

    def _last_cut(self, lo: int, hi: int, threshold: int) -> int | None:
        """The last position in ``[lo, hi)`` whose coin is ``< threshold``, searching back in
        growing chunks (never listing every cut of the window)."""
        chunk = _CHUNK
        while hi > lo:
            begin = max(lo, hi - chunk)
            cuts = self.store.cut_points(begin, hi, threshold)
            if len(cuts):
                return int(cuts[-1])
            hi, chunk = begin, chunk * 4
        return None

    def _on_sync_done(self, message: Message) -> FrameOutcome:
        assert isinstance(message, pb.SyncDone) and self._end is not None
        has = [_item(n) for n in message.client_has]
        needs = [_item(n) for n in message.client_needs]
        if any(not self._start <= it < self._end for it in has + needs):
            raise RemoteProtocolError("SyncDone names an item outside the window")
        if any(self._holds(it) for it in has) or not all(self._holds(it) for it in needs):
            raise RemoteProtocolError("SyncDone contradicts our store")
        reply = encode(MessageType.SYNC_DONE, pb.SyncDone()) if message.more else None
        return FrameOutcome(reply, have=needs, need=has, finished=not message.more)

    def _holds(self, item: Item) -> bool:
        position = self.store.lower_bound(item)
        return position < len(self.store) and self.store.item(position) == item
