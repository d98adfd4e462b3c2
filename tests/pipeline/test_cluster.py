"""The pipeline on a real standalone Spark cluster (a master and two one-core workers on
127.0.0.1, :mod:`cluster`), against the same commands run in local mode.

Every other pipeline test runs Spark embedded: one JVM whose executors share the driver's
memory and Python. Here the driver is its own process (``sdsync pipeline … --master
spark://…``, as a user runs it), the executors are the workers' children, and the code
they run reaches them the way it reaches a cluster user's: the driver ships its sdsync
package (``pipeline/session.py``), the workers provide the interpreter. Each command's
outputs must equal a local run's, row for row; and a reconcile whose worker is killed
midway must still finish with the same outputs (Spark runs the lost tasks again on the
other worker).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from archives import Item, archive_table, random_items
from cluster import SparkCluster, driver_env
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.demo import FullDemo
from sdsync.sim.output import ARCHIVES, EVENTS, LOGS, MESSAGES

#: Liveness bound for one driver process, not a timing assertion.
DRIVER_S = 600
GRID = """
description = "two small runs"
[base]
participants = 3
drain_ms = 120_000
[base.workload]
messages = 10
duration_ms = 5_000
[base.network]
loss = 0.2
[[sweep]]
name = "loss"
[sweep.axes]
"network.loss" = [0.0, 0.2]
"""

#: A driver process that starts one session on the cluster and runs several `sdsync
#: pipeline` commands in it (each joins the active session, as under spark-submit: the
#: executors start once); prints their exit codes.
DRIVER = """
import json, sys
from sdsync.cli.main import app
from sdsync.pipeline.session import SessionOptions, build_session
spark, _ = build_session(SessionOptions(master=sys.argv[1]))
codes = []
for args in json.loads(sys.argv[2]):
    # Not standalone: an exit code is returned rather than ending the process.
    codes.append(app(["pipeline", *args], standalone_mode=False) or 0)
spark.stop()
print(json.dumps(codes))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    running = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


def commands(demo: FullDemo, grid: Path, out: Path) -> list[list[str]]:
    sim = demo.out / "simulation"
    archives = [f"--archive={p.name}={p}" for p in sorted((sim / ARCHIVES).iterdir())]
    return [
        ["consolidate", "--logs", str(sim / LOGS), "--events", str(sim / MESSAGES)],
        ["reconcile", *archives],
        ["reconcile", *archives, "--one-pass-rows", "0"],  # two passes
        ["report", "--events", str(sim / EVENTS)],
        ["sweep", "--grid", str(grid)],
    ]


def with_out(command: list[str], out: Path, i: int) -> list[str]:
    return [*command, "--out", str(out / f"{i}-{command[0]}")]


def on_cluster(cluster: SparkCluster, runs: list[list[str]], logs: Path) -> list[int]:
    """The commands in one driver process of their own, on one session on the cluster."""
    with logs.open("w") as stderr:
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, cluster.url, json.dumps(runs)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=driver_env(),
            timeout=DRIVER_S,
            check=False,
        )
    failure = f"driver exit {done.returncode}\n{logs.read_text()[-4000:]}\n{cluster.logs()}"
    assert done.returncode == 0 and done.stdout.strip(), failure
    codes: list[int] = json.loads(done.stdout.strip().splitlines()[-1])
    return codes


def tables(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every Parquet table under ``out``, rows in a canonical order."""
    found: dict[str, list[dict[str, Any]]] = {}
    groups: dict[Path, list[Path]] = {}
    for path in sorted(out.rglob("*.parquet")):
        # Spark names its part files differently each run: a folder of them is one table.
        groups.setdefault(path.parent if path.name.startswith("part-") else path, []).append(path)
    for name, parts in groups.items():
        rows = pa.concat_tables([pq.read_table(part) for part in parts]).to_pylist()
        answers = [answer(row) for row in rows]
        found[str(name.relative_to(out))] = sorted(answers, key=lambda r: repr(sorted(r.items())))
    return found


#: Fields that describe the run (how long, where, in how many tasks: Spark's default
#: parallelism is the cores it has) rather than the answer.
RUN_FIELDS = ("seconds", "per_second", "stages", "master", "elapsed", "outputs", "time_slices")


def answer(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` without its run fields (also inside a sweep's ``summary_json``)."""
    kept = {k: v for k, v in record.items() if not any(f in k for f in RUN_FIELDS)}
    if isinstance(kept.get("summary_json"), str):
        kept["summary_json"] = answer(json.loads(kept["summary_json"]))
    return kept


def same_outputs(local: Path, remote: Path) -> None:
    local_tables, remote_tables = tables(local), tables(remote)
    assert local_tables.keys() == remote_tables.keys()
    assert local_tables, f"no Parquet output in {local}"
    for name, rows in local_tables.items():
        assert remote_tables[name] == rows, f"{remote.name}/{name} differs from local mode"
    summaries = [json.loads((d / "summary.json").read_text()) for d in (local, remote)]
    assert answer(summaries[1]) == answer(summaries[0])


def test_every_command_on_a_cluster_equals_local_mode(
    spark: SparkSession, demo_run: FullDemo, cluster: SparkCluster, tmp_path: Path
) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    runs = commands(demo_run, grid, tmp_path)
    local_codes = []
    for i, command in enumerate(runs):
        # In this process the test session is active: the command joins it (local mode).
        result = CliRunner().invoke(app, ["pipeline", *with_out(command, tmp_path / "local", i)])
        assert result.exception is None or isinstance(result.exception, SystemExit), result
        local_codes.append(result.exit_code)
    assert local_codes[1] == local_codes[2] == 1  # the demo's archives differ
    remote = tmp_path / "cluster"
    cluster_runs = [with_out(command, remote, i) for i, command in enumerate(runs)]
    assert on_cluster(cluster, cluster_runs, tmp_path / "driver.log") == local_codes
    for i, command in enumerate(runs):
        same_outputs(tmp_path / "local" / f"{i}-{command[0]}", remote / f"{i}-{command[0]}")
    methods = [json.loads((remote / f"{i}-reconcile" / "summary.json").read_text()) for i in (1, 2)]
    assert [m["method"] for m in methods] == ["one pass", "two passes"]
    # The executors ran the code the driver shipped, not what the workers have installed.
    executors = cluster.executor_logs(0) + cluster.executor_logs(1)
    assert "sdsync.zip" in executors


def clustered_archive(directory: Path, items: list[Item]) -> Path:
    """Time-ordered items in 8 files of row groups of 10,000: what a store exports."""
    directory.mkdir()
    step = -(-len(items) // 8)
    for number, start in enumerate(range(0, len(items), step)):
        table = archive_table(items[start : start + step])
        pq.write_table(table, directory / f"part-{number:03d}.parquet", row_group_size=10_000)
    return directory


def test_a_worker_killed_midway_through_a_reconcile_changes_nothing(
    spark: SparkSession, cluster: SparkCluster, tmp_path: Path
) -> None:
    items = sorted(random_items(400_000, random.Random(18)))
    a = clustered_archive(tmp_path / "a", items)
    b = clustered_archive(tmp_path / "b", items[:150_000] + items[151_000:])
    # One pass over slices of at most 50,000 rows: many tasks, each writing its own files
    # of missing rows (pipeline/time_slices.py), so both workers have some.
    command = ["reconcile", f"--archive=a={a}", f"--archive=b={b}", "--one-pass-rows", "50000"]
    local = CliRunner().invoke(app, ["pipeline", *command, "--out", str(tmp_path / "local")])
    assert local.exit_code == 1, local.output
    before = cluster.executor_logs(1).count("Running task")
    remote = [*command, "--master", cluster.url, "--out", str(tmp_path / "cluster")]
    driver = subprocess.Popen(
        [sys.executable, "-m", "sdsync.cli", "pipeline", *remote],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=driver_env(),
    )
    try:
        deadline = time.monotonic() + DRIVER_S
        # Midway: worker 1's executor has started a task of this job.
        while cluster.executor_logs(1).count("Running task") == before:
            assert driver.poll() is None, "finished before worker 1 ran a task"
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.05)
        cluster.kill_worker(1)
        output, _ = driver.communicate(timeout=DRIVER_S)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 1, f"{output}\n{cluster.logs()}"
    assert "Lost executor" in output  # the job lost worker 1's tasks and ran them again
    assert cluster.state()["aliveworkers"] == 1
    same_outputs(tmp_path / "local", tmp_path / "cluster")
    summary = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    assert summary["method"] == "one pass"
