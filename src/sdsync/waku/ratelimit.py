"""Token buckets per peer: how much one remote peer may cost us per unit of time.

Theory of operation
-------------------
A :class:`RateLimit` is nwaku's ``volume/period`` (its ``--rate-limit lightpush:5/1s``):
a bucket holds at most ``volume`` tokens and refills at ``volume / period_s`` a second,
so a peer may spend ``volume`` at once and ``volume`` per period on average.  What a
token is belongs to the caller: a request (LightPush) or a byte (a relayed frame, a
store answer).

:class:`PeerBuckets` keeps one bucket per peer.  Nothing here reads a clock: every call
names ``now`` (seconds, any monotonic origin), so the same code runs on the asyncio
loop, on the trio thread and in tests.  Peer ids are the remote's choice, so the table
is bounded: when it holds ``max_peers`` buckets, the full ones are forgotten (a full
bucket is exactly a fresh one, so nothing is lost); if none is full, the new peer is
refused until one refills — a flood of fresh identities cannot grow the table, nor
reset its own buckets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sdsync.errors import LocalProtocolError

_SPEC = re.compile(
    r"\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)?\s*/\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*"
)
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_BYTES = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
DEFAULT_MAX_PEERS = 4096


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``volume`` tokens per ``period_s`` seconds, ``volume`` at most at once."""

    volume: float
    period_s: float

    def __post_init__(self) -> None:
        if self.volume <= 0 or self.period_s <= 0:
            raise LocalProtocolError(f"a rate limit needs a positive volume and period: {self}")

    @property
    def per_s(self) -> float:
        return self.volume / self.period_s

    @classmethod
    def parse(cls, spec: str) -> RateLimit | None:
        """nwaku's spelling, ``VOLUME/PERIOD<ms|s|m|h>`` (``5/1s``), a volume of bytes
        with a unit if wanted (``32MiB/16s``); ``0/…`` or ``off`` is no limit (None)."""
        if spec.strip().lower() in ("off", "none"):
            return None
        match = _SPEC.fullmatch(spec.lower())
        if match is None:
            raise LocalProtocolError(
                f"bad rate limit {spec!r}: expected VOLUME[KB|MB|GB|KiB|MiB|GiB]/PERIOD<ms|s|m|h>"
            )
        volume = float(match.group(1)) * _BYTES[match.group(2) or "b"]
        period = float(match.group(3)) * _UNIT_S[match.group(4)]
        return None if volume == 0 or period == 0 else cls(volume, period)

    def __str__(self) -> str:
        return f"{self.volume:g}/{self.period_s:g}s"


class TokenBucket:
    """One peer's bucket, full when made."""

    __slots__ = ("_at", "_tokens", "limit")

    def __init__(self, limit: RateLimit, now: float) -> None:
        self.limit = limit
        self._tokens = limit.volume
        self._at = now

    def tokens(self, now: float) -> float:
        elapsed = max(0.0, now - self._at)
        return min(self.limit.volume, self._tokens + elapsed * self.limit.per_s)

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Spend ``cost`` tokens if the bucket holds them; False (nothing spent) if not.
        A cost above ``volume`` is allowed from a full bucket, leaving it in debt, so
        one large item is never refused forever."""
        tokens = self.tokens(now)
        self._at = max(self._at, now)
        if tokens < min(cost, self.limit.volume):
            self._tokens = tokens
            return False
        self._tokens = tokens - cost
        return True

    def full(self, now: float) -> bool:
        return self.tokens(now) >= self.limit.volume

    def wait_s(self, now: float, cost: float = 1.0) -> float:
        """Seconds until the bucket holds ``cost`` tokens (0 if it does)."""
        short = min(cost, self.limit.volume) - self.tokens(now)
        return max(0.0, short / self.limit.per_s)


class PeerBuckets:
    """A :class:`TokenBucket` per peer under one :class:`RateLimit`, at most
    ``max_peers`` of them (see the module)."""

    def __init__(self, limit: RateLimit, *, max_peers: int = DEFAULT_MAX_PEERS) -> None:
        self.limit = limit
        self.max_peers = max_peers
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, peer: str, now: float, cost: float = 1.0) -> bool:
        """Spend ``cost`` of ``peer``'s tokens; False if it has not got them."""
        bucket = self._buckets.get(peer)
        if bucket is None:
            if len(self._buckets) >= self.max_peers:
                self._forget_full(now)
                if len(self._buckets) >= self.max_peers:
                    return False
            bucket = self._buckets[peer] = TokenBucket(self.limit, now)
        return bucket.take(now, cost)

    def wait_s(self, peer: str, now: float, cost: float = 1.0) -> float:
        """Seconds until ``peer`` may spend ``cost``: what a refusal's ``Retry-After``
        says.  A peer the full table has no room for waits for the first bucket to fill."""
        bucket = self._buckets.get(peer)
        if bucket is not None:
            return bucket.wait_s(now, cost)
        if len(self._buckets) < self.max_peers:
            return 0.0
        return min(b.wait_s(now, self.limit.volume) for b in self._buckets.values())

    def _forget_full(self, now: float) -> None:
        for peer in [p for p, b in self._buckets.items() if b.full(now)]:
            del self._buckets[peer]

    def __len__(self) -> int:
        return len(self._buckets)


#: Relay bytes per forwarding peer: 2 MiB/s, 32 MiB at once. Gossipsub brings a mesh's
#: traffic through a few peers, so this is far above an honest shard's (The Waku
#: Network's RLN allows a member a message per epoch) yet cuts one peer's flood of
#: 150-kB frames to ~14 a second.
DEFAULT_RELAY_RATE = RateLimit(32 * 2**20, 16.0)
