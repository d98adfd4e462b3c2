"""The decoder's cache of parsed history entries is bounded in bytes as well as entries.

Each test decodes under a WireLimits of its own, so it has a cache of its own.
"""

from __future__ import annotations

from sdsync.wire import HistoryEntry, Message, WireLimits, decode, encode
from sdsync.wire.codec import ENTRY_CACHE_BYTES, entry_cache_bytes

WIDE_ID = "€" * 255  # 765 bytes of UTF-8, within the 256-character limit


def message(n: int, entries: list[HistoryEntry]) -> Message:
    return Message("s", f"m{n}", "c", lamport_timestamp=n, causal_history=tuple(entries))


def test_entries_of_the_largest_size_never_hold_more_than_the_byte_bound() -> None:
    limits = WireLimits(max_causal_history=100)
    fresh = 0
    peak = 0
    for n in range(200):  # 20,000 entries of ~1.5 kB: 30 MB serialized without the bound
        entries = [
            HistoryEntry(f"{WIDE_ID}{fresh + i:08d}"[-255:], bytes(32), WIDE_ID) for i in range(100)
        ]
        fresh += 100
        decoded = decode(encode(message(n, entries)), limits)
        assert decoded.causal_history == tuple(entries)
        peak = max(peak, entry_cache_bytes(limits))
    assert 0 < peak <= ENTRY_CACHE_BYTES


def test_a_sliding_history_is_served_from_the_cache() -> None:
    limits = WireLimits(max_causal_history=300)
    history = [HistoryEntry(f"id-{i:04d}", bytes([i % 256]) * 32, "alice") for i in range(300)]
    first = decode(encode(message(1, history[:200])), limits)
    second = decode(encode(message(2, history[1:201])), limits)
    # The 199 entries both carry are the very objects parsed the first time.
    pairs = zip(first.causal_history[1:], second.causal_history[:-1], strict=True)
    assert all(a is b for a, b in pairs)
    assert second.causal_history == tuple(history[1:201])
    assert entry_cache_bytes(limits) == sum(len(e.to_bytes()) for e in history[:201])
