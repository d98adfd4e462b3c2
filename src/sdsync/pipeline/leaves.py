"""Leaf tables: per time leaf, the item count and the limb sums of the hashes.

Theory of operation
-------------------
A range's summary is ``(count, s0..s7)``: how many items it holds and, per 32-bit limb
of their hashes (most significant first), the plain sum of that limb
(:mod:`sdsync.pipeline.spark_fingerprint`).  Summaries add, so the summary of a coarser
range is the sum of its leaves' (:meth:`LeafTable.coarsen`), and a summary turns into
the stores' RBSR fingerprint with :func:`~sdsync.reconcile.fingerprint.sum_from_limb_sums`
and :func:`~sdsync.reconcile.fingerprint.fingerprint_of_sum`.

Everything here is numpy on arrays the caller already holds: the driver uses it to walk
the range hierarchy, and the Spark tasks of :mod:`sdsync.pipeline.time_slices` use the
very same functions to find the differing leaves of their slice of time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sdsync.pipeline.spark_fingerprint import limb_names
from sdsync.reconcile.fingerprint import LIMBS, fingerprint_of_sum, sum_from_limb_sums

LIMB_COLUMNS = limb_names()


@dataclass(frozen=True)
class LeafTable:
    """One archive's leaves in leaf order: ids, counts and (leaves, 8) limb sums."""

    leaf: np.ndarray
    n: np.ndarray
    sums: np.ndarray

    @staticmethod
    def empty() -> LeafTable:
        return LeafTable(
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, LIMBS), np.int64)
        )

    @staticmethod
    def from_arrow(table: pa.Table) -> LeafTable:
        table = table.sort_by("leaf")
        sums = np.column_stack([table[c].to_numpy() for c in LIMB_COLUMNS]).astype(np.int64)
        return LeafTable(table["leaf"].to_numpy(), table["n"].to_numpy(), sums.reshape(-1, LIMBS))

    def to_arrow(self) -> pa.Table:
        columns = {"leaf": self.leaf, "n": self.n}
        columns.update({c: self.sums[:, i] for i, c in enumerate(LIMB_COLUMNS)})
        return pa.table(columns)

    def coarsen(self, by: int) -> LeafTable:
        """The table of ranges ``leaf >> by``: sums add."""
        if by == 0 or not len(self.leaf):
            return LeafTable(self.leaf >> by, self.n, self.sums)
        return _added(self.leaf >> by, self.n, self.sums)

    @staticmethod
    def merge(tables: list[LeafTable]) -> LeafTable:
        """One table of the leaves of several parts of a set: sums add where parts share
        a leaf."""
        parts = [t for t in tables if len(t.leaf)]
        if len(parts) <= 1:
            return parts[0] if parts else LeafTable.empty()
        leaf = np.concatenate([t.leaf for t in parts])
        n = np.concatenate([t.n for t in parts])
        sums = np.concatenate([t.sums for t in parts])
        if np.any(leaf[1:] < leaf[:-1]):
            order = np.argsort(leaf, kind="stable")
            leaf, n, sums = leaf[order], n[order], sums[order]
        return _added(leaf, n, sums)


def _added(sorted_ids: np.ndarray, n: np.ndarray, sums: np.ndarray) -> LeafTable:
    """The table of the distinct ids (a non-empty sorted array), their rows added."""
    starts = _run_starts(sorted_ids)
    return LeafTable(
        sorted_ids[starts], np.add.reduceat(n, starts), np.add.reduceat(sums, starts, axis=0)
    )


def _run_starts(sorted_ids: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))


def leaf_sums(timestamps: np.ndarray, limbs: np.ndarray, shift: int) -> LeafTable:
    """The leaves (``timestamp >> shift``) of rows given as timestamps and (rows, 8) limbs,
    in any order."""
    leaf = timestamps >> shift
    if np.any(leaf[1:] < leaf[:-1]):
        order = np.argsort(leaf, kind="stable")
        leaf, limbs = leaf[order], limbs[order]
    return sorted_leaf_sums(leaf, limbs)


def sorted_leaf_sums(leaf: np.ndarray, limbs: np.ndarray) -> LeafTable:
    """The leaves of rows given in leaf order, as their leaves and (rows, 8) limbs."""
    if not len(leaf):
        return LeafTable.empty()
    starts = _run_starts(leaf)
    counts = np.diff(np.append(starts, len(leaf))).astype(np.int64)
    # Fewer than 2**31 items of < 2**32 each per leaf: the sums fit a signed long.  One
    # limb at a time, widened first: three times faster than a reduceat over the matrix
    # with an accumulator dtype.
    sums = np.empty((len(starts), LIMBS), dtype=np.int64)
    for i in range(LIMBS):
        sums[:, i] = np.add.reduceat(limbs[:, i].astype(np.int64), starts)
    return LeafTable(leaf[starts], counts, sums)


def summaries(table: LeafTable, ranges: np.ndarray) -> np.ndarray:
    """(ranges, 9): count and limb sums of each range, zeros (the empty set) if absent."""
    out = np.zeros((len(ranges), 1 + LIMBS), dtype=np.int64)
    if len(table.leaf):
        at = np.minimum(np.searchsorted(table.leaf, ranges), len(table.leaf) - 1)
        here = table.leaf[at] == ranges
        out[here, 0] = table.n[at[here]]
        out[here, 1:] = table.sums[at[here]]
    return out


def _fingerprint(summary: np.ndarray) -> bytes:
    limb_sums = [int(s) for s in summary[1:]]
    return fingerprint_of_sum(sum_from_limb_sums(limb_sums), int(summary[0]))


def differing(tables: list[LeafTable], ranges: np.ndarray) -> tuple[np.ndarray, int]:
    """The ranges (sorted ids) whose fingerprints differ between the tables, and the
    items the tables hold in them.

    Equal summaries give equal fingerprints, and different counts different sets, so
    only ranges of equal counts and different limb sums are hashed: their fingerprints
    decide (different sums may still be one total mod 2**256).
    """
    sums = [summaries(t, ranges) for t in tables]
    unequal = np.flatnonzero(np.any([(s != sums[0]).any(axis=1) for s in sums], axis=0))
    counted = np.any([s[unequal, 0] != sums[0][unequal, 0] for s in sums], axis=0)
    differs = [
        i
        for i, by_count in zip(unequal.tolist(), counted.tolist(), strict=True)
        if by_count or len({_fingerprint(s[i]) for s in sums}) > 1
    ]
    items = sum(int(s[differs, 0].sum()) for s in sums)
    return ranges[differs], items
