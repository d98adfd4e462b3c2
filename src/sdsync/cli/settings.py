"""A command's options made from a table of settings (:class:`~sdsync.store.settings.Setting`),
so the command line repeats no default, bound or help text of the table.

Typer reads a command's options from its function's signature; :func:`with_settings`
gives the function one — its own parameters, then an option per setting — and the
function takes the settings' values as ``**settings``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from sdsync.store.settings import Setting

__all__ = ["with_settings"]

F = TypeVar("F", bound=Callable[..., Any])


def with_settings(settings: Iterable[Setting], *, after: Iterable[str] = ()) -> Callable[[F], F]:
    """Give the decorated function an option per setting, after its own parameters
    except those named in ``after`` (which follow the settings)."""

    def decorate(func: F) -> F:
        own = list(inspect.signature(func, eval_str=True).parameters.values())
        own = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]
        first = [p for p in own if p.name not in after]
        last = [p for p in own if p.name in after]
        params = [*first, *(_parameter(s) for s in settings), *last]
        func.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return func

    return decorate


def _parameter(setting: Setting) -> inspect.Parameter:
    kind: Any = _choices(setting) if setting.choices else setting.kind
    default = kind(setting.default) if setting.choices else setting.default
    if setting.repeatable:
        kind = list[kind] | None
    elif setting.default is None:
        kind = kind | None
    info = typer.Option(
        *([setting.flag] if setting.switch else []),
        help=setting.help
        + (f" [default: {setting.shown_default}]" if setting.shown_default else ""),
        min=setting.minimum,
        metavar=setting.metavar,
        envvar=setting.envvar,
        dir_okay=setting.kind is not Path or setting.name.endswith("_dir"),
        file_okay=setting.kind is not Path or not setting.name.endswith("_dir"),
    )
    return inspect.Parameter(
        setting.name,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=default,
        annotation=Annotated[kind, info],
    )


def _choices(setting: Setting) -> type[StrEnum]:
    """An enum of the setting's choices: Typer lists and checks an enum's values."""
    title = "".join(part.title() for part in setting.name.split("_"))
    return StrEnum(title, [(choice, choice) for choice in setting.choices])  # type: ignore[return-value]
