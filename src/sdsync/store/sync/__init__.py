"""Store Sync: store nodes reconcile the last hour of their archives and fill the gaps.

Theory of operation
-------------------
WAKU-STORE-SYNC keeps store nodes eventually consistent despite routing losses: every
few minutes a node *reconciles* a recent window of its archive with a random peer — finds
what either side lacks without sending every hash (:mod:`sdsync.reconcile`, RBSR or
Prolly-tree sync) — and then *transfers* the differences, the side holding a message
sending it. Everything runs over the store's HTTP server:

* :mod:`~sdsync.store.sync.wire` — routes, headers, message batches;
* :mod:`~sdsync.store.sync.snapshot` — bulk snapshots of a window, batches read by hash;
* :mod:`~sdsync.store.sync.responder` — sessions answered for peers, bounded, under
  ``/sync/``;
* :mod:`~sdsync.store.sync.initiator` — one round with a peer
  (:func:`sync_with_peer`, also ``sdsync store sync``);
* :mod:`~sdsync.store.sync.periodic` — a round every ``interval_s`` with a random peer,
  skipping peers that do not speak Store Sync.

The protocol is described in ``docs/store.md``.
"""

from sdsync.store.served import ArchiveKeeper, ArchiveNode
from sdsync.store.sync.config import SyncConfig
from sdsync.store.sync.initiator import SyncReport, SyncUnsupportedError, sync_with_peer
from sdsync.store.sync.periodic import PeriodicSync
from sdsync.store.sync.responder import SessionTable, responder_app
from sdsync.store.sync.wire import PREFIX

__all__ = [
    "PREFIX",
    "ArchiveKeeper",
    "ArchiveNode",
    "PeriodicSync",
    "SessionTable",
    "SyncConfig",
    "SyncReport",
    "SyncUnsupportedError",
    "responder_app",
    "sync_with_peer",
]
