"""A RIBLT peer's crafted frames end the session with RemoteProtocolError and change nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reconcile_sets import split_sets

from sdsync.errors import LocalProtocolError, RemoteProtocolError
from sdsync.reconcile import Item, MemoryItemStore, riblt, sessions
from sdsync.reconcile.fingerprint import varint
from sdsync.reconcile.riblt import RIBLT_VERSION, RibltParams, RibltSession, UndecodedError
from sdsync.reconcile.riblt_coding import encode, item_words

WINDOW = (10**18, 10**18 + 10**6)
TS_BYTES = 3


def _snapshot(s: RibltSession) -> tuple[object, ...]:
    decoder = s._diff[: s.symbols].tobytes()  # the symbols held, peeled as far as they go
    return (list(s.have), list(s.need), repr(s.stats), s.done, s._phase, s.symbols, decoder)


def _stores() -> tuple[MemoryItemStore, MemoryItemStore]:
    a, b = split_sets(3000, 20, 20, seed=21)
    return MemoryItemStore(a), MemoryItemStore(b)


def _opened(
    params: RibltParams | None = None,
) -> tuple[RibltSession, RibltSession, bytes]:
    """Both sides, and the first real batch of symbols the initiator should receive."""
    a, b = _stores()
    init = RibltSession(a, initiator=True, window=WINDOW, params=params)
    resp = RibltSession.responder(b, params=params)
    first = resp.receive(init.initiate())
    assert first is not None
    return init, resp, first


def _symbols(items: list[Item], *, first: int = 0, last: bool = False, rows: int = 1) -> bytes:
    """A SYMBOLS frame whose ``rows`` symbols code ``items`` (crafted, not a store's)."""
    ts = np.array([t for t, _ in items], dtype=np.int64)
    hashes = np.frombuffer(b"".join(h for _, h in items), dtype=np.uint8).reshape(-1, 32)
    coded = encode(item_words(ts, hashes), first + rows)[first:]
    body = b""
    for row in coded:
        body += row[:2].astype(">u8").tobytes()
        body += int(row[2]).to_bytes(8, "big")[8 - TS_BYTES :]
        body += int(row[3]).to_bytes(8, "big")[2:]
    header = bytes([RIBLT_VERSION, 1, int(last)]) + varint(first) + varint(rows)
    if first == 0:
        header += bytes([TS_BYTES]) + varint(3000)
    return header + body


def _finish(init: RibltSession, resp: RibltSession, frame: bytes | None) -> None:
    while frame is None and not init.done:
        frame = resp.stream()
        assert frame is not None
        frame = init.receive(frame)
    while frame is not None:
        frame = resp.receive(frame)
        if frame is not None:
            frame = init.receive(frame)
        while not init.done and (more := init.stream()) is not None:
            frame = resp.receive(more)


def test_malformed_symbols_leave_the_session_untouched() -> None:
    init, resp, good = _opened()
    before = _snapshot(init)
    for bad in [
        b"",
        bytes([RIBLT_VERSION - 1]) + good[1:],  # an older version
        good[:1] + bytes([2]) + good[2:],  # a DONE, out of turn
        good[:-1],  # truncated
        good + b"\x00",  # trailing byte
        good[:3] + varint(5) + good[4:],  # does not start at symbol 0
        good[:2] + bytes([0x80]) + good[3:],  # unknown flag
    ]:
        with pytest.raises(RemoteProtocolError):
            init.receive(bad)
        assert _snapshot(init) == before
    _finish(init, resp, init.receive(good))
    assert init.done and resp.done
    assert len(init.have) == len(init.need) == 20


def test_a_stream_that_ends_undecoded_ends_the_session() -> None:
    init, _, _ = _opened()
    before = _snapshot(init)
    with pytest.raises(RemoteProtocolError, match="did not decode"):
        init.receive(_symbols([(10**18 + 5, bytes(32)), (10**18 + 6, bytes(32))], last=True))
    assert _snapshot(init) == before


def test_symbols_past_the_cap_are_refused() -> None:
    init, _, _ = _opened(RibltParams(max_symbols=8))
    items = [(10**18 + k, bytes([k]) * 32) for k in range(40)]
    with pytest.raises(RemoteProtocolError, match="does not fit"):
        init.receive(_symbols(items, rows=9))


def test_an_item_outside_the_window_ends_the_session() -> None:
    init = RibltSession(MemoryItemStore([]), initiator=True, window=(10**18, 10**18 + 1000))
    init.initiate()
    before = _snapshot(init)
    # Symbols with three offset bytes: a pure symbol of an item 5,000 ns past the window
    # start decodes to a timestamp past the window end.
    outside = (10**18 + 5_000, b"\x11" * 32)
    with pytest.raises(RemoteProtocolError, match="outside the window"):
        init.receive(_symbols([outside]))
    assert _snapshot(init) == before


def test_an_item_named_twice_ends_the_session() -> None:
    init = RibltSession(MemoryItemStore([]), initiator=True, window=WINDOW)
    init.initiate()
    item = (10**18 + 7, b"\x22" * 32)
    coded = encode(item_words(np.array([item[0]]), np.frombuffer(item[1], np.uint8)[None]), 3)
    lone = _symbols([item])[-SYMBOL:]
    garbage = bytes(range(SYMBOL))  # not pure, and nothing peels it: the stream goes on
    assert init.receive(_frame(0, [lone, garbage])) is None
    # Symbol 2 reads as the item alone again once the decoder has peeled it there.
    again = bytes(SYMBOL) if coded[2].any() else lone
    before = _snapshot(init)
    with pytest.raises(RemoteProtocolError, match="already peeled"):
        init.receive(_frame(2, [again]))
    assert _snapshot(init) == before


SYMBOL = 16 + TS_BYTES + 6


def _frame(first: int, symbols: list[bytes]) -> bytes:
    header = bytes([RIBLT_VERSION, 1, 0]) + varint(first) + varint(len(symbols))
    if first == 0:
        header += bytes([TS_BYTES]) + varint(3000)
    return header + b"".join(symbols)


def _done(give: list[Item], take: list[tuple[int, bytes]]) -> bytes:
    """A whole DONE: ``take`` as (timestamp, id prefix) references."""
    body = varint(len(give)) + b"".join(varint(ts - WINDOW[0]) + h for ts, h in give)
    body += varint(len(take))
    for ts, prefix in take:
        named = bytes([len(prefix)]) + prefix if prefix else b""
        body += varint(2 * (ts - WINDOW[0]) + bool(prefix)) + named
    return bytes([RIBLT_VERSION, 2, 1]) + body


def test_done_offering_items_we_hold_or_naming_items_badly_is_refused() -> None:
    a, b = _stores()
    ts = b.item(0)[0]
    twin = (ts, b.item(0)[1][:1] + b"\xff" * 31)
    b.insert(twin)  # two items of one timestamp that share their first byte
    resp = RibltSession.responder(b)
    init = RibltSession(a, initiator=True, window=WINDOW)
    resp.receive(init.initiate())
    before = _snapshot(resp)
    absent = (10**18 + 3, b"\x44" * 32)
    for give, take in [
        ([b.item(0)], []),  # an item we hold
        ([], [(absent[0], absent[1][:16])]),  # an item we lack
        ([], [(ts, b"")]),  # two items: no prefix names one
        ([], [(ts, twin[1][:1])]),  # nor does their shared byte
        ([], [(ts, twin[1][:17] + b"\x00")]),  # a prefix longer than an id
    ]:
        with pytest.raises(RemoteProtocolError):
            resp.receive(_done(give, take))
        assert _snapshot(resp) == before
    # The byte after the shared one names the twin alone.
    assert resp.receive(_done([], [(ts, twin[1][:2])])) is not None


def test_misuse_is_local() -> None:
    a, b = _stores()
    init, resp = sessions(a, b, "riblt")
    with pytest.raises(LocalProtocolError):
        init.receive(b"\x01\x01")
    with pytest.raises(LocalProtocolError):
        resp.initiate()
    init.initiate()
    with pytest.raises(LocalProtocolError):
        init.initiate()


def _maps_to_2(item: Item) -> bool:
    words = item_words(np.array([item[0]]), np.frombuffer(item[1], np.uint8)[None])
    return bool(encode(words, 3)[2].any())


def test_a_rejected_batch_unpeels_what_it_peeled() -> None:
    init = RibltSession(MemoryItemStore([]), initiator=True, window=WINDOW)
    init.initiate()
    candidates = [(10**18 + 7, bytes([k]) * 32) for k in range(1, 60)]
    first = next(it for it in candidates if not _maps_to_2(it))
    second = next(it for it in candidates if _maps_to_2(it))
    garbage = bytes(range(SYMBOL))
    assert init.receive(_frame(0, [_symbols([first])[-SYMBOL:], garbage])) is None
    before = _snapshot(init)
    # Symbol 2 holds the second item alone: it is peeled from symbols 0 and 2 (and 1 if it
    # maps there), which leaves it alone in symbol 0, where the peer never put it: the
    # batch is refused (a stream that ends undecoded would be too) and the peel undone.
    alone = _symbols([second], first=2)[-SYMBOL:]
    with pytest.raises(RemoteProtocolError, match=r"already peeled|did not decode"):
        init.receive(bytes([RIBLT_VERSION, 1, 1]) + varint(2) + varint(1) + alone)
    assert _snapshot(init) == before


def _conversation() -> list[tuple[str, bytes, bool]]:
    """Every frame of a real session, with the side that receives it and whether the
    responder streamed it (a replay streams it too: the responder counts what it sent)."""
    a, b = _stores()
    init = RibltSession(a, initiator=True, window=WINDOW)
    resp = RibltSession.responder(b)
    frames: list[tuple[str, bytes, bool]] = [("resp", init.initiate(), False)]
    reply, streamed = resp.receive(frames[0][1]), False
    while reply is not None:
        frames.append(("init", reply, streamed))
        answer = init.receive(reply)
        reply, streamed = (resp.stream(), True) if answer is None else (None, False)
        if answer is not None:
            frames.append(("resp", answer, False))
            reply = resp.receive(answer)
    return frames


def _replay(sides: dict[str, RibltSession], frames: list[tuple[str, bytes, bool]]) -> None:
    for side, frame, streamed in frames:
        if streamed:
            sides["resp"].stream()
        sides[side].receive(frame)


CONVERSATION = _conversation()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    position=st.integers(0, len(CONVERSATION) - 1),
    edits=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 1 << 16)),
)
def test_mutated_frames_raise_only_remote_errors_and_change_nothing(
    position: int, edits: list[tuple[int, int]], cut: int | None
) -> None:
    a, b = _stores()
    init = RibltSession(a, initiator=True, window=WINDOW)
    resp = RibltSession.responder(b)
    sides = {"init": init, "resp": resp}
    init.initiate()
    _replay(sides, CONVERSATION[:position])  # up to the frame to spoil
    side, frame, streamed = CONVERSATION[position]
    if streamed:
        resp.stream()
    bad = bytearray(frame)
    for offset, value in edits:
        if bad:
            bad[offset % len(bad)] = value
    if cut is not None:
        bad = bad[: cut % (len(bad) + 1)]
    target = sides[side]
    before = _snapshot(target)
    try:
        target.receive(bytes(bad))
    except RemoteProtocolError:
        assert _snapshot(target) == before
    else:
        return  # an edit that changed nothing, or that a peer may make: nothing to check
    # Refused and untouched: the real conversation still ends with the exact difference.
    sides[side].receive(frame)
    _replay(sides, CONVERSATION[position + 1 :])
    mine, theirs = (set(store.items(0, len(store))) for store in (a, b))
    assert init.done and resp.done
    assert (set(init.have), set(init.need)) == (mine - theirs, theirs - mine)
    assert (set(resp.have), set(resp.need)) == (theirs - mine, mine - theirs)


def _open(items: int) -> bytes:
    """An ``OPEN`` of WINDOW claiming ``items`` items (nobody can check the claim)."""
    span = WINDOW[1] - WINDOW[0]
    return bytes([RIBLT_VERSION, 0]) + varint(WINDOW[0]) + varint(span) + b"\x08" + varint(items)


def _drain(resp: RibltSession, first: bytes) -> int:
    """Symbols a responder streams in all (its whole stream, read to the end)."""
    frames = [first]
    while (more := resp.stream()) is not None:
        frames.append(more)
    return resp.symbols


def test_a_claimed_count_earns_no_more_symbols_than_the_responder_holds() -> None:
    """An OPEN claiming 2**40 - 1 items used to earn 2**21 symbols (58.7 MB)."""
    _, b = _stores()
    params = RibltParams()
    for claim in ((1 << 40) - 1, len(b) + params.unverified_items, 0):
        resp = RibltSession.responder(b)
        first = resp.receive(_open(claim))
        assert first is not None
        trusted = min(claim, len(b) + params.unverified_items)
        assert _drain(resp, first) == 3 * (len(b) + trusted) + 64 < 7 * len(b) + 3200


def test_an_initiator_far_larger_than_the_responder_ends_undecoded() -> None:
    """The price of not taking a claim at its word: Store Sync then reconciles by RBSR."""
    a, _ = split_sets(6000, 0, 0, seed=22)
    init = RibltSession(MemoryItemStore(a), initiator=True, window=WINDOW)
    resp = RibltSession.responder(MemoryItemStore(sorted(a)[:100]))
    frame = resp.receive(init.initiate())
    with pytest.raises(UndecodedError, match="did not decode"):
        while frame is not None and init.receive(frame) is None:
            frame = resp.stream()


def test_a_done_naming_more_items_than_symbols_streamed_is_refused_unread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1 MiB DONE of a million references used to be parsed whole (1.5 s) first."""
    _, b = _stores()
    resp = RibltSession.responder(b)
    sent = _drain(resp, resp.receive(_open(0)) or b"")
    read = [0]
    real = riblt._read_reference
    monkeypatch.setattr(
        riblt, "_read_reference", lambda r: read.__setitem__(0, read[0] + 1) or real(r)
    )
    refs = 1_048_000
    long = bytes([RIBLT_VERSION, 2, 1]) + varint(0) + varint(refs) + varint(2) * refs
    short = bytes([RIBLT_VERSION, 2, 1]) + varint(0) + varint(sent + 1) + varint(2) * (sent + 1)
    for done in (long, short):
        before = (list(resp.have), list(resp.need), resp.done)
        with pytest.raises(RemoteProtocolError, match=r"too long|out of range"):
            resp.receive(done)
        assert (list(resp.have), list(resp.need), resp.done) == before
    assert read[0] == 0
