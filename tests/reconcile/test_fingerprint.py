"""The RBSR fingerprint (reference function shared by the store sync and the pipeline)."""

from __future__ import annotations

import hashlib
import random

import pytest

from sdsync.reconcile.fingerprint import (
    EMPTY_FINGERPRINT,
    MODULUS,
    fingerprint,
    fingerprint_of_sum,
    limbs,
    sum_from_limb_sums,
    summarize,
    varint,
)


def _hashes(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(32) for _ in range(n)]


def test_varint_is_negentropy_msb_first() -> None:
    assert varint(0) == b"\x00"
    assert varint(127) == b"\x7f"
    assert varint(128) == b"\x81\x00"
    assert varint(300) == b"\x82\x2c"
    assert varint(2**63 - 1) == bytes([0xFF] * 8 + [0x7F])
    with pytest.raises(ValueError):
        varint(-1)


def test_empty_set() -> None:
    expected = hashlib.sha256(bytes(32) + b"\x00").digest()[:16]
    assert fingerprint([]) == EMPTY_FINGERPRINT == expected
    assert len(EMPTY_FINGERPRINT) == 16


def test_definition_by_hand() -> None:
    a, b = bytes(31) + b"\x01", b"\xff" * 32  # a + b wraps to 0 mod 2**256
    assert summarize([a, b]) == (0, 2)
    assert fingerprint([a, b]) == hashlib.sha256(bytes(32) + b"\x02").digest()[:16]
    assert fingerprint([a, b]) != EMPTY_FINGERPRINT  # the count is part of it


def test_order_independent_and_mergeable() -> None:
    items = _hashes(200)
    shuffled = items[:]
    random.Random(2).shuffle(shuffled)
    assert fingerprint(items) == fingerprint(shuffled)
    (s1, n1), (s2, n2) = summarize(items[:70]), summarize(items[70:])
    assert fingerprint_of_sum(s1 + s2, n1 + n2) == fingerprint(items)


def test_multiset_counts_duplicates() -> None:
    items = _hashes(10)
    assert fingerprint(items + items[:1]) != fingerprint(items)


def test_equal_timestamps_do_not_matter_only_hashes_do() -> None:
    # Items are (timestamp, hash); two items with one timestamp are still two items.
    h1, h2 = _hashes(2, seed=3)
    assert fingerprint([h1, h2]) != fingerprint([h1])
    assert fingerprint([h1, h2]) != fingerprint([h2])


def test_xor_collisions_do_not_collide() -> None:
    # {a, b, a^b} XORs to zero, like the empty set, and {a} ^ {b, c, b^c} == {a}: an XOR
    # fingerprint cannot tell these sets apart; sum-then-hash does.
    a, b, c = _hashes(3, seed=4)
    xor = bytes(x ^ y for x, y in zip(a, b, strict=True))
    bc = bytes(x ^ y for x, y in zip(b, c, strict=True))
    assert fingerprint([a, b, xor]) != EMPTY_FINGERPRINT
    assert fingerprint([a, b, c, bc]) != fingerprint([a])
    # The same item twice XORs away; it does not add away.
    assert fingerprint([a, a]) != EMPTY_FINGERPRINT


def test_limbs_and_carries() -> None:
    items = _hashes(1000, seed=5)
    limb_sums = [sum(col) for col in zip(*(limbs(h) for h in items), strict=True)]
    assert sum_from_limb_sums(limb_sums) == summarize(items)[0]
    top = b"\xff" * 32
    assert (
        sum_from_limb_sums([sum(c) for c in zip(limbs(top), limbs(top), strict=True)])
        == (2 * int.from_bytes(top, "big")) % MODULUS
    )


def test_rejects_wrong_sizes() -> None:
    with pytest.raises(ValueError):
        fingerprint([b"short"])
    with pytest.raises(ValueError):
        sum_from_limb_sums([1, 2, 3])
