"""Byte-level pieces of the reconciliation frames: varints, bounds, strict reading.

Theory of operation
-------------------
Varints are negentropy's (base 128, most significant group first, high bit = more), the
ones :func:`~sdsync.reconcile.fingerprint.varint` writes. A :class:`Reader` walks an
untrusted frame; running off its end, an overlong varint or a value out of range raises
:class:`~sdsync.errors.RemoteProtocolError` and nothing else.

A bound between two neighbouring items is as short as the order allows
(:func:`minimal_bound`): the later item's timestamp alone if the timestamps differ, else
that timestamp and the hash prefix one byte past the common prefix.
"""

from __future__ import annotations

from sdsync.errors import RemoteProtocolError
from sdsync.reconcile.items import Bound, Item
from sdsync.wire.waku import HASH_SIZE

MAX_VARINT_BYTES = 10


class Reader:
    """A cursor over an untrusted frame."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self._data = data
        self._pos = pos

    def __len__(self) -> int:
        """Bytes left to read."""
        return len(self._data) - self._pos

    @property
    def at_end(self) -> bool:
        return self._pos >= len(self._data)

    def byte(self) -> int:
        if self._pos >= len(self._data):
            raise RemoteProtocolError("frame ends early")
        value = self._data[self._pos]
        self._pos += 1
        return value

    def take(self, n: int) -> bytes:
        end = self._pos + n
        if end > len(self._data):
            raise RemoteProtocolError(f"frame ends early: wanted {n} bytes")
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def varint(self, limit: int = 1 << 64) -> int:
        """A varint ``< limit``."""
        value = 0
        for _ in range(MAX_VARINT_BYTES):
            b = self.byte()
            value = (value << 7) | (b & 0x7F)
            if not b & 0x80:
                if value >= limit:
                    raise RemoteProtocolError(f"value {value} out of range (< {limit})")
                return value
        raise RemoteProtocolError("varint longer than 10 bytes")


def minimal_bound(prev: Item | Bound, item: Item) -> Bound:
    """The shortest bound ``b`` with ``prev < b <= item`` (``prev`` strictly below ``item``)."""
    ts, h = item
    if prev[0] != ts:
        return ts, b""
    shared = 0
    other = prev[1]
    while shared < min(len(other), HASH_SIZE) and other[shared] == h[shared]:
        shared += 1
    return ts, h[: shared + 1]
