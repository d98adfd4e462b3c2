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

Peer ids cost nothing to make, addresses do.  Given a ``per_address`` limit, the buckets
also keep one bucket per remote *address* — an IPv4 address, or an IPv6 address's /64,
the block one subscriber is usually given (:func:`address_key`) — and a cost is spent only
if both the peer's bucket and its address's hold it: the identities seen from one address
share its budget, and each one's share is its own bucket inside it.  The address table is
bounded as the peer table is.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

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

    def holds(self, now: float, cost: float = 1.0) -> bool:
        """Whether :meth:`take` would spend ``cost`` now."""
        return self.tokens(now) >= min(cost, self.limit.volume)

    def full(self, now: float) -> bool:
        return self.tokens(now) >= self.limit.volume

    def wait_s(self, now: float, cost: float = 1.0) -> float:
        """Seconds until the bucket holds ``cost`` tokens (0 if it does)."""
        short = min(cost, self.limit.volume) - self.tokens(now)
        return max(0.0, short / self.limit.per_s)


Refusal = Literal["peer", "address", "table"]
"""Why a cost was refused: the peer's bucket, its address's, or a full table."""


def address_key(ip: str) -> str:
    """The budget ``ip`` counts against: an IPv4 address itself (also written as IPv6),
    an IPv6 address's /64."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class PeerBuckets:
    """A :class:`TokenBucket` per peer under one :class:`RateLimit`, and with
    ``per_address``, one per remote address too; at most ``max_peers`` of each (see the
    module)."""

    def __init__(
        self,
        limit: RateLimit,
        *,
        per_address: RateLimit | None = None,
        max_peers: int = DEFAULT_MAX_PEERS,
    ) -> None:
        self.limit = limit
        self.per_address = per_address
        self.max_peers = max_peers
        self._buckets: dict[str, TokenBucket] = {}
        self._addresses: dict[str, TokenBucket] = {}

    @classmethod
    def of(cls, per_peer: RateLimit | None, per_address: RateLimit | None) -> PeerBuckets | None:
        """Buckets for these limits, None for neither; with a per-address limit alone,
        one peer may use all of its address's."""
        limit = per_peer or per_address
        return None if limit is None else cls(limit, per_address=per_address)

    def take(self, peer: str, now: float, cost: float = 1.0, *, address: str | None = None) -> bool:
        """Spend ``cost`` of ``peer``'s tokens (and its address's); False if not there."""
        return self.refusal(peer, now, cost, address=address) is None

    def refusal(
        self, peer: str, now: float, cost: float = 1.0, *, address: str | None = None
    ) -> Refusal | None:
        """Spend ``cost`` of ``peer``'s tokens and of its ``address``'s (its IP, when
        known); or, spending nothing, say which bucket lacks them."""
        own = self._bucket(self._buckets, peer, self.limit, now)
        shared = None
        if self.per_address is not None and address:
            shared = self._bucket(self._addresses, address_key(address), self.per_address, now)
        if own is None or (shared is None and self.per_address is not None and address):
            return "table"
        if not own.holds(now, cost):
            return "peer"
        if shared is not None and not shared.holds(now, cost):
            return "address"
        own.take(now, cost)
        if shared is not None:
            shared.take(now, cost)
        return None

    def wait_s(
        self, peer: str, now: float, cost: float = 1.0, *, address: str | None = None
    ) -> float:
        """Seconds until ``peer`` may spend ``cost``: what a refusal's ``Retry-After``
        says.  A peer the full table has no room for waits for the first bucket to fill."""
        waits = [self._wait_s(self._buckets, peer, self.limit, now, cost)]
        if self.per_address is not None and address:
            key = address_key(address)
            waits.append(self._wait_s(self._addresses, key, self.per_address, now, cost))
        return max(waits)

    def _bucket(
        self, table: dict[str, TokenBucket], key: str, limit: RateLimit, now: float
    ) -> TokenBucket | None:
        bucket = table.get(key)
        if bucket is None:
            if len(table) >= self.max_peers:
                for full in [k for k, b in table.items() if b.full(now)]:
                    del table[full]
                if len(table) >= self.max_peers:
                    return None
            bucket = table[key] = TokenBucket(limit, now)
        return bucket

    def _wait_s(
        self, table: dict[str, TokenBucket], key: str, limit: RateLimit, now: float, cost: float
    ) -> float:
        bucket = table.get(key)
        if bucket is not None:
            return bucket.wait_s(now, cost)
        if len(table) < self.max_peers:
            return 0.0
        return min(b.wait_s(now, limit.volume) for b in table.values())

    def __len__(self) -> int:
        return len(self._buckets)


#: Relay bytes per forwarding peer: 2 MiB/s, 32 MiB at once. Gossipsub brings a mesh's
#: traffic through a few peers, so this is far above an honest shard's (The Waku
#: Network's RLN allows a member a message per epoch) yet cuts one peer's flood of
#: 150-kB frames to ~14 a second.
DEFAULT_RELAY_RATE = RateLimit(32 * 2**20, 16.0)
#: Relay bytes all the peers seen from one IP address (one IPv6 /64) may bring together:
#: two peers' worth, so fresh identities from one address gain nothing.
DEFAULT_RELAY_RATE_PER_IP = RateLimit(64 * 2**20, 16.0)
