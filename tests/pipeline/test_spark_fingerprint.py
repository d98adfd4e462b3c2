"""Spark's limbs and fingerprints equal the reference implementation's."""

from __future__ import annotations

import random
import zlib

from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from sdsync.pipeline.spark_fingerprint import (
    crc_inverse_tables,
    fingerprint_expr,
    hash_limbs,
    limb_from_crc,
    limb_names,
)
from sdsync.reconcile.fingerprint import fingerprint, limbs


def test_crc_inverse_recovers_every_byte_pattern() -> None:
    tables = crc_inverse_tables()
    rng = random.Random(7)
    for _ in range(2000):
        m = rng.getrandbits(32)
        assert limb_from_crc(zlib.crc32(m.to_bytes(4, "big")), tables) == m


def test_spark_limbs_and_fingerprints_match_reference(spark: SparkSession) -> None:
    rng = random.Random(8)
    extremes = [bytes(32), b"\xff" * 32, bytes(range(32)), b"\x80" + bytes(31)]
    groups: dict[int, list[bytes]] = {
        0: extremes,
        1: [rng.randbytes(32) for _ in range(300)],
        2: [b"\xff" * 32] * 5,  # carries through every limb
        3: [rng.randbytes(32)],
    }
    rows = [(g, h) for g, hs in groups.items() for h in hs]
    df = spark.createDataFrame(rows, "g long, h binary")
    got_limbs = df.select("h", *hash_limbs("h")).collect()
    for row in got_limbs:
        assert tuple(row[1:]) == limbs(row[0])
    names = limb_names()
    sums = df.groupBy("g").agg(
        sf.count(sf.lit(1)).alias("n"),
        *[sf.sum(limb).alias(name) for limb, name in zip(hash_limbs("h"), names, strict=True)],
    )
    fps = {
        r["g"]: bytes(r["fp"])
        for r in sums.select("g", fingerprint_expr("n", names).alias("fp")).collect()
    }
    assert fps == {g: fingerprint(hs) for g, hs in groups.items()}


def test_spark_fingerprint_of_large_counts_and_empty(spark: SparkSession) -> None:
    # Varint lengths 1..5 bytes and the empty set, without materialising the items.
    from sdsync.reconcile.fingerprint import fingerprint_of_sum

    cases = [(0, 0), (1, 127), (5, 128), (7, 16_383), (9, 16_384), (11, 2**31 - 1)]
    df = spark.createDataFrame([(n, s) for s, n in cases], "n long, s long")
    # Put the whole sum in the least significant limb: s0..s6 = 0.
    zeros = [sf.lit(0).cast("long").alias(f"z{i}") for i in range(7)]
    limbs_cols = [f"z{i}" for i in range(7)] + ["s"]
    got = (
        df.select("n", "s", *zeros)
        .select("n", "s", fingerprint_expr("n", limbs_cols).alias("fp"))
        .collect()
    )
    for r in got:
        assert bytes(r["fp"]) == fingerprint_of_sum(r["s"], r["n"])
