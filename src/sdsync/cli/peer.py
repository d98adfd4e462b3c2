"""`sdsync peer --stdio`: the conformance peer (:mod:`sdsync.peer`) on stdin and stdout.

Replies go to stdout, logs to stderr. The protocol defaults are the library's
(:class:`ChannelConfig`), except ``--message-id``: the peer derives ids as @waku/sds does
unless told otherwise, so that it interoperates out of the box.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from sdsync.core import BloomParams, ChannelConfig, RepairConfig
from sdsync.core.config import MESSAGE_ID_SCHEMES
from sdsync.errors import LocalProtocolError

_CHANNEL = ChannelConfig()
_REPAIR = _CHANNEL.repair
_BLOOM = _CHANNEL.bloom


def peer_command(
    participant: Annotated[str, typer.Option(help="Our participant (sender) id.")],
    stdio: Annotated[
        bool, typer.Option("--stdio", help="Speak JSON lines on stdin/stdout.")
    ] = False,
    channel: Annotated[str, typer.Option(help="Channel id.")] = "0",
    causal_history: Annotated[int, typer.Option(min=0)] = _CHANNEL.causal_history_size,
    bloom_capacity: Annotated[int, typer.Option(min=1)] = _BLOOM.capacity,
    bloom_error_rate: Annotated[float, typer.Option(min=0.0, max=1.0)] = _BLOOM.error_rate,
    possible_acks_threshold: Annotated[int, typer.Option(min=1)] = _CHANNEL.possible_acks_threshold,
    lost_timeout_ms: Annotated[int | None, typer.Option(min=1)] = _CHANNEL.lost_timeout_ms,
    repair: Annotated[bool, typer.Option("--repair/--no-repair", help="SDS-R.")] = _REPAIR.enabled,
    repair_t_min_ms: Annotated[int, typer.Option(min=0)] = _REPAIR.t_min_ms,
    repair_t_max_ms: Annotated[int, typer.Option(min=1)] = _REPAIR.t_max_ms,
    repair_response_groups: Annotated[int, typer.Option(min=1)] = _REPAIR.response_groups,
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
    if message_id not in MESSAGE_ID_SCHEMES:
        choices = " or ".join(MESSAGE_ID_SCHEMES)
        raise typer.BadParameter(f"must be {choices}", param_hint="--message-id")
    try:
        config = ChannelConfig(
            causal_history_size=causal_history,
            bloom=BloomParams(bloom_capacity, bloom_error_rate),
            possible_acks_threshold=possible_acks_threshold,
            lost_timeout_ms=lost_timeout_ms,
            repair=RepairConfig(
                enabled=repair,
                t_min_ms=repair_t_min_ms,
                t_max_ms=repair_t_max_ms,
                response_groups=repair_response_groups,
            ),
            message_id_scheme=message_id,  # checked above
        )
    except (ValueError, LocalProtocolError) as exc:
        raise typer.BadParameter(str(exc)) from None
    serve(PeerSession(channel, participant, config))
