"""Set reconciliation between message stores: range-based (RBSR), Prolly-tree sync and
rateless IBLTs (RIBLT).

Every method is a sans-I/O session over a sorted :class:`ItemStore` (RIBLT's own store,
:class:`RibltItemStore`, keeps its symbol cache up to date), named in one table,
:data:`METHODS` (:mod:`sdsync.reconcile.methods`), that everything choosing a method reads;
see :mod:`sdsync.reconcile.session` for the calling convention and ``docs/reconcile.md`` for
the wire formats and the measurements behind the parameters.
"""

from sdsync.reconcile.fingerprint import (
    EMPTY_FINGERPRINT,
    FINGERPRINT_SIZE,
    fingerprint,
    fingerprint_of_sum,
    summarize,
    varint,
)
from sdsync.reconcile.items import INFINITY, Bound, Item, ItemStore, MemoryItemStore
from sdsync.reconcile.memory import ReconcileResult, reconcile_in_memory, sessions
from sdsync.reconcile.methods import METHODS, Method, session_class
from sdsync.reconcile.prolly import PROLLY_VERSION, ProllyParams, ProllySession
from sdsync.reconcile.rbsr import RBSR_VERSION, RbsrParams, RbsrSession
from sdsync.reconcile.riblt import (
    RIBLT_VERSION,
    RibltItemStore,
    RibltParams,
    RibltSession,
    SymbolCache,
)
from sdsync.reconcile.session import (
    DEFAULT_MAX_FRAME_SIZE,
    FULL_WINDOW,
    ROUND_LIMIT_ITEMS,
    ReconcileSession,
    SessionStats,
    Window,
    default_max_rounds,
)
from sdsync.wire.waku import HASH_SIZE

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "EMPTY_FINGERPRINT",
    "FINGERPRINT_SIZE",
    "FULL_WINDOW",
    "HASH_SIZE",
    "INFINITY",
    "METHODS",
    "PROLLY_VERSION",
    "RBSR_VERSION",
    "RIBLT_VERSION",
    "ROUND_LIMIT_ITEMS",
    "Bound",
    "Item",
    "ItemStore",
    "MemoryItemStore",
    "Method",
    "ProllyParams",
    "ProllySession",
    "RbsrParams",
    "RbsrSession",
    "ReconcileResult",
    "ReconcileSession",
    "RibltItemStore",
    "RibltParams",
    "RibltSession",
    "SessionStats",
    "SymbolCache",
    "Window",
    "default_max_rounds",
    "fingerprint",
    "fingerprint_of_sum",
    "reconcile_in_memory",
    "session_class",
    "sessions",
    "summarize",
    "varint",
]
