"""One local SparkSession for every pipeline test (starting Spark costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the pipeline needs the 'spark' extra")

from pyspark.sql import SparkSession

from sdsync.pipeline.session import SessionOptions, build_session


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One worker runs every Spark test, so one session (one JVM) serves them all; with
    # --dist loadgroup the other worker runs the rest of the suite meanwhile.
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
