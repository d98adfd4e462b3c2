"""Named bandwidth profiles: a channel's protocol parameters and timing, chosen together.

Theory of operation
-------------------
Most of an SDS message is its bloom filter: at the default 10,000 ids and a 0.1 % error
rate it is 18,752 bytes, whatever the payload. A :class:`Profile` names one
:class:`~sdsync.core.ChannelConfig` and one :class:`RuntimeConfig` so that an application
(or ``sdsync chat --profile``) picks a trade-off by name instead of tuning fields one by
one:

* ``js-compatible`` — the library's defaults, which are @waku/sds's: its messages are the
  bytes a js-waku participant sends and expects;
* ``lean`` — for large groups: a smaller bloom filter, a shorter causal history, and a
  sync interval that grows with the group once the application tells the channel its
  size (``set_participant_count``), so each message and the group's syncs cost less.

Every participant of a channel must use the same bloom filter size: a filter of another
size is ignored (counted in ``MessageChannel.stats.bloom_ignored`` as "wrong size"), so
that peer's filters never acknowledge anything. In practice the whole group uses one
profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sdsync.core import BloomParams, ChannelConfig
from sdsync.errors import LocalProtocolError
from sdsync.runtime.policy import RuntimeConfig


@dataclass(frozen=True, slots=True)
class Profile:
    """A named pair of channel and runtime configuration."""

    name: str
    description: str  # one line, for listings and --help
    channel: ChannelConfig
    runtime: RuntimeConfig


_DEFAULTS = ChannelConfig()
JS_COMPATIBLE = Profile(
    "js-compatible",
    f"the defaults, wire-identical with @waku/sds ({_DEFAULTS.bloom.n_bytes:,}-byte bloom filter)",
    _DEFAULTS,
    RuntimeConfig(),
)

# Chosen by measurement (docs/evidence.md, sweeps "bloom filter and causal history" and
# "profiles"): the filter's capacity changed neither delivery, time to consistency nor
# false acknowledgements from 64 to 10,000 ids (acknowledgements come from causal
# histories first), so 1,000 at 1 % keeps headroom for busier groups at a fifteenth of
# the default's bytes; a causal history of 2 leaves messages that only a store catch-up
# finds and a long tail, 10 has neither, 200 only costs bytes; and the group-scaled
# sync interval is what every simulated group of 100 and more ran with.
_LEAN_BLOOM = BloomParams(capacity=1_000, error_rate=0.01)
LEAN = Profile(
    "lean",
    f"large groups: {_LEAN_BLOOM.n_bytes:,}-byte bloom filter, causal history 10, "
    "sync interval growing with the group",
    ChannelConfig(causal_history_size=10, bloom=_LEAN_BLOOM),
    RuntimeConfig(sync_ms_per_participant=600),
)

PROFILES: Mapping[str, Profile] = MappingProxyType({p.name: p for p in (JS_COMPATIBLE, LEAN)})


def profile(name: str) -> Profile:
    """The profile called ``name``; :class:`LocalProtocolError` naming the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(PROFILES)
        raise LocalProtocolError(f"unknown profile {name!r}; known profiles: {known}") from None
