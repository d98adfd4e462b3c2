"""Leaf-fingerprint caches kept beside store archives, for repeated reconciliations.

Theory of operation: the expensive part of a reconciliation is the scan that sums every
hash into its leaf; everything above the leaves is derived from the small leaf table.
With ``--fingerprint-cache`` that table is written beside the archive and reused next
time, so a rerun only reads the rows of the leaves that differ.

A cache must never be used for data it was not computed from.  It is keyed by a digest
of the archive's file listing — every data file's relative path, size and modification
time in nanoseconds — plus the cache format version: adding, removing, rewriting or
touching a file changes the key, and a cache with another key is ignored and replaced.

Leaves are aligned power-of-two time buckets (``leaf = timestamp >> shift``), so a
cache computed with a finer ``shift`` still serves a coarser one: sum ``2**d`` cached
leaves into one.  A cache coarser than the run needs is recomputed.

Layout, for an archive directory ``DIR`` (hidden from Spark and pyarrow by the ``_``):
``DIR/_sdsync_fingerprints/meta.json`` (key, shift, row count, time bounds) and
``DIR/_sdsync_fingerprints/leaves/`` (Parquet: leaf, n, s0..s7).  ``meta.json`` is
written last, so an interrupted write leaves no usable cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from sdsync.pipeline.io import local_path

CACHE_VERSION = 1
CACHE_DIR = "_sdsync_fingerprints"


@dataclass(frozen=True)
class CacheMeta:
    """What a cache was computed from and at which resolution."""

    version: int
    key: str
    shift: int
    rows: int
    min_ts: int | None
    max_ts: int | None


def cache_root(archive_path: str) -> Path:
    """Where the cache of an archive lives (inside it, or beside a single-file archive)."""
    path = local_path(archive_path)
    if path.is_dir():
        return path / CACHE_DIR
    return path.parent / f"_{path.name}{CACHE_DIR[1:]}"


def listing_key(archive_path: str, files: list[str]) -> str:
    """Digest of the data files' relative paths, sizes and mtimes (nanoseconds)."""
    root = local_path(archive_path)
    base = root if root.is_dir() else root.parent
    digest = hashlib.sha256(f"sdsync-leaves-v{CACHE_VERSION}\n".encode())
    for file in sorted(files):
        st = os.stat(file)
        rel = os.path.relpath(file, base)
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def load_meta(archive_path: str) -> CacheMeta | None:
    """The cache's metadata, or None if there is no complete cache of a known version."""
    meta_file = cache_root(archive_path) / "meta.json"
    try:
        raw = json.loads(meta_file.read_text())
        meta = CacheMeta(**raw)
    except (OSError, ValueError, TypeError):
        return None
    return meta if meta.version == CACHE_VERSION else None


def usable(meta: CacheMeta | None, key: str, shift: int) -> bool:
    """Whether a cache was computed from exactly these files, at this or a finer shift."""
    return meta is not None and meta.key == key and meta.shift <= shift


def leaves_path(archive_path: str) -> str:
    return str(cache_root(archive_path) / "leaves")


def begin_write(archive_path: str) -> str:
    """Invalidate the old cache and return where to write the new leaf table."""
    root = cache_root(archive_path)
    (root / "meta.json").unlink(missing_ok=True)
    shutil.rmtree(root / "leaves", ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    return leaves_path(archive_path)


def commit(archive_path: str, meta: CacheMeta) -> None:
    """Publish a cache whose leaf table has been written completely."""
    target = cache_root(archive_path) / "meta.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(meta), indent=2) + "\n")
    tmp.replace(target)
