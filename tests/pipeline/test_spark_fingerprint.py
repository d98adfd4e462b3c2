"""Spark's and numpy's limbs and leaf sums give the reference implementation's fingerprints."""

from __future__ import annotations

import itertools
import random
import zlib

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from sdsync.pipeline.arrow_leaves import hash_limbs as arrow_limbs
from sdsync.pipeline.leaves import LeafTable, leaf_sums
from sdsync.pipeline.spark_fingerprint import (
    crc_inverse_tables,
    hash_limbs,
    limb_from_crc,
    limb_names,
)
from sdsync.reconcile.fingerprint import fingerprint, fingerprint_of_sum, limbs, sum_from_limb_sums

RNG = random.Random(8)
GROUPS: dict[int, list[bytes]] = {
    0: [bytes(32), b"\xff" * 32, bytes(range(32)), b"\x80" + bytes(31)],
    1: [RNG.randbytes(32) for _ in range(300)],
    2: [b"\xff" * 32] * 5,  # carries through every limb
    3: [RNG.randbytes(32)],
}


def _fingerprint_of(n: int, sums: list[int]) -> bytes:
    return fingerprint_of_sum(sum_from_limb_sums(sums), n)


def test_crc_inverse_recovers_every_byte_pattern() -> None:
    tables = crc_inverse_tables()
    rng = random.Random(7)
    for _ in range(2000):
        m = rng.getrandbits(32)
        assert limb_from_crc(zlib.crc32(m.to_bytes(4, "big")), tables) == m


def test_spark_limbs_and_sums_match_reference(spark: SparkSession) -> None:
    rows = [(g, h) for g, hs in GROUPS.items() for h in hs]
    df = spark.createDataFrame(rows, "g long, h binary")
    got_limbs = df.select("h", *hash_limbs("h")).collect()
    for row in got_limbs:
        assert tuple(row[1:]) == limbs(row[0])
    names = limb_names()
    sums = df.groupBy("g").agg(
        sf.count(sf.lit(1)).alias("n"),
        *[sf.sum(limb).alias(name) for limb, name in zip(hash_limbs("h"), names, strict=True)],
    )
    fps = {r["g"]: _fingerprint_of(r["n"], [r[c] for c in names]) for r in sums.collect()}
    assert fps == {g: fingerprint(hs) for g, hs in GROUPS.items()}


def test_numpy_leaf_sums_match_reference_in_any_order_and_layout() -> None:
    rows = [(g, h) for g, hs in GROUPS.items() for h in hs]
    RNG.shuffle(rows)  # leaf sums must not depend on the rows being in time order
    timestamps = np.array([g << 10 | RNG.randrange(1024) for g, _ in rows], dtype=np.int64)
    hashes = [h for _, h in rows]
    layouts = [
        pa.array(hashes, pa.binary()),
        pa.array(hashes, pa.large_binary()),
        pa.array(hashes, pa.binary(32)),
        pa.array([b"x", *hashes], pa.binary()).slice(1),  # an offset into the buffers
    ]
    for array in layouts:
        matrix = arrow_limbs(array)
        assert matrix is not None
        assert [tuple(map(int, r)) for r in matrix] == [limbs(h) for h in hashes]
        table = leaf_sums(timestamps, matrix, 10)
        got = {
            int(leaf): _fingerprint_of(int(n), [int(s) for s in row])
            for leaf, n, row in zip(table.leaf, table.n, table.sums, strict=True)
        }
        assert got == {g: fingerprint(hs) for g, hs in GROUPS.items()}


def test_leaf_sums_of_parts_merge_into_the_whole() -> None:
    rows = [(g, h) for g, hs in GROUPS.items() for h in hs]
    timestamps = np.array([g << 10 | RNG.randrange(1024) for g, _ in rows], dtype=np.int64)
    matrix = arrow_limbs(pa.array([h for _, h in rows], pa.binary()))
    assert matrix is not None
    whole = leaf_sums(timestamps, matrix, 10)
    # Parts that share leaves and come in any order, and empty parts.
    cuts = [0, 0, 7, 150, 151, len(rows), len(rows)]
    parts = [leaf_sums(timestamps[a:b], matrix[a:b], 10) for a, b in itertools.pairwise(cuts)]
    for merged in (LeafTable.merge(parts), LeafTable.merge(parts[::-1])):
        assert merged.leaf.tolist() == whole.leaf.tolist()
        assert merged.n.tolist() == whole.n.tolist()
        assert merged.sums.tolist() == whole.sums.tolist()
    assert len(LeafTable.merge([]).leaf) == 0


def test_numpy_limbs_refuse_nulls_and_other_sizes() -> None:
    assert arrow_limbs(pa.array([bytes(32), None], pa.binary())) is None
    assert arrow_limbs(pa.array([bytes(32), bytes(31)], pa.binary())) is None
    assert arrow_limbs(pa.array([bytes(16)], pa.binary(16))) is None
    assert arrow_limbs(pa.array([], pa.binary())) is not None
