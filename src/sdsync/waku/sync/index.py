"""The items one reconciliation session compares: a frozen, sorted snapshot.

Theory of operation
-------------------
nwaku keeps its sync items in memory for the whole sync range and inserts every message
as it is archived. Here a session reads a *snapshot* of the archive instead — the rows
of its window, loaded once (:class:`ItemRows`, from the node's archive) — so that there
is no second copy of the archive to keep consistent across retention, restarts and
crashes: what a session sees is what the archive held when it began, and anything
archived meanwhile is the next round's.

A :class:`SyncIndex` is that snapshot restricted to the session's topics, sorted by
(timestamp, hash). Finding a range is two binary searches over 40-byte keys (the
timestamp big-endian, then the hash: byte order is item order). A range's fingerprint,
the XOR of its hashes, is one XOR of two prefix XORs — XOR undoes itself — so it costs
the same for ten items as for a million.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from sdsync.waku.sync.codec import ZERO_HASH, SyncId
from sdsync.wire.waku import HASH_SIZE

_KEY = np.dtype(f"S{8 + HASH_SIZE}")


@dataclass(frozen=True)
class ItemRows:
    """The archive's rows of a window, in (timestamp, hash) order, with their topics as
    codes into ``pubsub_names`` and ``content_names``."""

    times: npt.NDArray[np.int64]
    hashes: npt.NDArray[np.uint8]
    """``(n, 32)``."""
    pubsub: npt.NDArray[np.int32]
    content: npt.NDArray[np.int32]
    pubsub_names: Sequence[str] = ()
    content_names: Sequence[str] = ()

    def __len__(self) -> int:
        return len(self.times)

    @classmethod
    def of(cls, items: Sequence[tuple[SyncId, str, str]]) -> ItemRows:
        """Rows of ``(id, pubsub topic, content topic)``, sorted here (tests, benches)."""
        ordered = sorted(items)
        pubsub: dict[str, int] = {}
        content: dict[str, int] = {}
        return cls(
            np.array([i.time for i, _, _ in ordered], dtype=np.int64),
            np.frombuffer(b"".join(i.hash for i, _, _ in ordered), dtype=np.uint8).reshape(
                len(ordered), HASH_SIZE
            ),
            np.array([pubsub.setdefault(p, len(pubsub)) for _, p, _ in ordered], dtype=np.int32),
            np.array([content.setdefault(c, len(content)) for _, _, c in ordered], dtype=np.int32),
            list(pubsub),
            list(content),
        )

    def restricted(
        self, pubsub_topics: Collection[str], content_topics: Collection[str]
    ) -> SyncIndex:
        """The index of the rows on these topics (an empty collection: every topic)."""
        keep = np.ones(len(self), dtype=bool)
        for codes, names, wanted in (
            (self.pubsub, self.pubsub_names, pubsub_topics),
            (self.content, self.content_names, content_topics),
        ):
            if wanted:
                chosen = [code for code, name in enumerate(names) if name in wanted]
                keep &= np.isin(codes, np.array(chosen, dtype=np.int32))
        return SyncIndex(self.times[keep], self.hashes[keep])


@dataclass(frozen=True)
class SyncIndex:
    """Sorted items: ranges, fingerprints, item sets (see the module)."""

    times: npt.NDArray[np.int64]
    hashes: npt.NDArray[np.uint8]
    _keys: npt.NDArray[np.bytes_] = field(init=False, repr=False)
    _prefix: npt.NDArray[np.uint64] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        count = len(self.times)
        stamps = self.times.astype(">u8").view(np.uint8).reshape(count, 8)
        keys = np.ascontiguousarray(np.hstack([stamps, self.hashes])).view(_KEY).reshape(count)
        words = np.ascontiguousarray(self.hashes).view(np.uint64).reshape(count, HASH_SIZE // 8)
        prefix = np.zeros((count + 1, HASH_SIZE // 8), dtype=np.uint64)
        np.bitwise_xor.accumulate(words, axis=0, out=prefix[1:])
        object.__setattr__(self, "_keys", keys)
        object.__setattr__(self, "_prefix", prefix)

    @classmethod
    def of(cls, ids: Sequence[SyncId]) -> SyncIndex:
        return ItemRows.of([(i, "", "") for i in ids]).restricted((), ())

    def __len__(self) -> int:
        return len(self.times)

    def span(self, lower: SyncId, upper: SyncId) -> tuple[int, int]:
        """``(i, j)``: the items ``lower <= id <= upper`` are ``[i, j)``."""
        start = int(np.searchsorted(self._keys, _key(lower), side="left"))
        end = int(np.searchsorted(self._keys, _key(upper), side="right"))
        return start, max(start, end)

    def fingerprint(self, start: int, end: int) -> bytes:
        """The XOR of the hashes of items ``[start, end)``."""
        if start >= end:
            return ZERO_HASH
        return bytes((self._prefix[end] ^ self._prefix[start]).tobytes())

    def ids(self, start: int, end: int) -> list[SyncId]:
        times = self.times[start:end].tolist()
        blob = self.hashes[start:end].tobytes()
        return [SyncId(t, blob[k * HASH_SIZE : (k + 1) * HASH_SIZE]) for k, t in enumerate(times)]

    def hashes_of(self, start: int, end: int) -> list[bytes]:
        blob = self.hashes[start:end].tobytes()
        return [blob[k * HASH_SIZE : (k + 1) * HASH_SIZE] for k in range(end - start)]


def _key(item: SyncId) -> bytes:
    return item.time.to_bytes(8, "big") + item.hash
