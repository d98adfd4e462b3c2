"""Peers' bad frames raise RemoteProtocolError and change nothing; misuse raises Local."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from reconcile_sets import split_sets

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reconcile import (
    METHODS,
    MemoryItemStore,
    ProllyParams,
    ProllySession,
    RbsrParams,
    RbsrSession,
    ReconcileSession,
    reconcile_in_memory,
    sessions,
)
from sdsync.reconcile import prolly_pb2 as pb
from sdsync.reconcile.fingerprint import varint
from sdsync.reconcile.prolly import MessageType, encode
from sdsync.reconcile.rbsr import Mode


def _snapshot(s: ReconcileSession) -> tuple[object, ...]:
    return (list(s.have), list(s.need), repr(s.stats), s.done, repr(vars(s).get("_state")))


def _stores() -> tuple[MemoryItemStore, MemoryItemStore]:
    a, b = split_sets(3000, 20, 20, seed=21)
    return MemoryItemStore(a), MemoryItemStore(b)


def _mid_session(method: str) -> tuple[ReconcileSession, ReconcileSession, bytes]:
    """Both sessions, and the frame the initiator should receive next (a real one)."""
    a, b = _stores()
    init, resp = sessions(a, b, method)
    first = resp.receive(init.initiate())
    assert first is not None
    return init, resp, first


def _mutations(frame: bytes) -> list[bytes]:
    return [
        b"",
        bytes([frame[0] + 1]) + frame[1:],  # wrong version
        frame[:-1],  # truncated
        frame + b"\xff\xff\xff",  # trailing garbage
        frame[:2] + b"\xff" * 12,  # overlong varint / bad message
    ]


@pytest.mark.parametrize("method", METHODS)
def test_malformed_frames_leave_the_session_untouched(method: str) -> None:
    init, resp, good = _mid_session(method)
    before = _snapshot(init)
    for bad in _mutations(good):
        if bad == good:
            continue
        with pytest.raises(RemoteProtocolError):
            init.receive(bad)
        assert _snapshot(init) == before
    # The session still works with the real frame afterwards (and the rest of the turn).
    sender, receiver = resp, init
    reply = receiver.receive(good)
    while True:
        while reply is None and not receiver.done and (more := sender.stream()) is not None:
            reply = receiver.receive(more)
        if reply is None:
            break
        sender, receiver = receiver, sender
        reply = receiver.receive(reply)
    assert init.done and len(init.have) == 20 and len(init.need) == 20


@pytest.mark.parametrize("method", METHODS)
def test_oversized_frame_is_refused(method: str) -> None:
    init, _, good = _mid_session(method)
    before = _snapshot(init)
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        init.receive(good + bytes(init.max_frame_size))
    assert _snapshot(init) == before


def _range(ts_code: int, mode: int, payload: bytes = b"", prefix: bytes = b"") -> bytes:
    return varint(ts_code) + varint(len(prefix) * 8 + mode) + prefix + payload


def test_rbsr_semantic_violations() -> None:
    _, b = _stores()
    resp = RbsrSession.responder(b)
    first = bytes([1]) + varint(100)  # version, window start 100
    cases = {
        "no ranges": first,
        "unknown mode": first + _range(0, 7),
        "bounds do not increase": first + _range(1, Mode.FINGERPRINT, bytes(16)),
        "DIFF in a first frame": first + _range(0, Mode.DIFF, varint(0) + varint(0)),
        "prefix too long": first + _range(5, Mode.FINGERPRINT, bytes(16), prefix=bytes(33)),
        "window end with a prefix": first + _range(5, Mode.FINGERPRINT, bytes(16), b"\x01"),
        "item outside range": first + _range(10, Mode.ITEMS, varint(1) + varint(50) + bytes(16)),
        "items out of order": first
        + _range(0, Mode.ITEMS, varint(2) + varint(1) + b"\x02" * 16 + varint(0) + b"\x01" * 16),
    }
    pristine = _snapshot(resp)
    for name, frame in cases.items():
        with pytest.raises(RemoteProtocolError):
            resp.receive(frame)
        assert _snapshot(resp) == pristine, name
    assert resp.window is None


def test_rbsr_answers_that_contradict_our_list() -> None:
    a = MemoryItemStore([(5, b"\x01" * 32), (6, b"\x02" * 32)])
    init = RbsrSession(a, initiator=True)
    init.initiate()  # ITEMS with our two items over the whole key space
    cases = {
        "answers 3 items": _range(0, Mode.DIFF, varint(3) + b"\x00" + varint(0)),
        "listed ourselves": _range(
            0, Mode.DIFF, varint(2) + b"\x00" + varint(1) + varint(5) + b"\x01" * 32
        ),
        "padding": _range(0, Mode.DIFF, varint(2) + b"\x04" + varint(0)),
        "items we hold": _range(0, Mode.FULL, varint(1) + varint(5) + b"\x01" * 32),
    }
    pristine = _snapshot(init)
    for match, body in cases.items():
        with pytest.raises(RemoteProtocolError, match=match):
            init.receive(bytes([1]) + body)
        assert _snapshot(init) == pristine
    # A well-formed DIFF: the peer lacks our second item and holds one more.
    extra = (7, b"\x03" * 32)
    good = _range(0, Mode.DIFF, varint(2) + b"\x02" + varint(1) + varint(7) + extra[1])
    reply = init.receive(bytes([1]) + good)
    assert init.have == [(6, b"\x02" * 32)] and init.need == [extra]
    assert reply is not None and init.done  # FULL with the item the peer lacks


def test_prolly_protocol_violations() -> None:
    a, b = _stores()
    client = ProllySession(a, initiator=True)
    server = ProllySession.responder(b)
    root_request = client.initiate()
    unexpected = encode(MessageType.GET_NON_BOUNDARY_NODES_REQUEST, pb.GetNonBoundaryNodesRequest())
    with pytest.raises(RemoteProtocolError, match="does not expect"):
        server.receive(unexpected)  # before ExchangeRoot
    with pytest.raises(RemoteProtocolError, match="unknown"):
        server.receive(bytes([1, 99]))
    no_hash = encode(
        MessageType.EXCHANGE_ROOT_REQUEST, pb.ExchangeRootRequest(root=pb.Node(timestamp=1))
    )
    with pytest.raises(RemoteProtocolError, match="merkle"):
        server.receive(no_hash)
    response = server.receive(root_request)
    assert response is not None
    other_window = encode(
        MessageType.EXCHANGE_ROOT_RESPONSE,
        pb.ExchangeRootResponse(root=pb.Node(timestamp=7, level=1, merkle_hash=bytes(16))),
    )
    with pytest.raises(RemoteProtocolError, match="another window"):
        client.receive(other_window)
    before = _snapshot(client)
    forged_children = encode(
        MessageType.GET_NON_BOUNDARY_NODES_RESPONSE,
        pb.GetNonBoundaryNodesResponse(non_boundary_nodes=[pb.Node(is_tail=True)] * 3),
    )
    request = client.receive(response)
    assert request is not None
    before = _snapshot(client)
    with pytest.raises(RemoteProtocolError):
        client.receive(forged_children)
    assert _snapshot(client) == before
    lying_done = encode(
        MessageType.SYNC_DONE,
        pb.SyncDone(client_needs=[pb.Node(timestamp=10**18, data=bytes(32))]),
    )
    with pytest.raises(RemoteProtocolError, match="contradicts"):
        server.receive(lying_done)
    assert not server.have and not server.need and not server.done


def test_prolly_intermediate_node_is_served() -> None:
    a, b = _stores()
    client = ProllySession(a, initiator=True)
    server = ProllySession.responder(b)
    server.receive(client.initiate())
    ask = pb.GetIntermediateNodeRequest(node_id=b.item(1500)[0], level=1)
    frame = server.receive(encode(MessageType.GET_INTERMEDIATE_NODE_REQUEST, ask))
    assert frame is not None and frame[1] == MessageType.GET_INTERMEDIATE_NODE_RESPONSE
    node = pb.GetIntermediateNodeResponse.FromString(frame[2:]).node
    assert node.level == 1 and len(node.merkle_hash) == 16
    assert node.timestamp <= b.item(1500)[0] and (node.right == 0 or node.right > node.timestamp)


Misuse = Callable[[], object]


def test_caller_misuse_is_local() -> None:
    a, b = _stores()
    responder = RbsrSession.responder(b)
    initiator = RbsrSession(a, initiator=True)
    misuse: list[Misuse] = [
        responder.initiate,
        lambda: initiator.receive(b"\x01"),  # before initiate()
        lambda: initiator.receive("text"),  # type: ignore[arg-type]
        lambda: RbsrSession(a, initiator=True, window=(10, 5)),
        lambda: RbsrSession(a, initiator=True, window=(-1, None)),
        lambda: RbsrParams(fanout=1),
        lambda: ProllyParams(fanout=1),
        lambda: RbsrSession(a, initiator=True, max_frame_size=100),
        lambda: reconcile_in_memory(a, b, "bloom"),  # type: ignore[arg-type]
    ]
    for call in misuse:
        with pytest.raises(LocalProtocolError):
            call()
    initiator.initiate()
    with pytest.raises(LocalProtocolError, match="already"):
        initiator.initiate()
    same = RbsrSession(a, initiator=True)
    peer = RbsrSession.responder(a)
    reply = peer.receive(same.initiate())
    assert reply is not None and same.receive(reply) is None and same.done
    with pytest.raises(LocalProtocolError, match="done"):
        same.receive(reply)
