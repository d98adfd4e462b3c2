"""How a command stops on an error it can explain: one ``error: …`` line, then its exit code.

Every command says it the same way, so that scripts and people read one format: red
``error:`` and the message as it is (escaped, because messages quote things like
``[network]`` or ``sdsync[spark]`` that rich would take for markup), on one line however
long (``soft_wrap``: paths and URLs stay whole when piped).
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape


def fail(message: str, code: int = 2, *, console: Console | None = None) -> typer.Exit:
    """Print ``message`` as an error (on stderr, or on ``console``: one that is showing a
    status keeps it tidy); return the exit to raise. Code 2 is bad input or usage."""
    target = console if console is not None else Console(stderr=True)
    target.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)
