"""Settings of Store Sync on a store node, with WAKU-STORE-SYNC's recommended defaults."""

from __future__ import annotations

from dataclasses import dataclass

from sdsync.errors import LocalProtocolError
from sdsync.reconcile import METHODS, Method

NS = 10**9


@dataclass(frozen=True)
class SyncConfig:
    interval_s: float | None = 300.0
    """Seconds between rounds with one random peer; None: never initiate."""
    method: Method = "riblt"
    """The method of the rounds we start (a peer without it is synced by RBSR): RIBLT, the
    fewest bytes and, with the node's symbol cache, the least time (docs/reconcile.md)."""
    window_s: float = 3_600.0
    """How far into the past a round reaches (before the lag)."""
    lag_s: float = 20.0
    """The newest seconds are left out: messages still in flight would show as differences."""
    serve: bool = True
    """Answer other nodes' syncs under ``/sync/``."""
    max_sessions: int = 4
    """Sessions a responder keeps open at once; more are refused (503)."""
    max_sessions_per_client: int = 2
    """Sessions one remote address may hold at once; more are refused (503)."""
    max_items: int = 2_000_000
    """Items held in all open sessions' snapshots together (112 bytes each; 240 while loading)."""
    idle_timeout_s: float = 30.0
    """A session that made no progress for this long is dropped (and a stream it is
    writing that the peer does not read is cancelled then)."""
    sessions_per_minute: float = 12.0
    """Sessions one remote address may open per minute, on average; more answer 429."""
    session_burst: int = 8
    """Sessions one remote address may open in a burst (a token bucket of this size)."""
    max_transfer_bytes: int = 256 * 1024 * 1024
    """Bytes of messages one session may push to the responder."""
    window_margin_s: float = 300.0
    """How much older than window_s + lag_s a peer's window may start (its own settings)."""
    clock_skew_s: float = 20.0
    """How far in the future a peer's window may end (nwaku's clock variance)."""
    pubsub_topics: tuple[str, ...] = ()
    """Topics pushes may carry; empty: the topics the archive already holds."""
    token: str | None = None
    """A shared secret every sync request must carry (and ours send) as a Bearer token."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise LocalProtocolError(f"unknown sync method {self.method!r}; use {tuple(METHODS)}")
        if self.interval_s is not None and self.interval_s <= 0:
            raise LocalProtocolError("the sync interval must be positive")
        if self.window_s <= 0 or self.lag_s < 0:
            raise LocalProtocolError("the sync window must be positive and the lag not negative")
        limits = (self.max_sessions, self.max_sessions_per_client, self.max_items)
        if min(limits) < 1 or self.idle_timeout_s <= 0 or self.max_transfer_bytes < 1:
            raise LocalProtocolError("responder limits must be positive")
        if self.sessions_per_minute <= 0 or self.session_burst < 1:
            raise LocalProtocolError("responder limits must be positive")
        if self.window_margin_s < 0 or self.clock_skew_s < 0:
            raise LocalProtocolError("the window margin and clock skew must not be negative")
        if self.token is not None and not self.token:
            raise LocalProtocolError("the sync token must not be empty")

    def window(self, now_ns: int) -> tuple[int, int]:
        """``[now - lag - window, now - lag)``: WAKU-STORE-SYNC's 1 h ending 20 s ago."""
        end = now_ns - round(self.lag_s * NS)
        return max(0, end - round(self.window_s * NS)), end
