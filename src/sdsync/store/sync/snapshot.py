"""The archive as Store Sync uses it: snapshots of a window, and batches of messages.

Theory of operation
-------------------
Both sides of a sync reach their archive through a :class:`~sdsync.store.served.ArchiveNode`
— a running :class:`~sdsync.store.node.StoreNode`, or a bare
:class:`~sdsync.store.served.ArchiveKeeper` for the one-shot ``sdsync store sync`` — which
runs the blocking archive calls off the event loop and archives what arrives with source
``sync``, counted in the node's metrics.

A session reads a *snapshot*: the window's items loaded once, in bulk
(:meth:`~sdsync.store.archive.Archive.item_arrays`), into a
:class:`~sdsync.reconcile.riblt.RibltItemStore` (a :class:`~sdsync.reconcile.MemoryItemStore`
that RIBLT reads in bulk), which must not change while the session runs. Messages
archived meanwhile are simply not part of this round; the next round sees them.

A snapshot for a method that reads cached symbols (its session class says
``cached_symbols``: RIBLT) also takes the rows of its window's whole one-minute buckets
from the node's :class:`~sdsync.reconcile.riblt.SymbolCache`: rows cached by an earlier
round are reused where the bucket's count and fingerprint are unchanged, so a round
encodes only the buckets that messages arrived in or retention emptied since, whatever
path changed the archive (counted in ``sdsync_store_sync_symbol_buckets``).

Messages go out in batches of at most :data:`~sdsync.store.sync.wire.MAX_BATCH_BYTES`,
read from the archive by hash, a few hundred at a time. A hash the archive no longer
holds (retention ran meanwhile) is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

from sdsync.reconcile import MemoryItemStore, Method, RibltItemStore, SymbolCache, session_class
from sdsync.store.archive import Archive
from sdsync.store.served import ArchiveNode
from sdsync.store.sync.wire import MAX_BATCH_BYTES, encode_entry

SOURCE = "sync"
READ_CHUNK = 500


async def snapshot(node: ArchiveNode, window: tuple[int, int], method: Method) -> MemoryItemStore:
    """The items of ``window`` (start inclusive, end exclusive), frozen for one session
    of ``method``."""
    symbols = node.riblt_symbols if session_class(method).cached_symbols else None
    store, (reused, encoded) = await node.in_archive(_load, node.archive, window, symbols)
    node.metrics.sync_symbol_buckets.labels(outcome="reused").inc(reused)
    node.metrics.sync_symbol_buckets.labels(outcome="encoded").inc(encoded)
    return store


def _load(
    archive: Archive, window: tuple[int, int], symbols: SymbolCache | None
) -> tuple[MemoryItemStore, tuple[int, int]]:
    store = RibltItemStore.build(*archive.item_arrays(*window), bucket_width=None)
    return store, (symbols.attach(store, *window) if symbols is not None else (0, 0))


async def read_batch(
    node: ArchiveNode, hashes: Sequence[bytes], start: int, limit: int = MAX_BATCH_BYTES
) -> tuple[bytes, int, int]:
    """``(batch, messages in it, position after them)`` of the messages ``hashes[start:]``."""
    parts: list[bytes] = []
    size = 0
    position = start
    while position < len(hashes):
        chunk = hashes[position : position + READ_CHUNK]
        found = {m.message_hash: m for m in await node.in_archive(node.archive.get, chunk)}
        for message_hash in chunk:
            message = found.get(message_hash)
            if message is not None:
                entry = encode_entry(message)
                if parts and size + len(entry) > limit:
                    return b"".join(parts), len(parts), position
                parts.append(entry)
                size += len(entry)
            position += 1
    return b"".join(parts), len(parts), position
