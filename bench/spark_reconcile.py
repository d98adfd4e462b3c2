"""Benchmark: `sdsync pipeline reconcile` against a plain full outer join, same Spark session.

Generates two (or three) store archives of ``--rows`` rows each over 48 hours — the
same messages, each archive losing a random 1e-4 of them, the first also losing three
one-hour outages — then runs, in one Spark session with the UI on:

* the join: every archive's (timestamp, message_hash), full outer joined, the missing
  rows (archive, message_hash, timestamp, held_by) written to Parquet;
* our reconcile (cold: no fingerprint cache), as it chooses: one pass over slices of
  time for these archives;
* our reconcile forced to two passes (``--one-pass-rows 0``: leaf scan, then the rows
  of the differing leaves again, grouped in a shuffle), for comparison;
* our reconcile again with ``--fingerprint-cache`` (a first run writes the caches,
  the next ones use them);
* outside Spark, the anchor a user with the archives on one machine would reach for:
  DuckDB (``--duckdb-threads``, default all cores, as Spark's ``local[*]``) running the
  same full outer join on (timestamp, message_hash) and writing the same missing rows to
  Parquet.

Each is run ``--rounds`` times (3), alternating, and the best run counts: the first
rounds mostly measure the JIT compiling Spark's generated code.  It checks the
outputs are identical and prints wall times, shuffle bytes (written + read, summed over
the job group's stages from the Spark REST status API) and the ratios.  Targets: reconcile
>= 3x faster than the join with <= 10 % of its shuffle bytes; cold <= 1.5x DuckDB's
time, warm (fingerprint cache) <= 1.0x.

    .venv/bin/python bench/spark_reconcile.py               # 10M rows per archive
    .venv/bin/python bench/spark_reconcile.py --quick       # 200k rows, a smoke test
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import duckdb
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from rich.console import Console

from sdsync.pipeline.progress import Progress
from sdsync.pipeline.reconcile import ParquetArchive, ReconcileOptions, reconcile
from sdsync.pipeline.session import SessionOptions, build_session

HOUR_NS = 3_600 * 10**9
SPAN_NS = 48 * HOUR_NS
START_NS = 1_700_000_000 * 10**9
OUTAGES_H = (6, 20, 33)  # start hours of the three one-hour outages of the first archive


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="messages (rows per archive)")
    p.add_argument("--archives", type=int, default=2, choices=(2, 3))
    p.add_argument("--loss", type=float, default=1e-4, help="random loss per archive")
    p.add_argument("--quick", action="store_true", help="200k rows: a smoke test")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/sdsync-bench"))
    p.add_argument("--master", default="local[*]")
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--files", type=int, default=8, help="Parquet files per archive")
    p.add_argument("--rounds", type=int, default=3, help="runs of each method; the best counts")
    p.add_argument("--duckdb-threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--json", type=Path, help="also write the best times here")
    args = p.parse_args()
    if args.quick:
        args.rows = 200_000
    return args


# -- data ----------------------------------------------------------------------------------


def generate(
    spark: SparkSession, args: argparse.Namespace, console: Console
) -> list[ParquetArchive]:
    """Write the archives (reused when a previous run made the same ones)."""
    stamp = {"rows": args.rows, "archives": args.archives, "loss": args.loss, "v": 1}
    data = args.workdir / "archives"
    archives = [ParquetArchive(f"store{k}", str(data / f"store{k}")) for k in range(args.archives)]
    marker = data / "params.json"
    if marker.exists() and json.loads(marker.read_text()) == stamp:
        console.print(f"reusing archives in {data}")
        return archives
    shutil.rmtree(data, ignore_errors=True)
    step = SPAN_NS // args.rows
    ids = spark.range(args.rows, numPartitions=args.files)
    # Deterministic "random" jitter within each message's slot, and per-archive losses.
    base = ids.select(
        "id",
        (sf.lit(START_NS) + sf.col("id") * step + sf.pmod(sf.xxhash64("id"), sf.lit(step))).alias(
            "timestamp"
        ),
    )
    for k, archive in enumerate(archives):
        start = time.perf_counter()
        lost = sf.pmod(sf.xxhash64(sf.col("id"), sf.lit(k)), sf.lit(1_000_000)) < int(
            args.loss * 1_000_000
        )
        kept = base.where(~lost)
        if k == 0:
            for hour in OUTAGES_H:
                lo = START_NS + hour * HOUR_NS
                kept = kept.where(~sf.col("timestamp").between(lo, lo + HOUR_NS - 1))
        rows = kept.select(
            sf.unhex(sf.sha2(sf.col("id").cast("string"), 256)).alias("message_hash"),
            "timestamp",
            sf.lit("/waku/2/rs/1/0").alias("pubsub_topic"),
            sf.lit("/bench/1/chat/proto").alias("content_topic"),
            sf.unhex(sf.sha2(sf.concat(sf.lit("p"), sf.col("id").cast("string")), 512)).alias(
                "payload"
            ),
            sf.lit(None).cast("binary").alias("meta"),
            sf.lit(0).alias("version"),
        )
        spark.sparkContext.setJobDescription(f"bench: generate {archive.name}")
        rows.write.mode("overwrite").parquet(archive.path)
        console.print(f"generated {archive.name} in {time.perf_counter() - start:.1f} s")
    marker.write_text(json.dumps(stamp))
    return archives


# -- the two methods -------------------------------------------------------------------------


def full_outer_join(spark: SparkSession, archives: list[ParquetArchive]) -> DataFrame:
    joined: DataFrame | None = None
    for a in archives:
        side = (
            spark.read.parquet(a.path)
            .select("timestamp", "message_hash")
            .withColumn(f"in_{a.name}", sf.lit(a.name))
        )
        joined = (
            side if joined is None else joined.join(side, ["timestamp", "message_hash"], "full")
        )
    assert joined is not None
    held_by = sf.sort_array(sf.array_compact(sf.array(*[sf.col(f"in_{a.name}") for a in archives])))
    names = sf.array(*[sf.lit(a.name) for a in archives])
    return (
        joined.select("timestamp", "message_hash", held_by.alias("held_by"))
        .where(sf.size("held_by") < len(archives))
        .select(
            sf.explode(sf.array_except(names, sf.col("held_by"))).alias("archive"),
            "message_hash",
            "timestamp",
            "held_by",
        )
    )


def run_join(spark: SparkSession, archives: list[ParquetArchive], out: Path) -> None:
    spark.sparkContext.setJobDescription("bench: full outer join")
    full_outer_join(spark, archives).write.mode("overwrite").parquet(str(out / "missing"))


def run_duckdb(archives: list[ParquetArchive], out: Path, threads: int) -> None:
    """The join in DuckDB, written for its speed: each archive's keys full outer joined,
    a bit per archive holding the row; the rows some archive lacks, joined to a small
    table that turns each combination of bits into the archives lacking the row and its
    ``held_by``, written as the pipeline writes them (archive, message_hash, timestamp,
    held_by). (List lambdas, the obvious way to build ``held_by``, cost DuckDB 40 %.)"""
    sides = [
        f"(SELECT timestamp, message_hash, true AS in_{i} FROM read_parquet('{a.path}/*.parquet'))"
        for i, a in enumerate(archives)
    ]
    joined = sides[0] + "".join(
        f" FULL OUTER JOIN {side} USING (timestamp, message_hash)" for side in sides[1:]
    )
    mask = " + ".join(f"(in_{i} IS NOT NULL)::INTEGER * {1 << i}" for i in range(len(archives)))
    full = (1 << len(archives)) - 1
    combinations = []
    for bits in range(1, full):
        held = sorted(a.name for i, a in enumerate(archives) if bits >> i & 1)
        held_by = "[" + ", ".join(f"'{name}'" for name in held) + "]"
        combinations += [
            f"({bits}, '{a.name}', {held_by})" for i, a in enumerate(archives) if not bits >> i & 1
        ]
    shutil.rmtree(out, ignore_errors=True)
    (out / "missing").mkdir(parents=True)
    with duckdb.connect() as db:
        db.execute(f"SET threads = {threads}")
        db.execute("SET enable_progress_bar = false")
        db.execute(
            f"""COPY (
                SELECT c.archive, d.message_hash, d.timestamp, c.held_by
                FROM (SELECT timestamp, message_hash, {mask} AS mask FROM {joined}) AS d
                JOIN (VALUES {", ".join(combinations)}) AS c(mask, archive, held_by)
                  ON d.mask = c.mask
            ) TO '{out / "missing" / "part-0.parquet"}' (FORMAT parquet)"""
        )


def duckdb_apart(archives: list[ParquetArchive], out: Path, threads: int) -> dict[str, float]:
    """:func:`run_duckdb` in a fresh process, as its users run it: beside this process's
    Spark JVM (its heap, its GC and compiler threads) DuckDB takes 1.6x as long."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return {"seconds": pool.apply(timed_duckdb, (archives, out, threads))}


def timed_duckdb(archives: list[ParquetArchive], out: Path, threads: int) -> float:
    start = time.perf_counter()
    run_duckdb(archives, out, threads)
    return time.perf_counter() - start


def run_reconcile(
    spark: SparkSession, archives: list[ParquetArchive], out: Path, **options: Any
) -> dict[str, Any]:
    return reconcile(spark, archives, out, Progress(spark), ReconcileOptions(**options))


# -- measuring -------------------------------------------------------------------------------


def rest(spark: SparkSession, path: str) -> Any:
    url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}"
    with urllib.request.urlopen(url + path, timeout=30) as response:
        return json.load(response)


def shuffle_bytes(spark: SparkSession, group: str) -> int:
    """Shuffle bytes written + read by every stage of the job group's jobs."""
    time.sleep(1.0)  # the status store is fed asynchronously by the listener bus
    stage_ids: set[int] = set()
    for job in rest(spark, "/jobs"):
        if job.get("jobGroup") == group:
            stage_ids.update(job["stageIds"])
    total = 0
    for stage_id in stage_ids:
        try:
            attempts = rest(spark, f"/stages/{stage_id}")
        except OSError:
            continue  # a stage that never ran (skipped) may be unknown
        for attempt in attempts:
            total += int(attempt.get("shuffleWriteBytes", 0))
            total += int(attempt.get("shuffleReadBytes", 0))
    return total


def measure(spark: SparkSession, group: str, fn: Any) -> tuple[float, int, Any]:
    spark.sparkContext.setJobGroup(group, group)
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    spark.sparkContext.setJobGroup(None, None)  # type: ignore[arg-type]
    return elapsed, shuffle_bytes(spark, group), result


def identical(spark: SparkSession, a: Path, b: Path) -> bool:
    x = spark.read.parquet(str(a / "missing"))
    y = spark.read.parquet(str(b / "missing"))
    return x.count() == y.count() and x.exceptAll(y).isEmpty() and y.exceptAll(x).isEmpty()


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main() -> int:
    args = parse_args()
    console = Console(stderr=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    spark, _ = build_session(
        SessionOptions(
            master=args.master,
            app_name="sdsync-bench-reconcile",
            ui=True,  # the REST status API lives in the UI server
            conf={"spark.driver.memory": args.driver_memory, "spark.ui.port": "0"},
        )
    )
    archives = generate(spark, args, console)
    out = args.workdir / "out"
    jobs: dict[str, Any] = {
        "join": lambda target: run_join(spark, archives, target),
        "reconcile": lambda target: run_reconcile(spark, archives, target),
        "two passes": lambda target: run_reconcile(spark, archives, target, one_pass_rows=0),
        "duckdb": lambda target: duckdb_apart(archives, target, args.duckdb_threads),
    }
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in [*jobs, "cached"]}
    summaries: dict[str, dict[str, Any]] = {}
    for round_ in range(1, args.rounds + 1):
        for name, job in jobs.items():
            target = out / name.replace(" ", "-")
            console.print(f"round {round_}: {name}…")
            t, b, summaries[name] = measure(
                spark, f"{name}{round_}", lambda job=job, target=target: job(target)
            )
            if name == "duckdb":
                t = summaries[name]["seconds"]  # its own query time, without the process start
            results[name].append((t, b))
            console.print(f"  {t:.1f} s, shuffle {mib(b)}")
    for archive in archives:
        shutil.rmtree(Path(archive.path) / "_sdsync_fingerprints", ignore_errors=True)
    for round_ in range(1, args.rounds + 1):  # the first writes the caches, the rest read them
        t, b, _ = measure(
            spark,
            f"cached{round_}",
            lambda: run_reconcile(spark, archives, out / "cached", fingerprint_cache=True),
        )
        results["cached"].append((t, b))
        console.print(f"fingerprint cache round {round_}: {t:.1f} s, shuffle {mib(b)}")
    same = all(
        identical(spark, out / "join", out / name)
        for name in ("reconcile", "two-passes", "cached", "duckdb")
    )
    best = {
        name: min((runs[1:] if name == "cached" else []) or runs) for name, runs in results.items()
    }
    summary = summaries["reconcile"]
    join_t, join_b = best["join"]
    print(f"rows per archive:      {summary['rows_per_archive']}")
    print(f"missing per archive:   {summary['missing_per_archive']}")
    print(
        f"ranges compared/diff:  {summary['ranges_compared']} / {summary['ranges_differing']}"
        f" (leaves differing {summary['leaves_differing']},"
        f" rows compared exactly {summary['rows_compared_exactly']:,})"
    )
    print(f"leaf width:            2**{summary['leaf_shift']} ns, levels {len(summary['levels'])}")
    print(f"method:                {summary['method']}, {summary['time_slices']}")
    duck_t = best["duckdb"][0]
    print("                         time (s)  vs join  ÷ duckdb   shuffle        vs join")
    labels = {
        "join": "Spark full outer join",
        "reconcile": "reconcile (cold)",
        "two passes": "reconcile, two passes",
        "duckdb": f"DuckDB join ({args.duckdb_threads} thr.)",
        "cached": "reconcile, cache warm",
    }
    for name, (t, b) in best.items():
        share = 100 * b / max(join_b, 1)
        print(
            f"{labels[name]:24} {t:8.2f}  {join_t / t:6.2f}x  {t / duck_t:7.2f}x"
            f"   {mib(b):>13}  {share:6.2f} %"
        )
    for name, runs in results.items():
        print(f"all rounds, {name}: " + ", ".join(f"{t:.1f} s" for t, _ in runs))
    rt, rb = best["reconcile"]
    share = 100 * rb / max(join_b, 1)
    print(f"targets (cold): >= 3x faster: {join_t / rt:.2f}x; <= 10 % shuffle: {share:.2f} %")
    warm_t = best["cached"][0]
    print(
        f"targets vs DuckDB: cold <= 1.5x: {rt / duck_t:.2f}x; warm <= 1.0x: {warm_t / duck_t:.2f}x"
    )
    print(f"results identical:     {same}")
    if args.json is not None:
        record = {
            "rows": args.rows,
            "archives": args.archives,
            "seconds": {name: t for name, (t, _) in best.items()},
            "shuffle_bytes": {name: b for name, (_, b) in best.items()},
            "identical": same,
            "load_average": os.getloadavg()[0],
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    spark.stop()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
