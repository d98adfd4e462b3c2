"""The full demo: simulator outputs through consolidate, reconcile and report, checked
against the simulator's own ground truth."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from sdsync.cli.demo import print_full_demo
from sdsync.demo import OUTAGE_MS, FullDemo, demo_scenario
from sdsync.sim.engine import EPOCH_NS


def test_consolidate_on_simulator_output_finds_identical_logs(demo_run: FullDemo) -> None:
    sim, con = demo_run.simulation, demo_run.consolidate
    assert sim["invariants_hold"] and demo_run.ok
    assert con["events"] is True  # messages.parquet went in as --events
    assert con["canonical_entries"] == sim["messages_sent"]
    assert con["participants"] == 4 and con["divergent_participants"] == 0
    assert con["causal_gaps"] == 0 and con["extra_entries"] == 0
    canonical = pq.read_table(demo_run.out / "consolidate" / "canonical").to_pylist()
    log = pq.read_table(demo_run.out / "simulation" / "logs" / "p00000.parquet").to_pylist()
    ordered = sorted(canonical, key=lambda r: r["position"])
    assert [r["message_id"] for r in ordered] == [r["message_id"] for r in log]


def test_reconcile_finds_exactly_what_the_outage_cost(demo_run: FullDemo) -> None:
    archives = demo_run.out / "simulation" / "archives"
    full = pq.read_table(archives / "s00").to_pylist()
    # Ground truth: store s01 heard every broadcast except those sent while it was down.
    start, end = (EPOCH_NS + t * 1_000_000 for t in OUTAGE_MS)
    during = {r["message_hash"] for r in full if start <= r["timestamp"] < end}
    assert during
    missing = pq.read_table(demo_run.out / "reconcile" / "missing").to_pylist()
    assert {r["archive"] for r in missing} == {"s01"}
    assert {r["message_hash"] for r in missing} == during
    assert all(r["held_by"] == ["s00"] for r in missing)
    rec = demo_run.reconcile
    assert rec["missing_per_archive"] == {"s00": 0, "s01": len(during)}
    assert rec["rows_per_archive"]["s01"] == len(full) - len(during)
    low, high = demo_run.missing_window_ms["s01"] or (-1, -1)
    assert OUTAGE_MS[0] <= low <= high < OUTAGE_MS[1]


def test_report_agrees_with_the_simulator(demo_run: FullDemo) -> None:
    sim, rep = demo_run.simulation, demo_run.report
    assert rep["participants"] == sim["participants"]
    assert rep["messages"] == sim["messages_sent"]
    assert rep["delivery_rate"] == sim["delivery_rate"] == 1.0
    assert rep["unconverged_messages"] == 0
    # Both exact, both interpolating between closest ranks.
    ttc = rep["time_to_consistency_ms"]
    for key in ("p50", "p90", "p99", "max"):
        assert ttc[key] == pytest.approx(sim["time_to_consistency_ms"][key], rel=1e-12), key
    messages = pq.read_table(demo_run.out / "simulation" / "messages.parquet")
    send_bytes = pc.sum(messages.column("bytes")).as_py()
    assert rep["bytes_per_message"]["send"] * rep["messages"] == send_bytes
    lag = pq.read_table(demo_run.out / "report" / "participant_lag.parquet").to_pylist()
    assert [r["participant"] for r in lag] == [f"p{i:05d}" for i in range(4)]
    assert all(r["never_delivered"] == 0 for r in lag)
    assert sum(r["sent"] for r in lag) == rep["messages"]
    # The participant that was offline for minutes waits longest.
    assert rep["slowest_participant"]["participant"] == "p00003"


def test_the_page_ties_everything_together(demo_run: FullDemo) -> None:
    page = (demo_run.out / "index.html").read_text()
    for heading in ("The run", "Consolidate", "Reconcile", "Time to consistency"):
        assert f">{heading}" in page
    images = re.findall(r'<img src="([^"]+)"', page)
    assert len(images) == 4 and all((demo_run.out / image).is_file() for image in images)
    for path in re.findall(r'<a href="([^"#]+)"', page):
        assert (demo_run.out / path).exists(), path
    for step in ("consolidate", "reconcile", "report"):
        summary = json.loads((demo_run.out / step / "summary.json").read_text())
        assert summary["seconds"] > 0
    summary = json.loads((demo_run.out / "summary.json").read_text())
    assert summary["converged"] is True
    assert summary["reconcile"]["missing_per_archive"] == demo_run.reconcile["missing_per_archive"]
    assert all(Path(path).exists() for path in summary["outputs"].values())


def test_the_summary_printed_says_what_happened(demo_run: FullDemo) -> None:
    buffer = io.StringIO()
    print_full_demo(demo_scenario(4, 60, 0.2, 3), demo_run, Console(file=buffer, width=200))
    text = buffer.getvalue()
    lacks = demo_run.reconcile["missing_per_archive"]["s01"]
    assert "identical logs" in text and f"lacks {lacks:,}" in text
    assert str((demo_run.out / "index.html").resolve()) in text
