"""SDS-R buffers: both stay within RepairConfig.buffer_size, evict the right entry, and an
evicted entry is neither asked for nor answered.

The rule (js-waku's too): a full buffer drops the entry it holds with the *latest* due
time, then takes the new one. Due times are computed here from REFERENCE §3's formulas
with hashlib, not with sdsync's own helpers, so a wrong schedule fails these tests too.
"""

from __future__ import annotations

import hashlib

from sdsync.core import ChannelConfig, MessageChannel, RepairConfig
from sdsync.core.repair import RepairState
from sdsync.wire import HistoryEntry, Message, decode, encode

START = 1_000_000
REPAIR = RepairConfig(t_min_ms=1_000, t_max_ms=10_000, buffer_size=3)


def h(text: str) -> int:
    """REFERENCE §3: the first 8 bytes of sha256, big-endian."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def t_req(config: RepairConfig, pid: str, mid: str, now: int) -> int:
    return now + h(pid + mid) % (config.t_max_ms - config.t_min_ms) + config.t_min_ms


def t_resp(config: RepairConfig, pid: str, sender: str, mid: str, now: int) -> int:
    return now + ((h(pid) ^ h(sender)) * h(mid)) % config.t_max_ms


class BufferModel:
    """What a capped buffer must hold: on add when full, drop the latest-due entry held."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.due: dict[str, int] = {}
        self.evicted: list[str] = []

    def add(self, mid: str, due: int) -> None:
        if mid in self.due:
            return
        if len(self.due) >= self.capacity:
            latest = max(self.due, key=lambda m: (self.due[m], m))
            del self.due[latest]
            self.evicted.append(latest)
        self.due[mid] = due


def test_request_buffer_never_exceeds_its_cap_and_drops_the_latest_due() -> None:
    state = RepairState(REPAIR, "me")
    model = BufferModel(REPAIR.buffer_size)
    for i in range(40):
        now, mid = START + 250 * i, f"gap-{i}"
        state.mark_missing(HistoryEntry(mid, sender_id="alice"), now)
        model.add(mid, t_req(REPAIR, "me", mid, now))
        assert len(state.requests) <= REPAIR.buffer_size
        assert sorted(state.requests.ids()) == sorted(model.due)
        assert all(state.requests.get(m)[1] == due for m, due in model.due.items())  # type: ignore[index]
    assert len(model.evicted) == 40 - REPAIR.buffer_size


def test_response_buffer_never_exceeds_its_cap_and_drops_the_latest_due() -> None:
    state = RepairState(REPAIR, "me")
    model = BufferModel(REPAIR.buffer_size)
    for i in range(40):
        now, mid, sender = START + 100 * i, f"msg-{i}", f"sender-{i % 7}"
        assert state.schedule_response(HistoryEntry(mid, sender_id=sender), now)
        model.add(mid, t_resp(REPAIR, "me", sender, mid, now))
        assert len(state.responses) <= REPAIR.buffer_size
        assert sorted(state.responses.ids()) == sorted(model.due)
    assert len(model.evicted) == 40 - REPAIR.buffer_size


def test_a_repeated_entry_evicts_nothing() -> None:
    state = RepairState(REPAIR, "me")
    entries = [HistoryEntry(f"gap-{i}", sender_id="alice") for i in range(REPAIR.buffer_size)]
    for entry in entries:
        state.mark_missing(entry, START)
    due = {e.message_id: state.requests.get(e.message_id) for e in entries}
    state.mark_missing(entries[0], START + 5_000)  # already asked for: kept as scheduled
    assert {e.message_id: state.requests.get(e.message_id) for e in entries} == due


def test_request_again_fills_free_room_only() -> None:
    state = RepairState(REPAIR, "me")
    held = [HistoryEntry(f"held-{i}", sender_id="a") for i in range(REPAIR.buffer_size)]
    for entry in held:
        state.mark_missing(entry, START)
    more = [HistoryEntry(f"more-{i}", sender_id="a") for i in range(5)]
    state.request_again(more, START)
    assert sorted(state.requests.ids()) == sorted(e.message_id for e in held)
    state.mark_received(held[0].message_id)
    state.request_again(more, START)
    assert sorted(state.requests.ids()) == sorted([e.message_id for e in held[1:]] + ["more-0"])


def channel(pid: str, config: RepairConfig = REPAIR) -> MessageChannel:
    return MessageChannel("c", pid, now_ms=START, config=ChannelConfig(repair=config))


def content(sender: str, mid: str, lamport: int, **fields: object) -> bytes:
    return encode(Message(sender, mid, "c", lamport, content=mid.encode(), **fields))  # type: ignore[arg-type]


def asked_for(out_data: bytes) -> list[str]:
    return [r.message_id for r in decode(out_data).repair_request]


def test_an_evicted_request_is_never_asked_for_until_room_frees() -> None:
    me = channel("me")
    gaps = [HistoryEntry(f"gap-{i}", sender_id="alice") for i in range(5)]
    me.receive(content("bob", "waiting", START, causal_history=tuple(gaps)), START)
    model = BufferModel(REPAIR.buffer_size)
    for entry in gaps:
        model.add(entry.message_id, t_req(REPAIR, "me", entry.message_id, START))
    assert len(model.evicted) == 2
    # Every gap is still known missing (stores are asked for all of them) ...
    assert sorted(e.message_id for e in me.sweep_incoming(START).missing) == sorted(
        e.message_id for e in gaps
    )
    # ... but SDS-R asks only for what its buffer kept, now and after re-arming.
    asked: set[str] = set()
    now = max(model.due.values())
    for _ in range(3):
        sync = me.send_sync(now)
        assert sync is not None
        asked.update(asked_for(sync.data))
        me.sweep_incoming(now)  # buffer full: nothing re-armed
        now += REPAIR.t_max_ms
    assert asked == set(model.due)
    # One kept gap arrives: its slot goes to a gap that was evicted, on the next sweep.
    arrived = min(model.due)
    me.receive(content("alice", arrived, START + 1), now)
    me.sweep_incoming(now)
    rearmed = {m for m in model.evicted if me.repair_schedule(m)[0] is not None}
    assert len(rearmed) == 1
    late = now + REPAIR.t_max_ms
    sync = me.send_sync(late)
    assert sync is not None and rearmed <= set(asked_for(sync.data))


def test_an_evicted_response_is_never_rebroadcast() -> None:
    me = channel("me")
    held = [f"held-{i}" for i in range(5)]
    wires = {}
    for i, mid in enumerate(held):
        wires[mid] = content("alice", mid, START + i)
        me.receive(wires[mid], START)
    assert me.log_ids() == held
    requests = [HistoryEntry(mid, sender_id="alice") for mid in held]
    model = BufferModel(REPAIR.buffer_size)
    now = START + 50
    # Two carriers: at most three requests ride on one message.
    for n, batch in enumerate((tuple(requests[:3]), tuple(requests[3:]))):
        me.receive(content("asker", f"carrier-{n}", now, repair_request=batch), now)
        for entry in batch:
            model.add(entry.message_id, t_resp(REPAIR, "me", "alice", entry.message_id, now))
    assert len(model.evicted) == 2
    for mid in held:
        scheduled = me.repair_schedule(mid)[1]
        assert (scheduled is not None) == (mid in model.due), mid
    sweep = me.sweep_repair(now + REPAIR.t_max_ms)
    assert sorted(e.message_id for e in sweep.events) == sorted(model.due)
    assert sorted(sweep.data) == sorted(wires[mid] for mid in model.due)
    assert me.sweep_repair(now + 10 * REPAIR.t_max_ms).data == []
