"""One local SparkSession for every pipeline test (starting Spark costs seconds), and one
run of the full demo that several modules inspect."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from rich.console import Console
from testdeps import require

require("pyspark", "the pipeline needs the 'spark' extra")  # skip (locally) or fail (CI) first

from pyspark.sql import SparkSession  # noqa: E402

from sdsync.demo import FullDemo, demo_scenario, run_full_demo  # noqa: E402
from sdsync.pipeline.session import SessionOptions, build_session  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One worker runs every Spark test (and the Spark Connect server), so one session (one
    # JVM) serves them all; with --dist loadgroup the other worker runs the rest meanwhile.
    for item in items:
        if "tests/pipeline/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session, owned = build_session(
        SessionOptions(
            master="local[2]",
            shuffle_partitions=2,
            ui=False,
            fast_start=True,
        )
    )
    yield session
    if owned:
        session.stop()


@pytest.fixture(scope="session")
def demo_run(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> FullDemo:
    """The full demo, once, on a small group: simulation outputs and every pipeline step
    over them (several test modules assert on different parts)."""
    out = tmp_path_factory.mktemp("demo")
    config = demo_scenario(participants=4, messages=60, loss=0.2, seed=3)
    return run_full_demo(config, out, Console(file=io.StringIO(), width=100))
