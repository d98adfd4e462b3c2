"""`sdsync demo --quick`: the command runs the quick demo and prints its table."""

from __future__ import annotations

from typer.testing import CliRunner

from sdsync.cli.main import app


def test_demo_converges_and_prints_the_table() -> None:
    result = CliRunner().invoke(app, ["demo", "--quick", "--participants", "4", "--messages", "40"])
    assert result.exit_code == 0, result.output
    assert "converged" in result.output and "same log" in result.output
