"""Options shared by several commands: ``--profile``, a named bandwidth profile.

The commands that speak SDS (``chat``, ``peer``, ``simulate``) start from the profile's
parameters (:mod:`sdsync.runtime.profiles`); their own protocol flags, when given,
override the profile's value. An unknown name is a usage error (exit 2) that lists the
known profiles.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sdsync.core.config import MESSAGE_ID_SCHEMES, MessageIdScheme
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


NOT_GIVEN = "default: the profile's"

# The channel's protocol flags, as `sdsync peer` and `sdsync reliability serve` take them:
# None (not given) keeps the profile's value.
CausalHistory = Annotated[int | None, typer.Option(min=0, help=NOT_GIVEN)]
BloomCapacity = Annotated[int | None, typer.Option(min=1, help=NOT_GIVEN)]
BloomErrorRate = Annotated[float | None, typer.Option(min=0.0, max=1.0, help=NOT_GIVEN)]
PossibleAcksThreshold = Annotated[int | None, typer.Option(min=1, help=NOT_GIVEN)]
LostTimeoutMs = Annotated[int | None, typer.Option(min=1, help=NOT_GIVEN)]
Repair = Annotated[bool | None, typer.Option("--repair/--no-repair", help=f"SDS-R ({NOT_GIVEN}).")]
RepairTMinMs = Annotated[int | None, typer.Option(min=0, help=NOT_GIVEN)]
RepairTMaxMs = Annotated[int | None, typer.Option(min=1, help=NOT_GIVEN)]
RepairResponseGroups = Annotated[int | None, typer.Option(min=1, help=NOT_GIVEN)]


def message_id_scheme(value: str) -> MessageIdScheme:
    """``--message-id``'s value as a scheme; a usage error naming the schemes otherwise."""
    if value not in MESSAGE_ID_SCHEMES:
        choices = " or ".join(MESSAGE_ID_SCHEMES)
        raise typer.BadParameter(f"must be {choices}", param_hint="--message-id")
    return value


def chosen_profile(name: str) -> Profile:
    """The profile ``--profile`` names; a usage error listing the known ones otherwise."""
    try:
        return profile(name)
    except LocalProtocolError as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from None


def given(**values: Any) -> dict[str, Any]:
    """The flags given (not None), to lay over a profile's fields with ``replace``."""
    return {name: value for name, value in values.items() if value is not None}
