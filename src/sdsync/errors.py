"""Errors that say whose fault they are.

Every failure sdsync reports is an :class:`SdsError`. It is always one of two kinds:

* :class:`LocalProtocolError` — *our caller* misused the API (an empty payload, an
  unknown message id, a bad option). Fix the calling code.
* :class:`RemoteProtocolError` — *a remote peer* sent data we cannot accept (malformed
  bytes, oversized frames, wrong field sizes, an impossible message kind). Drop it and
  carry on; it changes no state.

Code that decodes untrusted input lets nothing but :class:`RemoteProtocolError` escape.
"""

from __future__ import annotations

from typing import Literal


class SdsError(Exception):
    """Base class of every error raised by sdsync."""

    kind: Literal["local", "remote"]


class LocalProtocolError(SdsError):
    """The local caller broke the API contract; state is unchanged."""

    kind = "local"


class RemoteProtocolError(SdsError):
    """A remote peer sent data that violates the protocol; state is unchanged."""

    kind = "remote"


class OutgoingBufferFullError(LocalProtocolError):
    """The outgoing buffer holds as many unacknowledged messages as it may; nothing was sent.

    Wait for acknowledgements (or give up on old messages) and send again.
    """
