"""Options shared by several commands: ``--profile``, a named bandwidth profile.

The commands that speak SDS (``chat``, ``peer``, ``simulate``) start from the profile's
parameters (:mod:`sdsync.runtime.profiles`); their own protocol flags, when given,
override the profile's value. An unknown name is a usage error (exit 2) that lists the
known profiles.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sdsync.errors import LocalProtocolError
from sdsync.runtime import PROFILES, Profile, profile

DEFAULT_PROFILE = "js-compatible"

_LISTING = "; ".join(f"{p.name}: {p.description}" for p in PROFILES.values())
PROFILE_HELP = (
    f"named bandwidth profile ({_LISTING}). Every participant of a channel must use the "
    "same bloom filter size, so in practice the same profile: a filter of another size "
    "gives no acknowledgement evidence. Protocol flags given beside it override it."
)

ProfileOption = Annotated[
    str, typer.Option("--profile", metavar="NAME", help=f"The {PROFILE_HELP}")
]


def chosen_profile(name: str) -> Profile:
    """The profile ``--profile`` names; a usage error listing the known ones otherwise."""
    try:
        return profile(name)
    except LocalProtocolError as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from None


def given(**values: Any) -> dict[str, Any]:
    """The flags given (not None), to lay over a profile's fields with ``replace``."""
    return {name: value for name, value in values.items() if value is not None}
