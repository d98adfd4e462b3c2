"""The `sdsync` command: the app, and each command's module registered on it."""

from __future__ import annotations

import typer

from sdsync.cli.chat import chat_command
from sdsync.cli.demo import demo_command
from sdsync.cli.help import LISTED
from sdsync.cli.peer import peer_command
from sdsync.cli.pipeline import pipeline_app
from sdsync.cli.reliability import reliability_app
from sdsync.cli.simulate import simulate_command
from sdsync.cli.store import store_app

app = typer.Typer(
    help="Scalable Data Sync for distributed logs.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("demo", cls=LISTED)(demo_command)
app.command("peer", cls=LISTED)(peer_command)
app.command("simulate", cls=LISTED)(simulate_command)
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(store_app, name="store")
app.add_typer(reliability_app, name="reliability")
app.command("chat", cls=LISTED)(chat_command)
