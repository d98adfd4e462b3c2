from __future__ import annotations

import pytest

from sdsync.core.bloom import BloomFilter, BloomParams, RollingBloomFilter, contains
from sdsync.errors import LocalProtocolError
from sdsync.wire import message_id_for


def test_default_sizing_matches_js_waku() -> None:
    params = BloomParams()
    assert (params.k, params.m_bits, params.n_bytes) == (10, 150_000, 18_752)


def test_small_filter_bytes_match_waku_sds() -> None:
    # @waku/sds with capacity 4 / error 0.1 after inserting sha256("hello").
    params = BloomParams(4, 0.1)
    assert (params.k, params.m_bits, params.n_bytes) == (3, 20, 8)
    bloom = BloomFilter(params)
    bloom.insert(message_id_for(b"hello"))
    assert bloom.to_bytes().hex() == "0000000000008401"


def test_membership_has_no_false_negatives_and_few_false_positives() -> None:
    params = BloomParams(1_000, 0.01)
    bloom = BloomFilter(params)
    inserted = [f"in-{i}" for i in range(1_000)]
    for item in inserted:
        bloom.insert(item)
    assert all(item in bloom for item in inserted)
    strangers = sum(f"out-{i}" in bloom for i in range(10_000))
    assert strangers < 300  # ~1 % expected
    assert params.false_positive_rate(bloom.to_bytes()) < 0.03


def test_serialised_bytes_can_be_tested_without_parsing() -> None:
    params = BloomParams(100, 0.01)
    bloom = BloomFilter(params)
    bloom.insert("x")
    data = bloom.to_bytes()
    assert contains(data, params.positions("x"))
    assert BloomFilter(params, data).to_bytes() == data
    with pytest.raises(LocalProtocolError, match="expected"):
        BloomFilter(params, data[:-1])


def test_saturated_filter_reports_a_high_false_positive_rate() -> None:
    params = BloomParams()
    assert params.false_positive_rate(b"\xff" * params.n_bytes) == pytest.approx(1.0, rel=0.01)
    assert params.false_positive_rate(bytes(params.n_bytes)) == 0.0


def test_rollover_keeps_recent_ids_and_bounds_the_fill() -> None:
    params = BloomParams(100, 0.01)
    rolling = RollingBloomFilter(params)
    fixed = RollingBloomFilter(params, rollover=False)
    ids = [f"id-{i}" for i in range(1_000)]
    for item in ids:
        rolling.insert(item)
        fixed.insert(item)
    assert all(item in rolling for item in ids[-50:])
    assert params.false_positive_rate(rolling.to_bytes()) < 0.05
    assert params.false_positive_rate(fixed.to_bytes()) > 0.5
    assert len(rolling.to_bytes()) == params.n_bytes  # wire size never changes


@pytest.mark.parametrize(("capacity", "rate"), [(0, 0.1), (10, 0.0), (10, 1.0)])
def test_invalid_parameters_are_rejected(capacity: int, rate: float) -> None:
    with pytest.raises(LocalProtocolError):
        BloomParams(capacity, rate)


def test_filter_bytes_are_copied_once_per_change_and_never_stale() -> None:
    params = BloomParams(100, 0.01)
    rolling = RollingBloomFilter(params)
    empty = rolling.to_bytes()
    assert rolling.to_bytes() is empty  # unchanged: the same bytes again
    rolling.insert("x")
    after = rolling.to_bytes()
    assert after != empty and "x" in BloomFilter(params, after)
    assert empty == bytes(params.n_bytes)  # what was handed out never changes
    for i in range(params.capacity + 1):  # through a rollover
        rolling.insert(f"y{i}")
        assert f"y{i}" in BloomFilter(params, rolling.to_bytes())
