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
* ``lean`` — for large groups: a smaller bloom filter, a shorter causal history and rarer
  syncs, so each message and the sync traffic of the whole group cost less.

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

# chosen by measurement: docs/evidence.md
_LEAN_BLOOM = BloomParams(capacity=1_000, error_rate=0.01)
LEAN = Profile(
    "lean",
    f"large groups: {_LEAN_BLOOM.n_bytes:,}-byte bloom filter, short causal history, rare syncs",
    ChannelConfig(
        causal_history_size=10,  # chosen by measurement: docs/evidence.md
        bloom=_LEAN_BLOOM,
    ),
    RuntimeConfig(sync_interval_ms=60_000),  # chosen by measurement: docs/evidence.md
)

PROFILES: Mapping[str, Profile] = MappingProxyType({p.name: p for p in (JS_COMPATIBLE, LEAN)})


def profile(name: str) -> Profile:
    """The profile called ``name``; :class:`LocalProtocolError` naming the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(PROFILES)
        raise LocalProtocolError(f"unknown profile {name!r}; known profiles: {known}") from None
