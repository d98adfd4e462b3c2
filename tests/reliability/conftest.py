"""The crash harness's table for the whole run, at the end of the terminal summary.

Each case of test_crash_harness.py attaches its seeds' rows to its report
(``user_properties``), which reach the xdist controller; this prints them by kill point.
Loaded on the controller when the run names this directory or a file in it.
"""

from __future__ import annotations

from typing import Any

import pytest
from crash_harness import by_kill_point


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    rows: list[dict[str, Any]] = []
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", []):
                if name == "crash_rows":
                    rows.extend(value)
    if rows:
        terminalreporter.write_sep("=", "kill -9 crash harness")
        terminalreporter.write_line(by_kill_point(rows))
