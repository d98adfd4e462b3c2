"""Errors that say whose fault they are.

Every failure sdsync reports is an :class:`SdsError`. It is always one of two kinds:

* :class:`LocalProtocolError` — *our caller* misused the API (an empty payload, an
  unknown message id, a bad option). Fix the calling code. :class:`InputError` is the
  same kind of fault in the pipeline's inputs: a file the caller named is unreadable or
  has the wrong columns (exit code 2).
* :class:`RemoteProtocolError` — *a remote peer* sent data we cannot accept (malformed
  bytes, oversized frames, wrong field sizes, an impossible message kind). Drop it and
  carry on; it changes no state.

A third family is nobody's fault and not an :class:`SdsError`: something we depend on is
*unavailable* — a peer or store that cannot be reached or is busy
(:class:`sdsync.store.client.StoreUnavailableError`, an ``OSError``), a database that
fails. Retry later; what was done before the failure stays done.

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


class InputError(SdsError):
    """Bad input files: unreadable, a missing column, a wrong type. Exit code 2.

    The caller's fault, like :class:`LocalProtocolError`, but reported with the file
    (``path``) and ``column`` where known, and kept apart from API misuse.
    """

    kind = "local"

    def __init__(self, message: str, *, path: str | None = None, column: str | None = None):
        super().__init__(message)
        self.path = path
        self.column = column
