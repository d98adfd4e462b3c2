"""Spark Connect (``--remote``): every pipeline command gives the answers and the exit code
it gives in a local session.

One Spark Connect server serves the module: a second JVM started from PySpark's own jars,
bound to 127.0.0.1 on a free port, in a process group of its own that teardown stops.
Each command runs as the real CLI in a subprocess (a Connect client cannot share a process
with the classic session the other pipeline tests use: PySpark switches the whole process
to Connect mode); the reference is the same command in-process on that local session.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import pytest
from rich.console import Console
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.demo import demo_scenario, run_simulation
from sdsync.pipeline.session import LOG4J2
from sdsync.sim.output import EVENTS

sys.path.insert(0, str(Path(__file__).parent))
from archives import random_items, write_archive
from test_consolidate import LOGS, MESSAGES, write_logs, write_messages
from test_sweep import SMALL_GRID

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 600
# Summary keys that differ between two runs of one command without saying anything about
# its answer: where the outputs went and how long the steps took.
RUN_SPECIFIC = frozenset({"outputs", "stage_seconds", "seconds"})
# Output columns of the same kind (the sweep's wall time; its summary_json repeats the
# other columns and adds wall times).
RUN_SPECIFIC_COLUMNS = frozenset({"wall_seconds", "summary_json"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(home: Path, port: int) -> list[str]:
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.bindAddress": "127.0.0.1",  # the server's own driver ports too
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        # Not UTC, unlike our local sessions: the server's own defaults must not change
        # any answer.
        "spark.sql.session.timeZone": "America/Los_Angeles",
    }
    # C1-only JIT and one GC thread, as SessionOptions.fast_start: these jobs are short.
    java = f"-Dlog4j2.configurationFile={LOG4J2.as_uri()} -XX:+UseSerialGC"
    java += " -XX:TieredStopAtLevel=1 -XX:CICompilerCount=2"
    command = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    command += ["--master", "local[2]", "--driver-java-options", java]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def wait_until_listening(server: subprocess.Popen[bytes], port: int, stderr: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while server.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.25)
    state = "still starting" if server.poll() is None else f"exited with {server.returncode}"
    tail = stderr.read_text(errors="replace")[-4000:]
    pytest.fail(
        f"the Spark Connect server never listened on 127.0.0.1:{port} within "
        f"{START_TIMEOUT_S} s ({state}); its stderr ends:\n{tail}"
    )


def stop(server: subprocess.Popen[bytes]) -> None:
    """Stop the server's process group: the JVM, then anything of it still there."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


@pytest.fixture(scope="module")
def connect_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A Spark Connect server on 127.0.0.1 for this module; its URL.

    The tests' local session (the ``spark`` fixture, for the reference runs) starts while
    the server does; tests that list ``spark`` themselves would start it first instead.
    """
    home = Path(pyspark.__file__).parent
    port = free_port()
    logs = tmp_path_factory.mktemp("connect-server")
    # The server's Python workers (mapInArrow tasks) must run this venv's interpreter.
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable}
    with (logs / "stdout").open("wb") as out, (logs / "stderr").open("wb") as err:
        server = subprocess.Popen(
            server_command(home, port),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        request.getfixturevalue("spark")
        wait_until_listening(server, port, logs / "stderr")
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop(server)


# -- running a command both ways -----------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    output: str
    out: Path

    @property
    def summary(self) -> dict[str, Any]:
        return dict(json.loads((self.out / "summary.json").read_text()))


class RemoteRun:
    """The CLI in a subprocess as a Connect client; killed on leaving if still running."""

    def __init__(self, url: str, out: Path, command: str, *args: str) -> None:
        self.out = out
        self.log = out.with_name(f"{out.name}.log")
        argv = [sys.executable, "-m", "sdsync.cli", "pipeline", command, *args]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [*argv, "--out", str(out), "--remote", url],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def __enter__(self) -> RemoteRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def outcome(self) -> Outcome:
        code = self.process.wait(timeout=COMMAND_TIMEOUT_S)
        return Outcome(code, self.log.read_text(errors="replace"), self.out)


def run_remote(url: str, out: Path, command: str, *args: str) -> Outcome:
    with RemoteRun(url, out, command, *args) as remote:
        return remote.outcome()


def run_local(out: Path, command: str, *args: str) -> Outcome:
    # In-process, the command joins the tests' local session (the `spark` fixture).
    result = CliRunner().invoke(app, ["pipeline", command, *args, "--out", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return Outcome(result.exit_code, result.output, out)


def rows(path: Path) -> list[dict[str, Any]]:
    """A Parquet output's rows in a canonical order (Spark's row order is arbitrary)."""
    table = pq.read_table(path)
    table = table.drop_columns([c for c in table.column_names if c in RUN_SPECIFIC_COLUMNS])
    return sorted(table.to_pylist(), key=repr)


def parquet_outputs(summary: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    tables = {}
    for name, location in summary["outputs"].items():
        path = Path(location)
        if path.suffix == ".parquet" or (path.is_dir() and any(path.glob("*.parquet"))):
            tables[name] = rows(path)
    return tables


def assert_same_answers(local: Outcome, remote: Outcome) -> dict[str, Any]:
    """The remote run's exit code, summary and Parquet outputs equal the local run's."""
    assert remote.exit_code == local.exit_code, remote.output
    mine, reference = remote.summary, local.summary
    assert {k: v for k, v in mine.items() if k not in RUN_SPECIFIC} == {
        k: v for k, v in reference.items() if k not in RUN_SPECIFIC
    }
    assert mine["outputs"].keys() == reference["outputs"].keys()
    tables = parquet_outputs(mine)
    assert tables, "no Parquet outputs compared"
    assert tables == parquet_outputs(reference)
    return mine


def both(url: str, tmp_path: Path, command: str, *args: str) -> tuple[int, dict[str, Any]]:
    """Run ``command`` locally and over Connect, check they agree; the exit code, summary."""
    # The Connect client runs while the local reference does.
    with RemoteRun(url, tmp_path / "remote", command, *args) as client:
        local = run_local(tmp_path / "local", command, *args)
        remote = client.outcome()
    return remote.exit_code, assert_same_answers(local, remote)


# -- the commands --------------------------------------------------------------------------


def test_reconcile_three_archives(connect_url: str, tmp_path: Path) -> None:
    rng = random.Random(21)
    base = random_items(1500, rng)
    burst = base[0][0]  # distinct items sharing one timestamp
    base += [(burst, rng.randbytes(32)) for _ in range(20)]
    outage = (base[1][0], base[1][0] + 2 * 10**11)
    sets = {
        "a": [x for x in base if rng.random() > 0.01],
        "b": [x for x in base if rng.random() > 0.02] + base[:5],  # 5 duplicated rows
        "c": [x for x in base if not outage[0] <= x[0] < outage[1]],
    }
    args = [
        f"--archive={name}={write_archive(tmp_path / name, items, files=2)}"
        for name, items in sets.items()
    ]
    code, summary = both(connect_url, tmp_path, "reconcile", *args, "--leaf-items", "64")
    assert code == 1
    held = {name: {h for _, h in items} for name, items in sets.items()}
    everything = set().union(*held.values())
    assert summary["missing_per_archive"] == {n: len(everything - h) for n, h in held.items()}
    missing = rows(Path(summary["outputs"]["missing"]))
    expected = {(name, h) for name, hashes in held.items() for h in everything - hashes}
    assert {(r["archive"], r["message_hash"]) for r in missing} == expected
    assert len(missing) == len(expected)
    assert summary["rows_compared_exactly"] < sum(summary["rows_per_archive"].values())


def test_consolidate_every_divergence(connect_url: str, tmp_path: Path) -> None:
    logs = write_logs(tmp_path / "logs", LOGS)
    events = write_messages(tmp_path / "messages.parquet", MESSAGES)
    code, summary = both(
        connect_url, tmp_path, "consolidate", "--logs", str(logs), "--events", str(events)
    )
    assert code == 1
    # The hand-made logs hold one of each kind of divergence (see test_consolidate).
    for key in ("missing_entries", "extra_entries", "order_violations", "duplicates"):
        assert summary[key] >= 1, key
    assert summary["causal_gaps"] == 1


@pytest.fixture(scope="module")
def simulation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small simulated group (the demo's scenario): its events.parquet and the rest."""
    out = tmp_path_factory.mktemp("simulation")
    config = demo_scenario(participants=3, messages=30, loss=0.2, seed=5)
    summary = run_simulation(config, out, events=True, console=Console(file=io.StringIO()))
    assert summary["invariants_hold"]
    return out


def test_report(connect_url: str, simulation: Path, tmp_path: Path) -> None:
    code, summary = both(connect_url, tmp_path, "report", "--events", str(simulation / EVENTS))
    assert code == 0
    assert summary["participants"] == 3 and summary["delivery_rate"] == 1.0


def test_sweep(connect_url: str, tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(SMALL_GRID)
    code, summary = both(connect_url, tmp_path, "sweep", "--grid", str(grid))
    # The grid expects its runs without a store or SDS-R to break, and nothing else.
    assert code == (1 if summary["runs_breaking_invariants_unexpectedly"] else 0)
    assert summary["runs"] == 8 and len(summary["runs_breaking_invariants_as_expected"]) == 2


# -- bad input -----------------------------------------------------------------------------


def test_missing_column_exits_2_naming_the_file(connect_url: str, tmp_path: Path) -> None:
    good = write_archive(tmp_path / "good", random_items(10, random.Random(22)))
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"message_hash": [b"x" * 32]}), bad / "part-0.parquet")
    out = tmp_path / "out"
    result = run_remote(
        connect_url, out, "reconcile", "--archive", str(good), "--archive", str(bad)
    )
    assert result.exit_code == 2, result.output
    assert "part-0.parquet" in result.output and "'timestamp'" in result.output
    assert not (out / "summary.json").exists()


def test_read_errors_raised_by_the_server_become_input_errors(
    connect_url: str, tmp_path: Path
) -> None:
    """Inputs Spark reads itself (hdfs://, s3a://) fail on the server; the Connect client's
    exception classes must map to the same InputError (exit 2) as classic ones."""
    not_parquet = tmp_path / "notes.parquet"
    not_parquet.write_text("not parquet")
    script = f"""
from sdsync.pipeline.io import input_error_from_spark
from sdsync.pipeline.session import SessionOptions, build_session
spark, _ = build_session(SessionOptions(remote={connect_url!r}))
for path in {[str(tmp_path / "absent"), str(not_parquet)]!r}:
    try:
        spark.read.parquet(path).count()
    except Exception as exc:
        print(input_error_from_spark(exc))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=True,
    )
    errors = done.stdout.splitlines()
    assert len(errors) == 2, done.stdout + done.stderr
    assert errors[0].startswith(f"file:{tmp_path / 'absent'}: cannot read input")
    assert errors[1].startswith(f"file:{not_parquet}: cannot read input")
