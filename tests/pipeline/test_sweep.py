"""`sdsync pipeline sweep`: grid files, one Spark task per run, results and evidence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.errors import InputError
from sdsync.pipeline.grid import load_grid, parse_grid
from sdsync.runtime.profiles import PROFILES
from sdsync.sim.engine import Simulation

GRID = """
description = "a tiny grid"
[base]
participants = 3
drain_ms = 300_000
[base.workload]
messages = 12
duration_ms = 5_000
[base.network]
loss = 0.3
[base.protocol]
bloom_capacity = 500
sync_interval_ms = 5_000
resend_interval_ms = 5_000

[axes]
seed = [1, 2]

[[sweep]]
name = "loss"
[sweep.axes]
"network.loss" = [0.0, 0.3]

[[sweep]]
name = "store and SDS-R"
[sweep.axes]
stores = [0, 1]
"protocol.repair" = [false, true]

[[sweep]]
name = "group size"
[sweep.axes]
participants = [3, 6]
"""


def test_grid_points_are_shared_between_sweeps_and_costliest_first() -> None:
    grid = parse_grid(GRID, "g.toml")
    assert [s.name for s in grid.sweeps] == ["loss", "store and SDS-R", "group size"]
    assert grid.sweeps[1].own == ("stores", "protocol.repair") and grid.common_axes == ("seed",)
    # 4 + 8 + 4 points, the base (loss 0.3, one store, SDS-R on, 3 participants) in all
    # three sweeps, per seed: 16 - 2 * 2 = 12 distinct runs.
    assert len(grid.points) == 12
    base = [p for p in grid.points if len(p.sweeps) == 3]
    assert len(base) == 2 and {p.config.seed for p in base} == {1, 2}
    assert grid.points[0].config.participants == 6  # the costliest run starts first
    assert [p.run for p in grid.points] == [f"r{i:03d}" for i in range(12)]
    assert grid.points[0].value("network.loss") == 0.3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[base\n", "not valid TOML"),
        ("[base]\nparticipants = 3\n", "at least one [[sweep]]"),
        ('[[sweep]]\nname = "x"\n[sweep.axes]\n"network.lozz" = [1.0]\n', "lozz"),
        ('[[sweep]]\nname = "x"\n[sweep.axes]\nparticipants = []\n', "non-empty array"),
        ('[[sweep]]\nname = "x"\n[sweep.axes]\n"network.loss" = ["high"]\n', "network.loss"),
        ('[[sweep]]\nname = "x"\n[sweep.axes]\n"protocol.bloom_error_rate" = [0.0]\n', "bloom"),
        ('[[sweep]]\nname = "x"\nrepeat = 2\n', "only name, axes and expect_broken"),
        ('seeds = [1]\n[[sweep]]\nname = "x"\n', "unknown key(s) seeds"),
    ],
)
def test_bad_grids_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_grid(path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def with_expected(grid: str, sweep: str, expect: str) -> str:
    """``grid`` with ``expect_broken = expect`` in the sweep named ``sweep``."""
    named = f'name = "{sweep}"\n'
    assert named in grid
    return grid.replace(named, f"{named}expect_broken = {expect}\n", 1)


def test_expect_broken_marks_the_runs_made_from_those_values() -> None:
    text = with_expected(GRID, "store and SDS-R", '[{ stores = 0, "protocol.repair" = false }]')
    grid = parse_grid(text, "g.toml")
    expected = [p for p in grid.points if p.expected_to_break]
    # The sweep's points with neither a store nor SDS-R, one per seed; no other point.
    assert {p.config.seed for p in expected} == {1, 2} and len(expected) == 2
    assert all(p.config.stores == 0 and not p.config.protocol.repair for p in expected)
    assert {p.expected_break for p in expected} == {"stores = 0, protocol.repair = false"}
    assert grid.sweeps[1].expect_broken == ((("stores", 0), ("protocol.repair", False)),)
    # Without the declaration, nothing is expected to break.
    assert not any(p.expected_to_break for p in parse_grid(GRID, "g.toml").points)


def test_expect_broken_matches_a_sweep_s_own_runs_only() -> None:
    # The group size sweep expects its 6-member runs to break: those, and not its 3-member
    # ones (the base, which every sweep shares).
    text = with_expected(GRID, "group size", "[{ participants = 6 }]")
    grid = parse_grid(text, "g.toml")
    expected = {p.run for p in grid.points if p.expected_to_break}
    assert expected == {p.run for p in grid.points if p.config.participants == 6}
    # A common axis is an axis of every sweep, and a run shared by two sweeps is expected
    # to break if one of them says so.
    text = with_expected(GRID, "loss", '[{ seed = 2, "network.loss" = 0.3 }]')
    grid = parse_grid(text, "g.toml")
    (base,) = [p for p in grid.points if p.expected_to_break]
    assert base.config.seed == 2 and set(base.sweeps) == {"loss", "store and SDS-R", "group size"}


def test_expect_broken_on_a_preset_axis_names_the_preset() -> None:
    text = with_expected(
        with_presets(GRID.split("[[sweep]]", maxsplit=1)[0])
        + '[[sweep]]\nname = "r"\n[sweep.axes]\nretrieval = ["sdsr", "none"]\n',
        "r",
        '[{ retrieval = "none" }]',
    )
    grid = parse_grid(text, "g.toml")
    assert {p.value("retrieval") for p in grid.points if p.expected_to_break} == {"none"}
    assert {p.expected_break for p in grid.points if p.expected_to_break} == {'retrieval = "none"'}


@pytest.mark.parametrize(
    ("expect", "message"),
    [
        ("{ stores = 0 }", "expect_broken must be an array of tables of axis = value"),
        ("[0]", "expect_broken must be an array of tables"),
        ("[{}]", "expect_broken must be an array of tables"),
        ('[{ "network.loss" = 0.3 }]', "'network.loss' is not an axis of this sweep"),
        ("[{ stores = 2 }]", "stores = 2 is not one of the sweep's values (0, 1)"),
        # TOML's false is not 0 (nor "false" false), though Python's 0 == False.
        ("[{ stores = false }]", "stores = false is not one of the sweep's values"),
        ('[{ "protocol.repair" = "false" }]', 'protocol.repair = "false" is not one of'),
    ],
)
def test_bad_expect_broken_names_the_file_the_sweep_and_the_key(
    tmp_path: Path, expect: str, message: str
) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(with_expected(GRID, "store and SDS-R", expect))
    with pytest.raises(InputError) as caught:
        load_grid(path)
    text = str(caught.value)
    assert f"{path}: [[sweep]] 'store and SDS-R': expect_broken" in text, text
    assert message in text, text


PRESETS = """
[presets.retrieval]
catchup = { stores = 1, "protocol.store_catchup" = true }
hint = { stores = 1, "protocol.store_catchup" = false }
sdsr = { stores = 0, "protocol.repair" = true }
none = { stores = 0, "protocol.repair" = false }
"""


def with_presets(grid: str) -> str:
    return grid.replace("[axes]", PRESETS + "\n[axes]", 1)


def test_presets_set_several_fields_and_label_every_point() -> None:
    text = (
        with_presets(GRID)
        + """
[[sweep]]
name = "retrieval"
[sweep.axes]
retrieval = ["hint", "sdsr"]
"protocol.causal_history" = [2, 10]

[[sweep]]
name = "profiles"
[sweep.axes]
profile = ["js-compatible", "lean"]
"""
    )
    grid = parse_grid(text, "g.toml")
    hint = [p for p in grid.points if p.value("retrieval") == "hint"]
    assert hint and all(p.config.stores == 1 and not p.config.protocol.store_catchup for p in hint)
    sdsr = [p for p in grid.points if p.value("retrieval") == "sdsr"]
    assert sdsr and all(p.config.stores == 0 and p.config.protocol.repair for p in sdsr)
    # The base is labelled too, though no sweep of it names a preset: it matches catchup.
    base = [p for p in grid.points if len(p.sweeps) >= 3]
    assert base and {p.value("retrieval") for p in base} == {"catchup"}
    lean = next(p for p in grid.points if p.value("profile") == "lean")
    profile = PROFILES["lean"]
    assert lean.config.protocol.causal_history == profile.channel.causal_history_size
    assert lean.config.protocol.bloom_capacity == profile.channel.bloom.capacity
    # The grid's own sync timing, not the profile's (builtin_presets says why).
    assert lean.config.protocol.sync_interval_ms == 5_000


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[[sweep]]\nname = "r"\n[sweep.axes]\nretrieval = ["carrier pigeon"]\n', "no preset"),
        ('[presets.a]\nx = 3\n[[sweep]]\nname = "r"\n', "table of field = value"),
        ('[presets."a.b"]\nx = {stores = 1}\n[[sweep]]\nname = "r"\n', "dot-free"),
        (
            '[[sweep]]\nname = "r"\n[sweep.axes]\nretrieval = ["hint"]\n'
            '[[headline]]\ntitle = "t"\nsweep = "nope"\nrows = "retrieval"\n'
            'columns = "seed"\nmeasure = "delivered_ever"\n',
            "no sweep named 'nope'",
        ),
        (
            '[[sweep]]\nname = "r"\n[sweep.axes]\nretrieval = ["hint"]\n'
            '[[headline]]\ntitle = "t"\nsweep = "r"\nrows = "participants"\n'
            'columns = "seed"\nmeasure = "delivered_ever"\n',
            "'participants' is not an axis",
        ),
        (
            '[[sweep]]\nname = "r"\n[sweep.axes]\nretrieval = ["hint"]\n'
            '[[headline]]\ntitle = "t"\nsweep = "r"\nrows = "retrieval"\n'
            'columns = "seed"\nmeasure = "delivered_ever"\nwhere = { stores = 1 }\n',
            "'stores' is not an axis",
        ),
    ],
)
def test_bad_presets_and_headlines(extra: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_grid(with_presets(GRID.split("[[sweep]]", maxsplit=1)[0]) + extra, "g.toml")
    assert message in str(caught.value)


# For the Spark run: 4 points (the base, lossless, SDS-R without a store, neither: the one
# expected to break) × 2 seeds.
SMALL_GRID = (
    with_presets(GRID.split("[[sweep]]", maxsplit=1)[0])
    + """
[[sweep]]
name = "loss"
[sweep.axes]
"network.loss" = [0.0, 0.3]

[[sweep]]
name = "store and SDS-R"
expect_broken = [{ retrieval = "none" }]
[sweep.axes]
retrieval = ["sdsr", "catchup", "none"]

[[headline]]
title = "Delivery by retrieval"
sweep = "store and SDS-R"
rows = "retrieval"
columns = "seed"
measure = "delivered_ever"
where = { seed = 2 }
"""
)


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["pipeline", "sweep", *args])


def test_sweep_runs_every_point_and_writes_the_evidence(
    spark: SparkSession, tmp_path: Path
) -> None:
    grid_file = tmp_path / "grid.toml"
    grid_file.write_text(SMALL_GRID)
    out = tmp_path / "out"
    result = invoke("--grid", str(grid_file), "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    rows = pq.read_table(out / "results.parquet").to_pylist()
    assert [r["run"] for r in rows] == [f"r{i:03d}" for i in range(8)]
    # Issue 39: the runs with neither a store nor SDS-R lose messages, as the grid expects;
    # they are told apart from the others, and break nothing that fails the sweep.
    none = [r["run"] for r in rows if r["retrieval"] == "none"]
    assert len(none) == 2
    assert [r["run"] for r in rows if r["expected_to_break"]] == none
    assert [r["run"] for r in rows if not r["invariants_hold"]] == none
    assert summary["runs_breaking_invariants"] == none and summary["runs_failed"] == []
    assert summary["runs_breaking_invariants_as_expected"] == none
    assert summary["runs_breaking_invariants_unexpectedly"] == []
    assert summary["runs_expected_to_break"] == dict.fromkeys(none, 'retrieval = "none"')
    assert summary["runs_expected_to_break_that_held"] == []
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.replace("│", " ").split())
    assert "0 unexpected; 2 as expected" in said and all(run in said for run in none), said
    grid = load_grid(grid_file)
    for point, row in zip(grid.points, rows, strict=True):
        # Each task ran exactly its point: the executor's result is the driver's rerun.
        assert row["seed"] == point.config.seed and row["retrieval"] == point.value("retrieval")
        assert row["network_loss"] == point.config.network.loss
        on_disk = json.loads((out / "runs" / point.run / "summary.json").read_text())
        assert json.loads(row["summary_json"])["delivery_rate"] == on_disk["delivery_rate"]
        assert on_disk["config"]["seed"] == point.config.seed
    sim = Simulation(grid.points[-1].config, record_events=False)
    sim.run()
    assert rows[-1]["delivery_rate"] == sim.recorder.summary()["delivery_rate"]
    assert rows[-1]["messages_sent"] == sim.recorder.summary()["messages_sent"]
    # One evidence row per value of the sweep's own axes, over both seeds.
    loss = summary["sweeps"]["loss"]
    assert [(r["network_loss"], r["runs"]) for r in loss] == [(0.0, 2), (0.3, 2)]
    lossless = [r for r in rows if r["network_loss"] == 0.0 and "loss" in r["sweeps"]]
    assert loss[0]["delivery_rate_mean"] == pytest.approx(
        sum(r["delivery_rate"] for r in lossless) / 2
    )
    stores = summary["sweeps"]["store and SDS-R"]
    assert [
        (r["retrieval"], r["runs"], r["invariants_hold"], r["expected_to_break"]) for r in stores
    ] == [
        ("catchup", 2, 2, 0),
        ("none", 2, 0, 2),
        ("sdsr", 2, 2, 0),
    ]
    assert {r["retrieval"] for r in rows} == {"catchup", "sdsr", "none"}
    for row in rows:
        by_kind = json.loads(row["summary_json"])["bytes_by_kind"]
        assert row["store_bytes_per_message"] == pytest.approx(
            by_kind["store_query"] / row["messages_sent"]
        )
    evidence = (out / "evidence.md").read_text()
    assert "## Sweep: loss" in evidence and "| retrieval | runs |" in evidence
    assert "| none | 2 | 0/2 (2 expected to break) |" in evidence
    assert evidence.count("| FAIL (expected to break) |") == 2 and "| FAIL |" not in evidence
    assert "2 runs break them as expected, 0 unexpectedly." in evidence
    assert "## Headlines" in evidence and "| retrieval ↓ seed → | 2 |" in evidence
    page = (out / "index.html").read_text()
    for name in ("loss", "store-and-SDS-R"):
        assert (out / f"sweep-{name}.png").is_file() and f"sweep-{name}.png" in page

    # Again, reusing every run: the same results, and the page published as a docs page.
    docs = tmp_path / "docs" / "evidence.md"
    again = tmp_path / "again"
    result = invoke(
        "--grid",
        str(grid_file),
        "--out",
        str(again),
        "--reuse",
        str(out / "results.parquet"),
        "--evidence",
        str(docs),
    )
    assert result.exit_code == 0, result.output
    assert json.loads((again / "summary.json").read_text())["runs_reused"] == 8
    assert pq.read_table(again / "results.parquet").to_pylist() == rows
    assert (again / "runs" / "r000" / "summary.json").is_file()
    published = docs.read_text()
    assert published == evidence.replace("(sweep-", "(evidence/sweep-").replace(
        "(results.parquet)", "(evidence/results.parquet)"
    )
    assert (tmp_path / "docs" / "evidence" / "sweep-loss.png").is_file()
    assert (tmp_path / "docs" / "evidence" / "results.parquet").is_file()

    # The same runs again, under a grid expecting the wrong ones to break: those without a
    # store or SDS-R now fail the sweep, and the SDS-R ones are noted for holding.
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(SMALL_GRID.replace('{ retrieval = "none" }', '{ retrieval = "sdsr" }'))
    result = invoke(
        "--grid",
        str(wrong),
        "--out",
        str(tmp_path / "wrong"),
        "--reuse",
        str(out / "results.parquet"),
    )
    assert result.exit_code == 1, result.output
    summary = json.loads((tmp_path / "wrong" / "summary.json").read_text())
    sdsr = [r["run"] for r in rows if r["retrieval"] == "sdsr"]
    assert summary["runs_breaking_invariants_unexpectedly"] == none
    assert summary["runs_breaking_invariants_as_expected"] == []
    assert summary["runs_expected_to_break_that_held"] == sdsr
    said = " ".join(result.output.replace("│", " ").split())
    assert f"2 unexpected: {', '.join(none)}" in said, said
    assert f"expected to break, but held 2: {', '.join(sdsr)}" in said, said


def test_bad_grid_exits_2(spark: SparkSession, tmp_path: Path) -> None:
    grid_file = tmp_path / "grid.toml"
    grid_file.write_text('[[sweep]]\nname = "x"\n[sweep.axes]\n"network.lozz" = [1.0]\n')
    result = invoke("--grid", str(grid_file), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and str(grid_file) in result.output
    result = invoke("--grid", str(tmp_path / "absent.toml"), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "cannot read the grid" in result.output


def test_the_default_grid_is_valid() -> None:
    grid = load_grid(Path(__file__).parents[2] / "scenarios" / "grids" / "default.toml")
    assert len(grid.points) == 54
    assert {s.name for s in grid.sweeps} >= {"loss", "group size", "causal history"}
    # Issue 39: its comparison runs (no store, no SDS-R under 20 % loss) lose messages by
    # design; the grid says so, so that the default sweep exits 0 when nothing else breaks.
    expected = [p for p in grid.points if p.expected_to_break]
    assert [p.config.seed for p in expected] == [1, 2, 3]
    assert all(p.config.stores == 0 and not p.config.protocol.repair for p in expected)


def test_the_scale_grid_expects_only_its_runs_without_retrieval_under_loss_to_break() -> None:
    grid = load_grid(Path(__file__).parents[2] / "scenarios" / "grids" / "scale.toml")
    expected = {p.run for p in grid.points if p.expected_to_break}
    none = {p.run for p in grid.points if p.value("retrieval") == "none"}
    lossy = {p.run for p in grid.points if p.config.network.loss > 0}
    assert expected and expected == none & lossy
