"""Per-channel protocol parameters; defaults follow js-waku where it is right."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sdsync.core.bloom import BloomParams
from sdsync.core.missing import largest_missing_charge
from sdsync.errors import LocalProtocolError
from sdsync.wire import DEFAULT_LIMITS, WireLimits

OwnLogPolicy = Literal["on_send", "on_ack"]
MessageIdScheme = Literal["sender-lamport-payload", "payload"]
MESSAGE_ID_SCHEMES: tuple[MessageIdScheme, ...] = ("sender-lamport-payload", "payload")
#: What a waiting message is charged per unmet dependency, besides twice its encoded
#: size (the bytes kept and the decoded copy): the dependency's decoded history entry
#: and its places in the unmet set and the dependency -> waiters index. Measured at
#: 480-670 bytes with 64-character ids; a little over, so the budget bounds real memory.
UNMET_DEPENDENCY_BYTES = 768


@dataclass(frozen=True, slots=True)
class RepairConfig:
    """SDS-R: timing windows and response groups (REFERENCE §3)."""

    enabled: bool = True
    t_min_ms: int = 30_000
    t_max_ms: int = 120_000
    response_groups: int = 1
    buffer_size: int = 1_000
    max_requests_per_message: int = 3
    # Full wire bytes are kept for this many of the most recent log entries so that we
    # can answer repair requests; older messages are left to store nodes.
    cache_size: int = 1_000
    # A received sync message's bloom filter is checked against this many of our newest
    # log entries older than t_min_ms (by the sync's Lamport timestamp); the ones it lacks
    # are rebroadcast like SDS-R responses, since nothing may ever name them to that peer
    # again (0: off).
    sync_repair_window: int = 128

    def __post_init__(self) -> None:
        if not 0 <= self.t_min_ms < self.t_max_ms:
            raise LocalProtocolError("repair needs 0 <= t_min_ms < t_max_ms")
        if self.response_groups < 1 or self.buffer_size < 1 or self.cache_size < 0:
            raise LocalProtocolError("repair response groups and buffer size must be positive")
        if self.sync_repair_window < 0:
            raise LocalProtocolError("sync_repair_window must be >= 0")


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """Everything a MessageChannel needs to know besides its identity."""

    causal_history_size: int = 200
    bloom: BloomParams = field(default_factory=BloomParams)
    bloom_rollover: bool = True
    # Distinct peers whose bloom filters must hold a message before it counts as
    # acknowledged; never more than the other participants the channel has heard from, so
    # in a two-member channel the one other member's filter is enough.
    possible_acks_threshold: int = 2
    # A received filter whose fill implies a false-positive rate above this gives no ack
    # evidence (10x the agreed rate by default: such a filter is far past its capacity).
    max_bloom_false_positive_rate: float = 0.01
    lost_timeout_ms: int | None = None
    # Content whose Lamport timestamp (ms) is this far beyond our clock is dropped: one such
    # message would otherwise push every later timestamp of ours out of everyone's range.
    max_lamport_skew_ms: int | None = 24 * 3600 * 1000
    # The incoming buffer is capped twice: messages waiting, and the bytes they hold as
    # incoming_charge() counts them (an upper bound of what Python holds). A message naming
    # 4,096 dependencies that never arrive holds ~3 MB, so the count alone let one peer pin
    # ~30 GB. 64 MiB holds ~1,400 waiting chat messages (200-entry histories, ~48 kB
    # charged each: a gap of minutes in a busy channel) but only 12 maximum-size ones
    # naming 4,096 missing ids (~5 MiB each). At either cap the waiting message with the
    # most unmet dependencies gives way, the oldest among equals (MessageEvicted; a
    # newcomer that would be the one is refused: MessageDropped). Validated to hold at
    # least one message of the largest size peers may send.
    max_incoming_buffer: int = 10_000
    max_incoming_buffer_bytes: int = 64 << 20
    # Ids named in causal histories that we never received, tracked until they arrive, are
    # marked met or are declared lost; beyond this many, or these many bytes as
    # sdsync.core.missing.missing_charge counts them, the oldest is evicted (reported:
    # MessageMissingEvicted). 16 MiB holds 10,000 entries of ASCII ids up to the wire's
    # 256 characters (~1.5 kB charged each; 64-character ids ~650 B), so it bites before
    # the count only on ids of wide characters (~3.8 kB each: ~4,400 fit). Validated to
    # hold at least one entry of the largest size peers may name.
    max_known_missing: int = 10_000
    max_known_missing_bytes: int = 16 << 20
    # Our unacknowledged messages; at the cap ``send`` raises OutgoingBufferFullError.
    max_outgoing_buffer: int = 5_000
    # Entries beyond this many leave memory for the HistoryStore (which still answers
    # "have we seen it?"); causal histories, repairs and id-collision checks only ever
    # need the newest entries, and memory stays flat however long the log grows.
    max_log_entries: int = 10_000
    own_log_policy: OwnLogPolicy = "on_send"
    # How ``send`` derives an id when the caller gives none: "sender-lamport-payload" (see
    # sdsync.wire.message_id_for_sender; the same bytes sent twice are two messages) or
    # js-waku's "payload" (sha256 of the payload alone, which collides).
    message_id_scheme: MessageIdScheme = "sender-lamport-payload"
    # Also report a message that must wait for its dependencies as soon as it arrives
    # (MessageDeliveredEarly), as the reliability API proposal suggests for chat UIs.
    deliver_early: bool = False
    repair: RepairConfig = field(default_factory=RepairConfig)
    limits: WireLimits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        if self.causal_history_size < 0:
            raise LocalProtocolError("causal_history_size must be >= 0")
        if self.possible_acks_threshold < 1:
            raise LocalProtocolError("possible_acks_threshold must be >= 1")
        if self.lost_timeout_ms is not None and self.lost_timeout_ms <= 0:
            raise LocalProtocolError("lost_timeout_ms must be positive (or None to disable)")
        caps = (
            self.max_incoming_buffer,
            self.max_log_entries,
            self.max_known_missing,
            self.max_outgoing_buffer,
        )
        if min(caps) < 1:
            raise LocalProtocolError("buffer and log caps must be positive")
        largest = incoming_charge(self.limits.max_message_bytes, self.limits.max_causal_history)
        if self.max_incoming_buffer_bytes < largest:
            raise LocalProtocolError(
                f"max_incoming_buffer_bytes must be at least {largest}: a message of the"
                " largest size peers accept (limits) could never wait otherwise"
            )
        largest_gap = largest_missing_charge(self.limits)
        if self.max_known_missing_bytes < largest_gap:
            raise LocalProtocolError(
                f"max_known_missing_bytes must be at least {largest_gap}: a missing id of"
                " the largest size peers accept (limits) could never be tracked otherwise"
            )
        if self.causal_history_size > self.limits.max_causal_history:
            raise LocalProtocolError("causal_history_size exceeds what peers accept")
        if self.own_log_policy not in ("on_send", "on_ack"):
            raise LocalProtocolError(f"unknown own_log_policy {self.own_log_policy!r}")
        if self.message_id_scheme not in MESSAGE_ID_SCHEMES:
            raise LocalProtocolError(f"unknown message_id_scheme {self.message_id_scheme!r}")


def incoming_charge(encoded_bytes: int, unmet_dependencies: int) -> int:
    """Bytes a message waiting in the incoming buffer counts against
    ``max_incoming_buffer_bytes``."""
    return 2 * encoded_bytes + UNMET_DEPENDENCY_BYTES * unmet_dependencies
