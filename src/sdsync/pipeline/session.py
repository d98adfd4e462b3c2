"""Building the SparkSession every pipeline command runs in.

Theory of operation: the pipeline is embedded by default — ``local[*]`` starts a Spark
driver inside this Python process, no cluster needed.  ``--master URL`` points the same
code at a cluster (or run it under ``spark-submit``, which provides the master), and
``--remote sc://HOST`` talks to a Spark Connect server instead.  When a session is
already active (under ``spark-submit``, in a notebook, in the tests) we reuse it and
leave it running: only a session we started is ours to stop.

On a cluster the executors run our Python (the sweep's simulations, the reconcile's
Arrow batches), so they must import the same sdsync as the driver: a worker holding an
older or newer one would compute different answers without a word. Whenever the master is
not local we zip the driver's own ``sdsync`` package and add it to the session
(``addPyFile``): executors put it first on their path, ahead of whatever the worker
installed. The workers provide the interpreter (``spark.pyspark.python``, which we set to
ours: the same path must exist on every worker) and the third-party packages sdsync
imports (docs/pipeline.md, "Running on a standalone cluster").

Local defaults are sized for small machines: few shuffle partitions (the default 200
makes 200 tiny tasks per shuffle), the driver on loopback only, no web UI (it costs
start-up time and a port), no console progress bar (we draw our own), UTC session time,
and JVM logging at error level only (``log4j2.properties`` beside this module: we print
our own progress).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

APP_NAME = "sdsync-pipeline"
LOG4J2 = Path(__file__).with_name("log4j2.properties")


@dataclass(frozen=True)
class SessionOptions:
    """Where and how to run Spark."""

    master: str | None = None
    remote: str | None = None
    app_name: str = APP_NAME
    ui: bool = False
    shuffle_partitions: int | None = None
    fast_start: bool = False
    """JIT only with C1: starts and runs short jobs about twice as fast on small machines,
    at the price of throughput on long ones (tests, not benchmarks)."""
    conf: Mapping[str, str] = field(default_factory=dict)


def _local_conf(options: SessionOptions) -> dict[str, str]:
    cores = os.cpu_count() or 2
    conf = {
        "spark.sql.shuffle.partitions": str(options.shuffle_partitions or max(2, 2 * cores)),
        "spark.ui.enabled": "true" if options.ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # Python workers (if any stage ever needs one) must see this venv's packages.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    if (options.master or "local").startswith("local"):
        # Everything runs in this process: the driver's RPC and block manager ports (and
        # the UI, if on) need no other interface than loopback.
        conf["spark.driver.bindAddress"] = conf["spark.driver.host"] = "127.0.0.1"
    java = [f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}"]
    if options.fast_start:
        # Compiler threads compete with the two task threads on a 2-core machine.
        java += ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:CICompilerCount=2"]
    conf["spark.driver.extraJavaOptions"] = " ".join(java)
    return conf


def build_session(options: SessionOptions) -> tuple[SparkSession, bool]:
    """The session to run in and whether we started it (and so must stop it)."""
    if options.master and options.remote:
        raise ValueError("--master and --remote are mutually exclusive")
    active = SparkSession.getActiveSession()
    if active is not None and not options.remote:
        return active, False
    if options.remote:
        builder = SparkSession.builder.remote(options.remote)
    elif _under_spark_submit() and not options.master:
        builder = SparkSession.builder  # spark-submit's master and settings stand
    else:
        # PySpark starts its Python workers with $PYSPARK_PYTHON, else "python3" from the
        # PATH — outside this venv, without sdsync or pyarrow — whatever the conf says.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.master(options.master or "local[*]")
        for key, value in _local_conf(options).items():
            builder = builder.config(key, value)
    builder = builder.appName(options.app_name)
    for key, value in options.conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not options.remote:
        spark.sparkContext.setLogLevel("ERROR")
        if not (spark.sparkContext.master or "local").startswith("local"):
            ship_code(spark)
    return spark, True


def ship_code(spark: SparkSession) -> Path:
    """Send the driver's sdsync package to every executor of ``spark``; the zip sent."""
    package = Path(__file__).resolve().parents[1]
    # Spark copies the file to the executors as the session goes on: it must outlive
    # this call (not the process), and its name is what executors import from.
    folder = Path(tempfile.mkdtemp(prefix="sdsync-code-"))
    atexit.register(shutil.rmtree, folder, True)
    archive = folder / "sdsync.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                zipped.write(path, path.relative_to(package.parent))
    spark.sparkContext.addPyFile(str(archive))
    return archive


def _under_spark_submit() -> bool:
    """Whether spark-submit started this process: its JVM, already running with the
    master and settings it was given, waits for us on the gateway port it passed."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def is_connect(spark: SparkSession) -> bool:
    """Spark Connect sessions have no SparkContext (no job descriptions, no status API)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
