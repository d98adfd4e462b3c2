"""Periodic Store Sync: every few minutes, one round with one random peer.

Theory of operation
-------------------
WAKU-STORE-SYNC recommends a round at least every 5 minutes with one other store, chosen
at random, over the hour that ended 20 s ago (:meth:`SyncConfig.window`). A store may
assume that every store peer speaks Store Sync and learn otherwise by trying: a peer
that answers that it does not (:class:`SyncUnsupportedError`) is remembered and never
asked again, and the round goes on with another random peer. A peer that is down or
busy, or answers nonsense, ends the round (logged, and shown by ``/admin/v1/info`` and
the status page with the last :data:`RECENT_ROUNDS` rounds); the next round picks afresh.

Rounds use RIBLT by default (``--sync-method``). A node may meet peers that speak Store
Sync but not its method (older nodes): such a peer is synced by RBSR, which every Store
Sync node speaks, at once and in later rounds.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from sdsync.errors import RemoteProtocolError, ServiceUnavailable
from sdsync.reconcile import Method
from sdsync.store.served import ArchiveNode
from sdsync.store.sync.config import SyncConfig
from sdsync.store.sync.initiator import SyncReport, SyncUnsupportedError, sync_with_peer
from sdsync.store.sync.wire import BASE_METHOD

logger = logging.getLogger("sdsync.store.sync")
RECENT_ROUNDS = 10
"""Rounds ``/admin/v1/info`` and the status page show (newest first)."""


class PeriodicSync:
    def __init__(
        self,
        node: ArchiveNode,
        peers: Sequence[str],
        config: SyncConfig,
        *,
        clock_ns: Callable[[], int],
        rng: random.Random,
    ) -> None:
        self.node = node
        self.peers = tuple(peers)
        self.config = config
        self.unsupported: set[str] = set()
        self.rbsr_peers: set[str] = set()
        """Peers that speak Store Sync but not our method."""
        self.rounds = 0
        self.failures = 0
        self.last: SyncReport | None = None
        self.last_error: str | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_ROUNDS)
        """The last rounds, oldest first: each a report's fields, or a failure's peer and
        error, with ``at_ns`` and ``outcome``."""
        self._clock_ns = clock_ns
        self._rng = rng

    async def round(self) -> SyncReport | None:
        """One round with a random peer that may speak Store Sync; None if it failed."""
        self.rounds += 1
        candidates = [p for p in self.peers if p not in self.unsupported]
        while candidates:
            peer = candidates.pop(self._rng.randrange(len(candidates)))
            try:
                report = await self._sync(peer)
            except SyncUnsupportedError as exc:
                logger.warning("store sync: %s; not asking it again", exc)
                self.unsupported.add(peer)
                continue
            except (ServiceUnavailable, RemoteProtocolError) as exc:
                self._failed(f"{peer}: {exc}", peer)
                return None
            self.last, self.last_error = report, None
            self.recent.append({"at_ns": self._clock_ns(), **report.as_dict(), "outcome": "ok"})
            logger.info(
                "store sync with %s: sent %d, received %d (%d new), %d round trips, %.2f s",
                peer,
                report.sent,
                report.received,
                report.stored,
                report.round_trips,
                report.seconds,
            )
            return report
        self._failed("no configured peer speaks Store Sync")
        return None

    async def _sync(self, peer: str) -> SyncReport:
        """A round with ``peer`` by our method, or by RBSR (the base method) if it does not
        speak ours."""
        method: Method = BASE_METHOD if peer in self.rbsr_peers else self.config.method
        try:
            return await self._round_with(peer, method)
        except SyncUnsupportedError as exc:
            if method == BASE_METHOD:
                raise
            logger.warning("store sync: %s; syncing with it by %s", exc, BASE_METHOD)
            self.rbsr_peers.add(peer)
            return await self._round_with(peer, BASE_METHOD)

    async def _round_with(self, peer: str, method: Method) -> SyncReport:
        window = self.config.window(self._clock_ns())
        return await sync_with_peer(self.node, peer, window, method=method, token=self.config.token)

    def _failed(self, error: str, peer: str = "") -> None:
        self.failures += 1
        self.last_error = error
        method = BASE_METHOD if peer in self.rbsr_peers else self.config.method
        failure = {"peer": peer, "method": method, "outcome": f"failed: {error}"}
        self.recent.append({"at_ns": self._clock_ns(), **failure})
        logger.warning("store sync round failed: %s", error)

    def info(self) -> dict[str, Any]:
        return {
            "method": self.config.method,
            "rounds": self.rounds,
            "failures": self.failures,
            "unsupported_peers": sorted(self.unsupported),
            "rbsr_peers": sorted(self.rbsr_peers),
            "last": self.last.as_dict() if self.last else None,
            "last_error": self.last_error,
            "recent": list(reversed(self.recent)),
        }
