"""Handshake slots shared fairly (issue 38, attack 2): a handful of addresses, each within
its per-IP connection limit, can no longer hold every slot; and when all are taken, an
honest newcomer takes the slot of a handshake that has stalled."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sdsync.transport.handshakes import HandshakeSlots, Slot


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_fourteen_addresses_of_five_sockets_leave_room_for_honest_dials() -> None:
    clock = Clock()
    slots = HandshakeSlots(64, 4, clock=clock)
    taken = [slots.take(f"127.0.0.{2 + i // 5}", lambda: None) for i in range(70)]
    refused = [t for t in taken if isinstance(t, str)]
    assert len(refused) == 14 and set(refused) == {"pending handshakes per IP"}
    assert len(slots) == 56  # 14 × 4: 8 slots free for everyone else
    assert isinstance(slots.take("127.0.0.250", lambda: None), Slot)


def test_a_full_table_gives_a_stalled_slot_to_a_newcomer() -> None:
    clock = Clock()
    cancelled: list[str] = []
    slots = HandshakeSlots(8, 4, clock=clock)
    for i in range(8):  # 8 addresses, one stalled handshake each
        slots.take(f"10.0.0.{i}", lambda i=i: cancelled.append(f"10.0.0.{i}"))
        clock.now += 0.01
    assert slots.take("10.9.9.9", lambda: None) == "pending handshakes"  # none stalled yet
    clock.now = 1.5
    honest = slots.take("10.9.9.9", lambda: None)
    assert isinstance(honest, Slot)
    assert cancelled == ["10.0.0.0"] and slots.evicted == 1  # the oldest gave way
    slots.release(honest)
    assert len(slots) == 7


def test_the_address_holding_most_gives_way_first() -> None:
    clock = Clock()
    cancelled: list[str] = []
    slots = HandshakeSlots(4, 4, clock=clock)
    slots.take("10.0.0.1", lambda: cancelled.append("one"))
    for _ in range(3):
        slots.take("10.0.0.2", lambda: cancelled.append("many"))
    clock.now = 5.0
    assert isinstance(slots.take("10.0.0.3", lambda: None), Slot)
    assert cancelled == ["many"] and slots.held_by("10.0.0.2") == 2


def test_exempt_addresses_are_not_held_to_their_share() -> None:
    slots = HandshakeSlots(64, 4, frozenset({"127.0.0.1"}), clock=Clock())
    assert all(isinstance(slots.take("127.0.0.1", lambda: None), Slot) for _ in range(10))


@given(
    st.lists(
        st.tuples(
            st.integers(0, 20),  # address
            st.booleans(),  # a handshake ends (the oldest of that address) or starts
            st.floats(0.0, 0.6),  # time step
        ),
        max_size=400,
    )
)
def test_bounds_hold_and_a_newcomer_waits_only_while_all_are_young(
    steps: list[tuple[int, bool, float]],
) -> None:
    clock = Clock()
    slots = HandshakeSlots(16, 3, clock=clock)
    held: dict[str, list[Slot]] = {}
    cancelled: list[Slot] = []
    for address, ends, step in steps:
        clock.now += step
        ip = f"10.0.0.{address}"
        if ends and held.get(ip):
            slots.release(held[ip].pop(0))
            continue
        young = all(clock.now - s.started < 1.0 for s in (x for v in held.values() for x in v))
        full = len(slots) >= 16
        before = slots.held_by(ip)

        box: list[Slot] = []  # the slot, once taken: what its cancel names
        taken = slots.take(ip, lambda box=box: cancelled.extend(box))
        if isinstance(taken, Slot):
            box.append(taken)
            held.setdefault(ip, []).append(taken)
            for gone in cancelled:
                for slots_of in held.values():
                    if gone in slots_of:
                        slots_of.remove(gone)
            cancelled.clear()
        else:
            assert before >= 3 or (full and young), (taken, before, full, young)
        assert len(slots) <= 16
        assert all(slots.held_by(f"10.0.0.{a}") <= 3 for a in range(21))
        assert len(slots) == sum(len(v) for v in held.values())
