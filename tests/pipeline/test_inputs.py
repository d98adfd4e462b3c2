"""The pipeline's input checks follow the writers' schemas: what a simulation writes is
what consolidate, report and reconcile accept, column for column (issue 36)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from sdsync.pipeline.consolidate import LOG_COLUMNS, MESSAGES_COLUMNS
from sdsync.pipeline.io import ColumnSpec, inspect_parquet, schema_columns
from sdsync.pipeline.reconcile import ARCHIVE_COLUMNS
from sdsync.pipeline.report import EVENTS_COLUMNS
from sdsync.sim.config import NetworkConfig, SimConfig, WorkloadConfig
from sdsync.sim.engine import Simulation
from sdsync.sim.output import ARCHIVES, EVENTS, LOGS, MESSAGES, write_outputs


def test_a_simulation_s_outputs_pass_every_input_check(tmp_path: Path) -> None:
    config = SimConfig(
        seed=5,
        participants=3,
        stores=1,
        network=NetworkConfig(loss=0.1),
        workload=WorkloadConfig(messages=10, duration_ms=5_000),
    )
    sim = Simulation(config)
    sim.run()
    write_outputs(sim, tmp_path)
    inputs: dict[str, list[ColumnSpec]] = {
        LOGS: LOG_COLUMNS,
        MESSAGES: MESSAGES_COLUMNS,
        EVENTS: EVENTS_COLUMNS,
        ARCHIVES: ARCHIVE_COLUMNS,
    }
    for name, specs in inputs.items():
        # InputError on a column missing or of a type the pipeline does not accept.
        found = inspect_parquet(str(tmp_path / name), specs)
        assert found.rows, name
        # The optional columns too (``archived``): the simulator writes everything read.
        assert {spec.name for spec in specs} <= found.columns, name


def test_a_column_the_writer_renames_or_retypes_fails_at_once() -> None:
    written = pa.schema([("time_ms", pa.int64()), ("version", pa.int32())])
    (spec,) = schema_columns(written, "time_ms")
    assert spec.accepts(pa.int64()) and not spec.accepts(pa.string())
    with pytest.raises(KeyError):
        schema_columns(written, "time")
    with pytest.raises(TypeError, match="'version' of type int32"):
        schema_columns(written, "version")
