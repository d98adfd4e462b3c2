"""The redial policy (transport/redial.py): backoff from min to max and back on success,
one line per change (never one per dial), and the identity that answered instead of the
one dialled, found however deep py-libp2p wraps it."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from sdsync.transport.redial import Redial, answered_as

PEER = "16Uiu2HAmOld"
NEW = "16Uiu2HAmNew"


class MultiError(Exception):
    """py-libp2p's shape: one failure per address dialled, in ``errors``."""

    def __init__(self, errors: list[Exception]) -> None:
        super().__init__(errors)
        self.errors = errors


def mismatch(answered: str) -> Exception:
    """A dial refused the way py-libp2p refuses it when the key at the address is another
    node's: the Noise failure three wrappers deep, under a message that does not say it."""
    noise = Exception(
        f"peer id does not correspond: remote_peer={PEER}, remote_peer_id_from_pubkey={answered}"
    )
    try:
        try:
            raise RuntimeError("handshake failed when upgrading") from noise
        except RuntimeError as upgrade:
            raise ConnectionError("failed to upgrade security") from upgrade
    except ConnectionError as swarm:
        outer = OSError("unable to connect, no addresses established a successful connection")
        outer.__cause__ = MultiError([swarm])
        return outer


def test_the_delay_doubles_to_the_cap_and_starts_over_once_connected() -> None:
    redial = Redial(1.0, 8.0)
    now, waits = 0.0, []
    for _ in range(6):
        assert redial.due(PEER, now)
        redial.failed(PEER, now, OSError("refused"))
        start = now
        while not redial.due(PEER, now):
            now += 0.25
        waits.append(now - start)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    redial.connected(PEER, now)
    redial.failed(PEER, now, OSError("refused"))
    assert not redial.due(PEER, now + 0.75) and redial.due(PEER, now + 1.0)


def test_one_line_per_outage_and_one_when_it_ends() -> None:
    redial = Redial(1.0, 8.0)
    first = redial.failed(PEER, 0.0, OSError("Connection refused"))
    assert first == f"cannot reach peer {PEER} (Connection refused); redialling every 8 s at most"
    assert [redial.failed(PEER, float(t), OSError("x")) for t in range(1, 20)] == [None] * 19
    assert redial.connected(PEER, 42.5) == f"reached peer {PEER} again after 42.5 s"
    assert redial.connected(PEER, 43.0) is None  # still connected: nothing new
    assert redial.failed(PEER, 50.0, OSError("reset")) is not None  # a new outage


def test_a_peer_first_reached_says_nothing() -> None:
    assert Redial(1.0, 8.0).connected(PEER, 3.0) is None


def test_another_identity_at_the_address_is_said_once_per_identity() -> None:
    redial = Redial(1.0, 8.0)
    line = redial.failed(PEER, 0.0, mismatch(NEW))
    assert line is not None and f"expected peer {PEER} but {NEW} answered" in line
    assert redial.failed(PEER, 1.0, mismatch(NEW)) is None
    assert redial.failed(PEER, 2.0, OSError("refused")) is None  # the outage was said
    third = redial.failed(PEER, 3.0, mismatch("16Uiu2HAmThird"))
    assert third is not None and "16Uiu2HAmThird answered" in third


def test_the_answering_identity_is_found_in_causes_groups_and_errors() -> None:
    assert answered_as(mismatch(NEW)) == NEW
    grouped = ExceptionGroup("dials", [ValueError("x"), mismatch(NEW)])
    assert answered_as(grouped) == NEW
    assert answered_as(OSError("Connection refused")) is None
    looped = OSError("a")
    looped.__context__ = looped  # a cycle must not hang the search
    assert answered_as(looped) is None


@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 30.0)), max_size=60))
def test_whatever_happens_retries_stay_within_bounds_and_lines_alternate(
    events: list[tuple[bool, float]],
) -> None:
    """Failures and connections in any order at any pace: every retry is between min and
    max after its failure, and the lines alternate "cannot reach" / "reached again"."""
    redial = Redial(0.5, 8.0)
    now, said = 0.0, []
    for connected, pause in events:
        now += pause
        if connected:
            line = redial.connected(PEER, now)
        else:
            line = redial.failed(PEER, now, OSError("refused"))
            assert not redial.due(PEER, now + 0.49) and redial.due(PEER, now + 8.0)
        if line is not None:
            said.append(line.split()[0])
    assert all(a != b for a, b in itertools.pairwise(said))
    assert not said or said[0] == "cannot"
