"""Range fingerprints for range-based set reconciliation (RBSR) between message stores.

Theory of operation
-------------------
Two stores hold sets of items ``(timestamp_ns, hash)`` (``hash`` is the 32-byte message
hash).  To find what one holds and the other lacks without sending every hash, they
compare *fingerprints* of time ranges and only descend into the ranges that differ.

A fingerprint must be

* **order independent and mergeable**: the fingerprint of a range is derived from a
  summary that is the sum of its parts, so the summary of a parent range is computed
  from its children without rescanning the items;
* **hard to forge**: nwaku's Waku Sync XORs the hashes, which is linear over GF(2): a
  hostile peer can pick a handful of fake hashes that cancel out any difference and make
  two different ranges look equal.

We use the negentropy construction (NIP-77): the summary of a set is
``(S, n)`` with ``S`` the sum of the hashes, each read as a 256-bit *big-endian*
unsigned integer, modulo 2**256, and ``n`` the number of items; the fingerprint is

    fingerprint = sha256( S as 32 bytes big-endian || varint(n) )[:16]

where ``varint`` is negentropy's: base 128, most significant group first, the high bit
set on every byte but the last.  Summaries add (``S`` mod 2**256, ``n`` as integers);
the hash on top means a forger would need a second preimage of the *sum*, and
``n`` stops padding attacks that add items summing to zero.

(Negentropy itself reads ids as little-endian integers; we read them big-endian so the
order of limbs matches the byte order of the hash. The two are not byte-compatible.)

Items with equal timestamps are distinct items as long as their hashes differ; a
multiset counts an item as often as it occurs, so a duplicated item changes the
fingerprint.

Limbs
-----
Engines without 256-bit integers (Spark) sum each hash as eight unsigned 32-bit limbs,
most significant first, in 64-bit accumulators; :func:`sum_from_limb_sums` then
carry-propagates those limb sums into ``S``.  With fewer than 2**31 items per range the
accumulators cannot overflow.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from sdsync.wire.waku import HASH_SIZE  # the items are Waku message hashes

FINGERPRINT_SIZE = 16
LIMBS = 8
LIMB_BITS = 32
MODULUS = 1 << 256
MAX_LIMB_ITEMS = (1 << 31) - 1
"""Most items a range may hold for 64-bit limb accumulators to be exact."""


def varint(value: int) -> bytes:
    """Negentropy's varint: base 128, most significant group first, high bit = more."""
    if value < 0:
        raise ValueError(f"varint of a negative number: {value}")
    groups = [value & 0x7F]
    value >>= 7
    while value:
        groups.append(0x80 | (value & 0x7F))
        value >>= 7
    return bytes(reversed(groups))


def fingerprint_of_sum(total: int, count: int) -> bytes:
    """Fingerprint of a set summarised by its hash sum (any int, reduced mod 2**256)."""
    if count < 0:
        raise ValueError(f"negative item count: {count}")
    data = (total % MODULUS).to_bytes(HASH_SIZE, "big") + varint(count)
    return hashlib.sha256(data).digest()[:FINGERPRINT_SIZE]


def summarize(hashes: Iterable[bytes]) -> tuple[int, int]:
    """The mergeable summary ``(sum mod 2**256, count)`` of a multiset of hashes."""
    total = 0
    count = 0
    for h in hashes:
        if len(h) != HASH_SIZE:
            raise ValueError(f"hash of {len(h)} bytes, expected {HASH_SIZE}")
        total += int.from_bytes(h, "big")
        count += 1
    return total % MODULUS, count


def fingerprint(hashes: Iterable[bytes]) -> bytes:
    """The 16-byte RBSR fingerprint of a multiset of 32-byte hashes."""
    return fingerprint_of_sum(*summarize(hashes))


def limbs(h: bytes) -> tuple[int, ...]:
    """The eight unsigned 32-bit big-endian limbs of a hash, most significant first."""
    if len(h) != HASH_SIZE:
        raise ValueError(f"hash of {len(h)} bytes, expected {HASH_SIZE}")
    return tuple(int.from_bytes(h[i : i + 4], "big") for i in range(0, HASH_SIZE, 4))


def sum_from_limb_sums(limb_sums: Sequence[int]) -> int:
    """Carry-propagate per-limb sums (most significant first) into the sum mod 2**256."""
    if len(limb_sums) != LIMBS:
        raise ValueError(f"{len(limb_sums)} limb sums, expected {LIMBS}")
    total = 0
    for s in limb_sums:
        total = (total << LIMB_BITS) + s
    return total % MODULUS


EMPTY_FINGERPRINT = fingerprint_of_sum(0, 0)
"""Fingerprint of the empty set: what a store reports for a range it holds nothing in."""
