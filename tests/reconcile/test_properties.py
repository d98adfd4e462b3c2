"""Every method of the table finds exactly A∖B and B∖A, on both sides, for any sets and
windows."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reconcile_sets import item_sets, split_sets

from sdsync.reconcile import (
    METHODS,
    Item,
    MemoryItemStore,
    Method,
    ProllyParams,
    RbsrParams,
    RibltParams,
    reconcile_in_memory,
)

# Small parameters make small sets take many steps; a method without an entry runs with
# its defaults.
_tuning = st.fixed_dictionaries(
    {
        "rbsr": st.builds(RbsrParams, st.integers(2, 5), st.integers(1, 4)),
        "prolly": st.builds(ProllyParams, st.integers(2, 5)),
        "riblt": st.builds(RibltParams, st.integers(1, 8), st.integers(1, 8)),
        "max_frame_size": st.sampled_from([1024, 1 << 20]),
    }
)


def _check(a: frozenset[Item], b: frozenset[Item], method: Method, **kwargs: Any) -> None:
    window = kwargs.pop("window", (0, None))
    start, end = window
    inside = {it for it in a | b if it[0] >= start and (end is None or it[0] < end)}
    result = reconcile_in_memory(
        MemoryItemStore(a), MemoryItemStore(b), method, window=window, **kwargs
    )
    assert sorted(result.have) == sorted((a - b) & inside)
    assert sorted(result.need) == sorted((b - a) & inside)
    assert sorted(result.peer_have) == sorted(result.need)
    assert sorted(result.peer_need) == sorted(result.have)


@pytest.mark.parametrize("method", METHODS)
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(common=item_sets, only_a=item_sets, only_b=item_sets, tuning=_tuning)
def test_exact_difference_both_ways(
    method: Method,
    common: frozenset[Item],
    only_a: frozenset[Item],
    only_b: frozenset[Item],
    tuning: dict[str, Any],
) -> None:
    _check(common | only_a, (common | only_b) - (only_a - common), method, **tuning)


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    a=item_sets,
    b=item_sets,
    start=st.integers(0, 12),
    length=st.one_of(st.none(), st.integers(1, 12)),
)
def test_windowed_sync_sees_only_the_window(
    method: Method, a: frozenset[Item], b: frozenset[Item], start: int, length: int | None
) -> None:
    window = (start, None if length is None else start + length)
    _check(a, b, method, window=window, rbsr=RbsrParams(3, 2), prolly=ProllyParams(3))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("n", "only_a", "only_b"),
    [(0, 0, 0), (0, 40, 0), (0, 0, 40), (300, 0, 0), (0, 200, 300), (2000, 30, 30)],
    ids=["empty", "a-only", "b-only", "identical", "disjoint", "few-diffs"],
)
def test_named_cases(method: Method, n: int, only_a: int, only_b: int) -> None:
    a, b = split_sets(n, only_a, only_b, seed=n + only_a)
    _check(frozenset(a), frozenset(b), method)


@pytest.mark.parametrize("method", METHODS)
def test_identical_sets_settle_at_the_first_answer(method: Method) -> None:
    """One round trip; a streaming method's initiator still answers the stream it decoded
    (the responder streams before it can learn that nothing differs)."""
    a, _ = split_sets(5000, 0, 0, seed=9)
    result = reconcile_in_memory(MemoryItemStore(a), MemoryItemStore(a), method)
    assert result.frames == 2 + METHODS[method].streaming
    assert not result.have and not result.need


@pytest.mark.parametrize("method", METHODS)
def test_small_frames_still_reach_the_exact_answer(method: Method) -> None:
    a, b = split_sets(20_000, 150, 150, seed=11, spread=5000)
    result = reconcile_in_memory(
        MemoryItemStore(a), MemoryItemStore(b), method, max_frame_size=4096
    )
    assert sorted(result.have) == sorted(a - b)
    assert sorted(result.need) == sorted(b - a)
    assert sorted(result.peer_have) == sorted(b - a)
    big = reconcile_in_memory(MemoryItemStore(a), MemoryItemStore(b), method)
    # The limit did bite: more turns, or (a streaming method) more frames in a turn.
    assert result.frames + result.streamed > big.frames + big.streamed


def test_rbsr_beats_sending_everything() -> None:
    a, b = split_sets(50_000, 10, 10, seed=12)
    result = reconcile_in_memory(MemoryItemStore(a), MemoryItemStore(b), "rbsr")
    assert sorted(result.have) == sorted(a - b)
    assert result.bytes_a_to_b + result.bytes_b_to_a < 50_000 * 32 // 20
