"""make check's promise (tests/noprocess.py): under ``--no-processes`` a test marked
``processes`` is left out, and one that starts a process unmarked fails, even if it
catches the failure. Run on a throwaway test file outside the project (which the
plugin's reading of the project's code does not cover, so only the audit hook stands
between it and a silent process) in a pytest of its own: a process, so this test is
itself make test's only. The reading itself is checked by every make check run: a test
it misses fails there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

THROWAWAY = """
import importlib

import pytest

def test_plain():
    assert 1 + 1 == 2

@pytest.mark.processes
def test_says_so():
    import subprocess
    subprocess.run(["true"], check=True)

def test_hides_it():
    spawn = getattr(importlib.import_module("sub" + "process"), "run")
    spawn(["true"], check=True)

def test_hides_it_and_swallows_the_failure():
    spawn = getattr(importlib.import_module("sub" + "process"), "run")
    try:
        spawn(["true"], check=True)
    except BaseException:
        pass
"""


def run_throwaway(tmp_path: Path, *options: str) -> str:
    (tmp_path / "test_throwaway.py").write_text(THROWAWAY)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's options
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "noprocess", "-rA", "-q", *options, "."],
        cwd=tmp_path,
        env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.stdout + result.stderr


def test_no_processes_leaves_out_what_says_so_and_fails_what_hides_it(tmp_path: Path) -> None:
    out = run_throwaway(tmp_path, "--no-processes")
    assert "PASSED test_throwaway.py::test_plain" in out
    assert "test_says_so" not in out
    assert "1 deselected" in out
    for name in ("test_hides_it", "test_hides_it_and_swallows_the_failure"):
        assert f"FAILED test_throwaway.py::{name}" in out, out
    assert "mark the test @pytest.mark.processes" in out
    assert "2 failed, 1 passed, 1 deselected" in out, out


def test_without_the_option_every_test_runs(tmp_path: Path) -> None:
    out = run_throwaway(tmp_path)
    assert "4 passed" in out, out
