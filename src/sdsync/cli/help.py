"""``--help`` for a command with many options: one panel per concern, each option on a line
of its own with its whole name, its value, default and environment variable, and its help
wrapped beneath.

A table of 40 options squeezed into 80 columns cuts names and defaults short; a list
never does, at any width.  The panels are named beside the command (``panels``); a
parameter no panel names goes under "Other options", and ``tests/cli`` fails when one of
``sdsync store serve``'s does.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperCommand

__all__ = ["LISTED", "Panels", "panelled", "render_help"]

Panels = Sequence[tuple[str, Sequence[str]]]
"""Panel titles, in order, each with the parameter names it holds, in order."""

MIN_WIDTH, MAX_WIDTH = 60, 100
INDENT = "      "


def panelled(panels: Panels) -> type[TyperCommand]:
    """A command class whose help lists its options in ``panels``."""

    class PanelledCommand(TyperCommand):
        def format_help(self, ctx: Any, formatter: Any) -> None:
            formatter.write(render_help(self, ctx, panels))

    return PanelledCommand


def render_help(command: Any, ctx: typer.Context, panels: Panels, width: int | None = None) -> str:
    """The help text of ``command``: usage, its docstring, then each panel."""
    if width is None:
        width = shutil.get_terminal_size((80, 24)).columns
    width = max(MIN_WIDTH, min(width, MAX_WIDTH))
    lines = [f"Usage: {' '.join([ctx.command_path, *command.collect_usage_pieces(ctx)])}", ""]
    for paragraph in re.split(r"\n\s*\n", command.help or ""):
        if paragraph.strip() and paragraph.strip() != "\b":
            lines += [*_wrapped(paragraph.replace("\b", ""), width - 2, "  "), ""]
    options = {p.name: p for p in command.get_params(ctx) if getattr(p, "opts", None)}
    others = [name for name in options if name not in _named(panels)]
    for title, names in (*panels, ("Other options" if panels else "Options", others)):
        shown = [options[n] for n in names if n in options]
        if not shown:
            continue
        lines.append(f"{title}:")
        for param in shown:
            lines += _option(param, ctx, width)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _named(panels: Panels) -> set[str]:
    return {name for _, names in panels for name in names}


def _option(param: Any, ctx: typer.Context, width: int) -> list[str]:
    """``--name VALUE`` on a line of its own, then its help, default and environment
    variable (as click words them) wrapped beneath."""
    record = param.get_help_record(ctx)
    if record is None:  # hidden
        return []
    names, text = record
    return [f"  {names}", *_wrapped(text, width, INDENT)]


def _wrapped(text: str, width: int, indent: str) -> list[str]:
    """``text`` as one paragraph, never broken inside a flag or a word."""
    return textwrap.wrap(
        " ".join(text.split()),
        width,
        initial_indent=indent,
        subsequent_indent=indent,
        break_on_hyphens=False,
        break_long_words=False,
    )


LISTED = panelled(())
"""A command class whose help lists its options one by one, in one panel."""
