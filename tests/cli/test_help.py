"""Every command's ``--help`` at 80 columns (issue 39): no line longer, every flag shown
whole and once, its default and its paragraphs kept; no "(module doc…)" pointers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from sdsync.cli.main import app


def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


ALL = list(commands(get_command(app)))


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(p) for p, _ in ALL])
def test_help_at_80_columns_keeps_every_flag_whole_and_once(
    path: tuple[str, ...], command: Any
) -> None:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert all(len(line) <= 80 for line in out.splitlines()), max(out.splitlines(), key=len)
    assert "module doc" not in out
    heads = [line for line in out.splitlines() if re.match(r"  -", line)]
    assert len(heads) == len(set(heads)), "an option shown twice"
    for param in command.params:
        for flag in (*param.opts, *param.secondary_opts):
            if flag.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out), flag


def test_there_are_commands_to_check() -> None:
    names = {" ".join(path) for path, _ in ALL}
    assert {"chat", "simulate", "store serve", "reliability serve", "pipeline sweep"} <= names
