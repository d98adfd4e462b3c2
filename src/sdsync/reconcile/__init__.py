"""Range-based set reconciliation between message stores (fingerprints; sync comes later)."""

from sdsync.reconcile.fingerprint import (
    EMPTY_FINGERPRINT,
    FINGERPRINT_SIZE,
    HASH_SIZE,
    fingerprint,
    fingerprint_of_sum,
    summarize,
    varint,
)

__all__ = [
    "EMPTY_FINGERPRINT",
    "FINGERPRINT_SIZE",
    "HASH_SIZE",
    "fingerprint",
    "fingerprint_of_sum",
    "summarize",
    "varint",
]
