"""Timing policy of a reliable channel: when to sync, resend, sweep, query stores and
catch up from them."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sdsync.errors import LocalProtocolError


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Defaults follow the ReliableChannel of js-waku; resends add backoff and jitter."""

    sync_interval_ms: int = 30_000
    resend_interval_ms: int = 30_000
    # Possibly acknowledged messages are likely delivered: resend them less eagerly.
    resend_possibly_acknowledged_ms: int = 90_000
    resend_backoff: float = 2.0
    max_resend_interval_ms: int = 600_000
    resend_jitter: float = 0.2
    max_attempts: int = 10
    incoming_sweep_ms: int = 5_000
    store_query_ms: int = 10_000
    # js-waku redraws uniform(0, interval) after a received sync, so a group of n still
    # syncs about every interval / n. Waiting a full interval first (then the random draw)
    # lets one sync serve everyone: in the simulator (30 participants, 20 % loss, 3 seeds)
    # 45 % fewer syncs and 30 % fewer bytes per message at the same time to consistency.
    suppress_sync_after_received_sync: bool = True
    # js-waku lets a received sync defer even the sync that acknowledges content we just
    # delivered; we keep that one due until a message (ours, or another participant's
    # naming the content) acknowledged it (SyncTimer). True restores js-waku's policy, for
    # comparison (bench/sync_policy.py).
    defer_owed_acknowledgements: bool = False
    # Large groups: the sync interval grows with the group, max(sync_interval_ms,
    # sync_ms_per_participant × participants), once the application says how many there
    # are (ChannelDriver / ReliableChannel.set_participant_count, as SDS-R's response
    # groups need too). 0 keeps it fixed, as js-waku does. Every sync carries a full bloom
    # filter to every member: the simulator's groups of 100 to 10,000 run with 600
    # (docs/evidence.md), and the lean profile sets it.
    sync_ms_per_participant: int = 0
    # Store catch-up (with a store configured): every interval, ask it for everything on
    # the channel's content topic since the last catch-up; on start, for the time away, at
    # most max_window back. The start of each window reaches margin further back: a
    # sender's clock behind ours, or a message reaching the store after our last query,
    # puts messages before the previous window's end (nwaku accepts timestamps up to 20 s
    # ahead of its clock, so 20 s covers the skews a store lets through the other way).
    # The interval: docs/evidence.md, sweep "catch-up interval" (a listing costs about 37
    # bytes a hash, so shorter intervals mostly cost round trips and buy a shorter tail).
    store_catchup: bool = True
    store_catchup_interval_ms: int = 300_000
    store_catchup_max_window_ms: int = 6 * 3_600_000
    store_catchup_margin_ms: int = 20_000
    # Messages per page; a store answers at most 100 (nwaku's maximum) whatever is asked.
    store_catchup_page_size: int = 100
    # A catch-up first asks for the window's message hashes only, then fetches the ones
    # this channel has not seen (heard live, or sent): the envelope hashes it remembers,
    # oldest forgotten first. Forgetting costs bytes (a message fetched again), never
    # correctness; 10,000 hashes are about 1 MB.
    store_catchup_seen_hashes: int = 10_000

    def __post_init__(self) -> None:
        positive = (
            self.sync_interval_ms,
            self.resend_interval_ms,
            self.resend_possibly_acknowledged_ms,
            self.max_resend_interval_ms,
            self.incoming_sweep_ms,
            self.store_query_ms,
            self.max_attempts,
            self.store_catchup_interval_ms,
            self.store_catchup_max_window_ms,
            self.store_catchup_page_size,
            self.store_catchup_seen_hashes,
        )
        if min(positive) <= 0:
            raise LocalProtocolError(
                "runtime intervals, windows, page sizes and max_attempts must be positive"
            )
        if self.sync_ms_per_participant < 0:
            raise LocalProtocolError("sync_ms_per_participant must be >= 0")
        if self.store_catchup_margin_ms < 0:
            raise LocalProtocolError("store_catchup_margin_ms must be >= 0")
        if self.resend_backoff < 1.0 or not 0.0 <= self.resend_jitter < 1.0:
            raise LocalProtocolError("resend_backoff must be >= 1 and resend_jitter in [0, 1)")

    def resend_delay(self, attempts: int, possibly_acknowledged: bool, rng: random.Random) -> int:
        """Wait before attempt ``attempts + 1``: exponential backoff with jitter."""
        base = (
            self.resend_possibly_acknowledged_ms
            if possibly_acknowledged
            else self.resend_interval_ms
        )
        delay = min(base * self.resend_backoff ** (attempts - 1), self.max_resend_interval_ms)
        jitter = rng.uniform(1.0 - self.resend_jitter, 1.0 + self.resend_jitter)
        return max(1, int(delay * jitter))

    def sync_interval_for(self, participants: int | None) -> int:
        """The sync interval in a group of ``participants`` (None: unknown)."""
        if participants is None:
            return self.sync_interval_ms
        return max(self.sync_interval_ms, self.sync_ms_per_participant * participants)


class SyncTimer:
    """js-waku's randomized sync backoff: uniform in [0, interval * m].

    m is 2 after our own sync (someone else will probably sync first next time), 1 after
    our own content or a received sync, and 0.5 after received content (acknowledge soon).
    With ``suppress`` a received sync first defers ours by one full interval.

    Unlike js-waku, a received sync never defers an acknowledgement we owe (the channel's
    ``acknowledgements_owed``): once we delivered content, the sync due then stays due
    (``owed_ms``) until a message of ours goes out, or until messages of others have named
    everything we owe in their causal histories (its senders heard those too).
    Otherwise, in a group whose others keep syncing, each of their syncs pushed ours back
    again, and a sender waited for its acknowledgement as long as they talked (issue 39: a
    chat that left before it was acknowledged) — and without the second way out, every
    recipient of a message synced within half an interval, though one sync acknowledged it
    for all (76 % more bytes in a group of 50).
    """

    __slots__ = ("due_ms", "interval_ms", "owed_ms", "rng", "suppress")

    def __init__(
        self, interval_ms: int, rng: random.Random, now_ms: int, *, suppress: bool = True
    ) -> None:
        self.interval_ms = interval_ms
        self.rng = rng
        self.suppress = suppress
        self.owed_ms: int | None = None
        self.due_ms = now_ms
        self.reset(now_ms, 1.0)

    def reset(self, now_ms: int, multiplier: float) -> None:
        self.due_ms = now_ms + int(self.rng.uniform(0, self.interval_ms * multiplier))

    def after_own_sync(self, now_ms: int) -> None:
        self.owed_ms = None  # what we hold has gone out
        self.reset(now_ms, 2.0)

    def after_own_content(self, now_ms: int) -> None:
        self.owed_ms = None
        self.reset(now_ms, 1.0)

    def after_received_sync(self, now_ms: int, *, owing: bool) -> None:
        """``owing``: whether we still owe an acknowledgement after the sync was read."""
        if not owing:
            self.owed_ms = None
        start = now_ms + self.interval_ms if self.suppress else now_ms
        self.reset(start, 1.0)
        if self.owed_ms is not None:
            self.due_ms = min(self.due_ms, self.owed_ms)

    def after_received_content(self, now_ms: int) -> None:
        # Only ever brings the sync forward: an acknowledgement is wanted soon.
        self.due_ms = min(self.due_ms, now_ms + int(self.rng.uniform(0, self.interval_ms * 0.5)))

    def owe(self) -> None:
        """We owe an acknowledgement (we delivered content): the sync due now stays due."""
        if self.owed_ms is None:
            self.owed_ms = self.due_ms
