"""When to dial a configured peer again, and what to tell the user about it (sans-I/O).

Theory of operation
-------------------
A node keeps dialling the peers it was given (``--peer``, ``--relay-peer``, a chat's
``--store``): they may start later, restart, or drop the connection.  Each peer not
connected is dialled when its *retry time* comes: at once the first time, then after a
delay that doubles from ``min_s`` to ``max_s`` while the dials fail, and starts over at
``min_s`` once the peer is connected again.  So a node that comes back after a restart
is found within ``max_s`` (plus a dial), and a peer that is gone for good costs one dial
every ``max_s``.

What the user sees is one line per change, never one per dial: when a peer that was
connected (or never was) cannot be reached, with the reason; when it is reached again,
after how long; and, when the peer at the address answers with another identity than the
``/p2p/<id>`` we dial (its operator rotated its node key, or another node took the
address), which id answered — once per id that answers — since no retry can fix that:
the user must be given the new address.

The caller carries out the dials and passes ``now`` (monotonic seconds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Redial", "answered_as"]

# py-libp2p's Noise handshake names the id the remote's key gives, when it is not the one
# dialled: "... remote_peer=<dialled>, remote_peer_id_from_pubkey=<answered>".
_ANSWERED = re.compile(r"remote_peer_id_from_pubkey=(\w+)")


def answered_as(exc: BaseException) -> str | None:
    """The peer id that answered instead of the one dialled, if ``exc`` (or what caused
    it, or a failure grouped in it) says so."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        match = _ANSWERED.search(str(current))
        if match is not None:
            return match[1]
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
        # Grouped failures: an ExceptionGroup's, and py-libp2p's MultiError (one per
        # address dialled) in its ``errors``.
        grouped = current.exceptions if isinstance(current, BaseExceptionGroup) else ()
        grouped = (*grouped, *getattr(current, "errors", ()))
        pending += [e for e in grouped if isinstance(e, BaseException)]
    return None


@dataclass
class _Peer:
    delay_s: float
    retry_at: float = 0.0
    down_since: float | None = None  # None: connected, or never tried
    announced: bool = False  # the "cannot reach" line was said for this outage
    impostors: frozenset[str] = frozenset()


class Redial:
    """The retry times of the peers a node keeps dialling, and the lines worth saying."""

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s, self.max_s = min_s, max(min_s, max_s)
        self._peers: dict[str, _Peer] = {}

    def due(self, peer: str, now: float) -> bool:
        """Whether ``peer`` (not connected) should be dialled now."""
        return now >= self._peer(peer).retry_at

    def failed(self, peer: str, now: float, exc: BaseException) -> str | None:
        """A dial of ``peer`` failed with ``exc``: the next retry time, and the line to
        say, if this is news."""
        state = self._peer(peer)
        state.retry_at = now + state.delay_s
        state.delay_s = min(state.delay_s * 2, self.max_s)
        if state.down_since is None:
            state.down_since = now
        other = answered_as(exc)
        if other is not None and other not in state.impostors:
            state.impostors |= {other}
            state.announced = True
            return (
                f"expected peer {peer} but {other} answered at its address: the node's "
                "identity changed (a new node key?); dial its new address"
            )
        if state.announced:
            return None
        state.announced = True
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return f"cannot reach peer {peer} ({reason}); redialling every {self.max_s:g} s at most"

    def connected(self, peer: str, now: float) -> str | None:
        """``peer`` is connected (by our dial or theirs): the line to say if it was down."""
        state = self._peer(peer)
        line = None
        if state.down_since is not None and state.announced:
            line = f"reached peer {peer} again after {now - state.down_since:.1f} s"
        self._peers[peer] = _Peer(self.min_s)
        return line

    def _peer(self, peer: str) -> _Peer:
        return self._peers.setdefault(peer, _Peer(self.min_s))
