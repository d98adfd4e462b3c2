"""`sdsync peer --stdio`: the conformance peer (:mod:`sdsync.peer`) on stdin and stdout.

Replies go to stdout, logs to stderr. The protocol parameters are the ``--profile``'s
(by default ``js-compatible``, the library's :class:`ChannelConfig`), each flag given
overriding its value, except ``--message-id``: the peer derives ids as @waku/sds does
unless told otherwise, so that it interoperates out of the box.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Annotated

import typer

from sdsync.cli.options import (
    DEFAULT_PROFILE,
    BloomCapacity,
    BloomErrorRate,
    CausalHistory,
    LostTimeoutMs,
    PossibleAcksThreshold,
    ProfileOption,
    Repair,
    RepairResponseGroups,
    RepairTMaxMs,
    RepairTMinMs,
    chosen_profile,
    given,
    message_id_scheme,
)
from sdsync.core import ChannelConfig
from sdsync.core.config import MessageIdScheme
from sdsync.errors import LocalProtocolError
from sdsync.runtime import Profile


def peer_config(
    profile: Profile,
    message_id_scheme: MessageIdScheme,
    *,
    causal_history: int | None = None,
    bloom_capacity: int | None = None,
    bloom_error_rate: float | None = None,
    possible_acks_threshold: int | None = None,
    lost_timeout_ms: int | None = None,
    repair: bool | None = None,
    repair_t_min_ms: int | None = None,
    repair_t_max_ms: int | None = None,
    repair_response_groups: int | None = None,
) -> ChannelConfig:
    """The profile's channel with the flags given (not None) over it."""
    base = profile.channel
    bloom = given(capacity=bloom_capacity, error_rate=bloom_error_rate)
    repair_fields = given(
        enabled=repair,
        t_min_ms=repair_t_min_ms,
        t_max_ms=repair_t_max_ms,
        response_groups=repair_response_groups,
    )
    channel_fields = given(
        causal_history_size=causal_history,
        possible_acks_threshold=possible_acks_threshold,
        lost_timeout_ms=lost_timeout_ms,
    )
    return dataclasses.replace(
        base,
        bloom=dataclasses.replace(base.bloom, **bloom),
        repair=dataclasses.replace(base.repair, **repair_fields),
        message_id_scheme=message_id_scheme,
        **channel_fields,
    )


def peer_command(
    participant: Annotated[str, typer.Option(help="Our participant (sender) id.")],
    stdio: Annotated[
        bool, typer.Option("--stdio", help="Speak JSON lines on stdin/stdout.")
    ] = False,
    channel: Annotated[str, typer.Option(help="Channel id.")] = "0",
    profile: ProfileOption = DEFAULT_PROFILE,
    causal_history: CausalHistory = None,
    bloom_capacity: BloomCapacity = None,
    bloom_error_rate: BloomErrorRate = None,
    possible_acks_threshold: PossibleAcksThreshold = None,
    lost_timeout_ms: LostTimeoutMs = None,
    repair: Repair = None,
    repair_t_min_ms: RepairTMinMs = None,
    repair_t_max_ms: RepairTMaxMs = None,
    repair_response_groups: RepairResponseGroups = None,
    message_id: Annotated[
        str,
        typer.Option(
            "--message-id",
            help="Default message ids: 'payload' (sha256 of the payload, as @waku/sds) or"
            " 'sender-lamport-payload' (sdsync's library default, never colliding).",
        ),
    ] = "payload",  # not the library's default: @waku/sds compatible (module doc)
) -> None:
    """Conformance peer: one JSON request per line in, one JSON reply per line out."""
    from sdsync.peer import PeerSession, serve

    if not stdio:
        raise typer.BadParameter("only --stdio is supported", param_hint="--stdio")
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    scheme = message_id_scheme(message_id)
    chosen = chosen_profile(profile)
    try:
        config = peer_config(
            chosen,
            scheme,
            causal_history=causal_history,
            bloom_capacity=bloom_capacity,
            bloom_error_rate=bloom_error_rate,
            possible_acks_threshold=possible_acks_threshold,
            lost_timeout_ms=lost_timeout_ms,
            repair=repair,
            repair_t_min_ms=repair_t_min_ms,
            repair_t_max_ms=repair_t_max_ms,
            repair_response_groups=repair_response_groups,
        )
    except (ValueError, LocalProtocolError) as exc:
        raise typer.BadParameter(str(exc)) from None
    serve(PeerSession(channel, participant, config))
