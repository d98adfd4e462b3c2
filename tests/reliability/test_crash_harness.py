"""Kill -9 at every step of the reliability service, seed after seed (crash_harness.py).

``make test`` runs 50 seeds, in cases of :data:`PER_CASE` seeds that run in parallel
under xdist, each case on three server processes of its own; ``make soak`` runs 500
(``SDSYNC_SOAK=1``); ``SDSYNC_CRASH_SEEDS=N`` any other number, from
``SDSYNC_CRASH_FIRST_SEED`` (0). Each case prints its seeds' table (``pytest -s -n 0``
shows it), the run's table by kill point ends the terminal summary when this directory's
conftest is loaded (``pytest tests/reliability``), and with ``SDSYNC_CRASH_REPORT=path``
every seed's row and the run's summary are written there as JSON.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from crash_harness import as_dicts, run_seeds, summary, table

# With the chat process tests, in one worker: see tests/cli/test_chat.py.
pytestmark = pytest.mark.xdist_group("many-processes")

SOAK = os.environ.get("SDSYNC_SOAK") == "1"
SEEDS = int(os.environ.get("SDSYNC_CRASH_SEEDS", "500" if SOAK else "50"))
FIRST_SEED = int(os.environ.get("SDSYNC_CRASH_FIRST_SEED", "0"))
PER_CASE = 5
REPORT_VARIABLE = "SDSYNC_CRASH_REPORT"
_RUN = uuid.uuid4().hex  # without xdist: this process is the run


def _cases() -> list[range]:
    end = FIRST_SEED + SEEDS
    return [range(s, min(s + PER_CASE, end)) for s in range(FIRST_SEED, end, PER_CASE)]


def _run_id(config: pytest.Config) -> str:
    workerinput: dict[str, Any] = getattr(config, "workerinput", {})
    return str(workerinput.get("testrunuid", _RUN))


def _report(path: Path, run: str, rows: list[dict[str, Any]]) -> None:
    """Add ``rows`` to the JSON report at ``path`` (a report of another run is replaced)."""
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        kept: list[dict[str, Any]] = []
        if path.exists():
            earlier = json.loads(path.read_text() or "{}")
            if earlier.get("run") == run:
                kept = earlier["rows"]
        seeds = {row["seed"] for row in rows}
        every = sorted([r for r in kept if r["seed"] not in seeds] + rows, key=lambda r: r["seed"])
        report = {"run": run, "summary": summary(every), "rows": every}
        path.write_text(json.dumps(report, indent=1) + "\n")


@pytest.mark.parametrize("seeds", _cases(), ids=lambda r: f"seeds-{r.start}-{r.stop - 1}")
def test_kill9_at_any_step_loses_nothing_and_reports_nothing_twice(
    tmp_path: Path, seeds: range, request: pytest.FixtureRequest
) -> None:
    rows = as_dicts(run_seeds(tmp_path, seeds))
    request.node.user_properties.append(("crash_rows", rows))
    print(f"\n{table(rows)}")
    path = os.environ.get(REPORT_VARIABLE)
    if path:
        _report(Path(path), _run_id(request.config), rows)
    failures = [failure for row in rows for failure in row["failures"]]
    assert not failures, "\n".join([*failures, table(rows)])
    assert [r["seed"] for r in rows if r["lost"] or r["duplicated"]] == [], table(rows)
    assert [r["seed"] for r in rows if not r["hit"]] == [], table(rows)
    # Nothing near the event bound at these sizes: no event may have been discarded.
    assert [r["seed"] for r in rows if r["discarded"]] == [], table(rows)
    assert all(r["events_checked"] > 0 for r in rows)
