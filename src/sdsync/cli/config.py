"""A command's options from a TOML file (``--config``), and the effective ones printed back
(``--print-config``).

Every option of the command is a key of the file, spelled as its flag without the dashes
(``relay-shard = [7]``, ``lightpush-rate-limit = "10/1s"``; ``relay_shard`` works too),
a flag ``true`` or ``false``.  The file's values become the options' defaults, so a flag
on the command line still wins, and an environment variable (``SDSYNC_STORE_TOKEN``,
``SDSYNC_NODEKEY``) wins over the file: secrets need not be written into it.  A key the
command does not have, or a value its option refuses, is an error naming the file and the
key, before anything starts.

``--print-config`` prints what the command would run with — file, environment and flags
applied, in the file's format — and exits; secrets are left out (a comment says which are
set), so the output can be kept as a configuration file.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import typer

__all__ = ["effective_config", "load_config"]

# Parameters that are about the run of the command, not the node: never keys of the file.
NOT_KEYS = frozenset({"config_file", "print_config", "help"})


def load_config(ctx: typer.Context, path: Path | None) -> None:
    """Make the options of ``path`` the defaults of ``ctx``'s command (an eager callback)."""
    if path is None:
        return
    try:
        document = tomllib.loads(path.expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"{path} is not TOML: {exc}") from None
    params = {p.name: p for p in ctx.command.params if p.name not in NOT_KEYS}
    defaults: dict[str, Any] = {}
    for key, value in document.items():
        name = key.replace("-", "_")
        param = params.get(name)
        if param is None:
            raise typer.BadParameter(f"{path}: {_unknown(key, params)}")
        try:
            _check(param, ctx, value)
        except Exception as exc:  # click's BadParameter and the type's own errors
            message = getattr(exc, "message", None) or str(exc)
            raise typer.BadParameter(f"{path}: {key} = {value!r}: {message}") from None
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def _check(param: Any, ctx: typer.Context, value: Any) -> None:
    """``value`` as ``param`` would take it from the command line, or its error."""
    if (param.multiple or param.nargs != 1) and not isinstance(value, list):
        raise TypeError("expected an array (the option is repeatable)")
    param.process_value(ctx, value)


def _unknown(key: str, params: Mapping[str, Any]) -> str:
    known = [name.replace("_", "-") for name in params]
    close = difflib.get_close_matches(key.replace("_", "-"), known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"no option {key!r}{hint}; every key is an option of the command, without '--'"


def effective_config(ctx: typer.Context, secrets: Iterable[str]) -> str:
    """The command's effective options as a TOML file, in its order, secrets left out."""
    hidden = set(secrets)
    lines = [f"# {ctx.command_path}: the effective configuration (--print-config)"]
    for param in ctx.command.params:
        name = param.name
        if name is None or name in NOT_KEYS or name not in ctx.params:
            continue
        key, value = name.replace("_", "-"), ctx.params[name]
        if name in hidden:
            if value is not None:
                lines.append(f"# {key}: set, not shown (give it by its environment variable)")
            continue
        rendered = _toml(value)
        lines.append(f"{key} = {rendered}" if rendered is not None else f"# {key}: not set")
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str | None:
    """A TOML value: JSON spells strings, numbers, booleans and arrays of them the same."""
    if value is None:
        return None
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, (list, tuple)):
        items = [_toml(v) for v in value]
        return "[" + ", ".join(i for i in items if i is not None) + "]"
    if hasattr(value, "value"):  # an enum
        return json.dumps(value.value)
    return json.dumps(value)
