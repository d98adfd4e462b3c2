"""Fuzzing the reconciliation decoders: RBSR and Prolly frames, Store Sync message batches.

Every frame a session receives is untrusted. Frames come hypothesis-generated from
scratch (ranges, nodes and entries with plausible and extreme fields) and as mutations
of real frames recorded from real conversations (:mod:`sdsync.testing.reconcile_fuzz`): bit
flips, truncations, splices of other frames, varints inflated or made overlong, ranges
and nodes repeated (sometimes hundreds of times), dropped, swapped or reversed, fields
set to extremes. Each frame is fed to the session that was about to receive the real
one, and :func:`sdsync.testing.reconcile_fuzz.check_frame` checks:

* only :class:`~sdsync.errors.RemoteProtocolError` escapes;
* a rejected frame changes nothing (a snapshot of the session compares equal), and the
  real conversation, continued with the real frame, still finds the exact difference;
* an accepted frame leaves the session sane (``have`` only ours, ``need`` only what we
  lack, all inside the window, the reply within the frame limit), and the honest peer
  can be talked to until one side stops;
* the work of each ``receive``, counted by the store (calls and items handed out, never
  time), stays within ``work_bound`` of the bytes in and out and the items learned.

Batches are checked against a decoder written from the batch format alone.

This is the CI slice (a few hundred hypothesis examples per target and 3,000 seeded cases);
``bench/fuzz_decoders.py`` runs the same properties for a million cases.
"""

from __future__ import annotations

import random

from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdsync.reconcile import METHODS
from sdsync.reconcile import prolly_pb2 as pb
from sdsync.reconcile.fingerprint import varint
from sdsync.reconcile.prolly import MessageType
from sdsync.reconcile.rbsr import Mode
from sdsync.testing import reconcile_fuzz as fuzz
from sdsync.testing import sync_fuzz as batch_fuzz

FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FOLLOW = settings(FUZZ, max_examples=100)

CONVERSATIONS = fuzz.conversations()
HARNESS = fuzz.Harness(CONVERSATIONS)
DONORS = [t.frame for c in CONVERSATIONS for t in c.turns]
BATCHES = batch_fuzz.batch_corpus()
NEAR = 10**18


def _indices(method: str) -> list[int]:
    return [i for i, c in enumerate(CONVERSATIONS) if c.scene.method == method]


@st.composite
def turns(draw: st.DrawFn, method: str) -> tuple[int, int]:
    """A conversation of ``method`` and one of its turns (conversations equally likely)."""
    conv = draw(st.sampled_from(_indices(method)))
    return conv, draw(st.integers(0, len(CONVERSATIONS[conv].turns) - 1))


def _check(conv: int, index: int, frame: bytes, *, follow: bool = False) -> fuzz.Outcome:
    out = HARNESS.check(conv, index, frame, follow=follow)
    assert not out.failures, out.failures
    return out


# ------------------------------------------------------------------------- mutations

_VALUES = st.integers(0, 255) | st.integers(0, 1 << 16) | st.sampled_from([7, 8, 9, 10])


@st.composite
def mutations(draw: st.DrawFn) -> list[fuzz.Mutation]:
    ops: list[fuzz.Mutation] = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(fuzz.BYTE_OPS + fuzz.STRUCT_OPS))
        value = draw(_VALUES)
        if op == "varint" and draw(st.booleans()):
            value = -draw(st.integers(1, 1 << 40))  # a specific count or length
        blob = (
            draw(st.sampled_from(DONORS))
            if op == "splice"
            else draw(st.binary(min_size=1, max_size=12))
        )
        ops.append((op, draw(st.integers(0, 1 << 20)), value, blob))
    return ops


# ---------------------------------------------------------------------- RBSR frames

_TS_CODES = st.sampled_from([0, 1, 2, 1 << 63, (1 << 64) - 1]) | st.integers(0, 1 << 40)
_COUNTS = st.sampled_from([0, 1, 2, 24, 25, (1 << 64) - 1, 1 << 70]) | st.integers(0, 4096)


_big = fuzz.encode_varint


@st.composite
def rbsr_ranges(draw: st.DrawFn) -> bytes:
    prefix = draw(st.binary(max_size=33))
    mode = draw(st.sampled_from(list(Mode)) | st.integers(0, 7))
    out = _big(draw(_TS_CODES)) + _big(len(prefix) * 8 + mode) + prefix
    if mode == Mode.FINGERPRINT:
        return out + draw(st.binary(min_size=15, max_size=16))
    if mode not in (Mode.ITEMS, Mode.DIFF, Mode.FULL):
        return out
    if mode == Mode.DIFF:
        answered = draw(_COUNTS)
        out += _big(answered) + draw(st.binary(max_size=min(64, (answered + 7) // 8)))
    size = 16 if mode == Mode.ITEMS else 32
    items = draw(
        st.lists(
            st.tuples(st.integers(0, 1 << 63), st.binary(min_size=size, max_size=size)),
            max_size=6,
        )
    )
    count = len(items) if draw(st.booleans()) else draw(_COUNTS)
    return out + _big(count) + b"".join(_big(ts) + h for ts, h in items)


@st.composite
def rbsr_frames(draw: st.DrawFn, first: bool) -> bytes:
    version = draw(st.just(1) | st.integers(0, 255))
    head = bytes([version])
    if first or draw(st.booleans()):
        head += _big(draw(st.sampled_from([0, NEAR, 1 << 63]) | st.integers(0, 1 << 64)))
    body = b"".join(draw(st.lists(rbsr_ranges(), max_size=8)))
    return head + body


@FUZZ
@given(turn=turns("rbsr"), data=st.data())
def test_rbsr_frames_from_scratch(turn: tuple[int, int], data: st.DataObject) -> None:
    frame = data.draw(rbsr_frames(first=turn[1] == 0))
    _check(*turn, frame)


@FUZZ
@given(turn=turns("rbsr"), ops=mutations())
def test_rbsr_mutated_frames(turn: tuple[int, int], ops: list[fuzz.Mutation]) -> None:
    conv, index = turn
    real = CONVERSATIONS[conv].turns[index].frame
    _check(conv, index, fuzz.mutate("rbsr", real, ops, first=index == 0))


# --------------------------------------------------------------------- Prolly frames

_TIMESTAMPS = st.sampled_from([-1, 0, NEAR, (1 << 63) - 1, -(1 << 63)]) | st.integers(
    NEAR, NEAR + 10**7
)
_LEVELS = st.sampled_from([-1, 0, 1, 2, 3, 64, 65, (1 << 31) - 1]) | st.integers(0, 12)


@st.composite
def nodes(draw: st.DrawFn) -> pb.Node:
    return pb.Node(
        timestamp=draw(_TIMESTAMPS),
        node_hash=draw(st.binary(max_size=33)),
        level=draw(_LEVELS),
        merkle_hash=draw(st.binary(min_size=15, max_size=17) | st.just(b"")),
        data=draw(st.binary(min_size=31, max_size=33) | st.just(b"")),
        is_tail=draw(st.booleans()),
        right=draw(st.just(0) | _TIMESTAMPS),
    )


@st.composite
def prolly_frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(list(MessageType)) | st.integers(0, 255))
    version = draw(st.just(1) | st.integers(0, 255))
    node_list = draw(st.lists(nodes(), max_size=6))
    if kind == MessageType.EXCHANGE_ROOT_REQUEST:
        message: Message = pb.ExchangeRootRequest(root=draw(nodes()))
    elif kind == MessageType.EXCHANGE_ROOT_RESPONSE:
        message = pb.ExchangeRootResponse(root=draw(nodes()))
    elif kind == MessageType.GET_INTERMEDIATE_NODE_REQUEST:
        message = pb.GetIntermediateNodeRequest(node_id=draw(_TIMESTAMPS), level=draw(_LEVELS))
    elif kind == MessageType.GET_INTERMEDIATE_NODE_RESPONSE:
        message = pb.GetIntermediateNodeResponse(node=draw(nodes()))
    elif kind == MessageType.GET_NON_BOUNDARY_NODES_REQUEST:
        message = pb.GetNonBoundaryNodesRequest(start_nodes=node_list)
    elif kind == MessageType.GET_NON_BOUNDARY_NODES_RESPONSE:
        message = pb.GetNonBoundaryNodesResponse(non_boundary_nodes=node_list)
    elif kind == MessageType.SYNC_DONE:
        half = draw(st.integers(0, len(node_list)))
        message = pb.SyncDone(
            client_has=node_list[:half], client_needs=node_list[half:], more=draw(st.booleans())
        )
    else:
        return bytes([version, kind]) + draw(st.binary(max_size=64))
    return bytes([version, kind]) + message.SerializeToString()


@FUZZ
@given(turn=turns("prolly"), frame=prolly_frames())
def test_prolly_frames_from_scratch(turn: tuple[int, int], frame: bytes) -> None:
    _check(*turn, frame)


@FUZZ
@given(turn=turns("prolly"), ops=mutations())
def test_prolly_mutated_frames(turn: tuple[int, int], ops: list[fuzz.Mutation]) -> None:
    conv, index = turn
    _check(conv, index, fuzz.mutate("prolly", CONVERSATIONS[conv].turns[index].frame, ops))


# ------------------------------------------------- after a frame: the rest of the talk


def _from_scratch(method: str, first: bool) -> st.SearchStrategy[bytes]:
    """Frames of ``method`` generated from scratch (a fuzzed method without a generator
    here fails: each one needs its own)."""
    return {"rbsr": rbsr_frames(first=first), "prolly": prolly_frames()}[method]


def test_the_harness_fuzzes_methods_of_the_table() -> None:
    assert set(fuzz.FUZZED_METHODS) <= set(METHODS)
    assert {c.scene.method for c in CONVERSATIONS} == set(fuzz.FUZZED_METHODS)


@FOLLOW
@given(method=st.sampled_from(fuzz.FUZZED_METHODS), data=st.data())
def test_conversations_go_on_after_hostile_frames(method: str, data: st.DataObject) -> None:
    """A rejected frame leaves the real conversation intact; an accepted forgery leads,
    with an honest peer, to an end (done, rejected or cut off), within the bounds."""
    conv, index = data.draw(turns(method))
    real = CONVERSATIONS[conv].turns[index].frame
    if data.draw(st.booleans()):
        frame = fuzz.mutate(method, real, data.draw(mutations()), first=index == 0)
    else:
        frame = data.draw(_from_scratch(method, first=index == 0))
    _check(conv, index, frame, follow=True)


def test_real_frames_pass_the_checks() -> None:
    for conv, c in enumerate(CONVERSATIONS):
        for index, turn in enumerate(c.turns):
            assert _check(conv, index, turn.frame, follow=index % 3 == 0).accepted


# --------------------------------------------------------------- seeded (the bench's)


def test_seeded_generators_as_in_the_bench() -> None:
    """The bench's generators, a few thousand cases: they must keep finding nothing."""
    rng = random.Random(2024)
    for case in range(2_000):
        conv = rng.randrange(len(CONVERSATIONS))
        c = CONVERSATIONS[conv]
        index = rng.randrange(len(c.turns))
        method = c.scene.method
        if case % 2:
            frame = fuzz.mutate(
                method, c.turns[index].frame, fuzz.random_mutations(rng, DONORS), first=index == 0
            )
        elif method == "rbsr":
            frame = fuzz.random_rbsr_frame(rng, first=index == 0)
        else:
            frame = fuzz.random_prolly_frame(rng)
        _check(conv, index, frame, follow=case % 50 == 0)
    for case in range(1_000):
        body = (
            batch_fuzz.random_batch(rng, BATCHES)
            if case % 2
            else fuzz.mutate(
                "batch", rng.choice(BATCHES.batches), fuzz.random_mutations(rng, BATCHES.entries)
            )
        )
        assert not batch_fuzz.check_batch(body, BATCHES.expected).failures


# -------------------------------------------------------------------------- batches

_TOPICS = (
    st.sampled_from([b"/waku/2/rs/1/0", b"", b"\xed\xa0\x80", b"\xc0\x80", b"t" * 1025])
    | st.text(max_size=8).map(str.encode)
    | st.binary(max_size=8)
)
_MESSAGES = (
    st.sampled_from(BATCHES.messages)
    | st.binary(max_size=48)
    | st.builds(
        lambda ts, topic: b"\x12" + varint(len(topic)) + topic + b"\x50" + _big(ts),
        st.sampled_from([0, 1, (1 << 64) - 1, 1 << 70]) | st.integers(0, 1 << 64),
        st.binary(max_size=6),
    )
)
_LENGTH_SKEW = st.sampled_from([0, 0, 0, 0, -1, 1, 2]) | st.sampled_from(fuzz.HUGE)


@st.composite
def batch_entries(draw: st.DrawFn) -> bytes:
    topic, message = draw(_TOPICS), draw(_MESSAGES)
    out = b""
    for part in (topic, message):
        skew = draw(_LENGTH_SKEW)
        length = max(0, len(part) + skew) if skew < 16 else skew
        out += _big(length) + part
    return out


@FUZZ
@given(entries=st.lists(batch_entries() | st.sampled_from(BATCHES.entries), max_size=6))
def test_batches_from_scratch(entries: list[bytes]) -> None:
    out = batch_fuzz.check_batch(b"".join(entries), BATCHES.expected)
    assert not out.failures, out.failures


@FUZZ
@given(batch=st.sampled_from(BATCHES.batches), ops=mutations())
def test_mutated_batches(batch: bytes, ops: list[fuzz.Mutation]) -> None:
    out = batch_fuzz.check_batch(fuzz.mutate("batch", batch, ops), BATCHES.expected)
    assert not out.failures, out.failures


def test_real_batches_are_accepted_and_unexpected_ones_refused() -> None:
    for batch in BATCHES.batches:
        assert not batch_fuzz.check_batch(batch, BATCHES.expected, valid=True).failures
    out = batch_fuzz.check_batch(BATCHES.batches[0], frozenset())
    assert not out.accepted and not out.failures
    huge = _big(3) + b"/t/" + _big((1 << 64) - 1) + b"\x12\x01c"
    assert not batch_fuzz.check_batch(huge, BATCHES.expected).accepted
