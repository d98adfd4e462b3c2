"""The reconciliation methods by name: the one table that every choice of a method reads.

Theory of operation
-------------------
A method is one :class:`~sdsync.reconcile.session.MethodSession` subclass, which says as
class attributes what its callers need to know: ``name`` (its key here, its Store Sync
route, its command-line choice), ``streaming`` (a turn goes on in
:meth:`~sdsync.reconcile.session.ReconcileSession.stream` frames, so a transport sends and
answers it whole), ``cached_symbols`` (it reads coded symbols that its host caches across
sessions) and ``Params`` (its limits: the smallest frame it works with, its default round
limit, and its own, such as RIBLT's most symbols).

:data:`METHODS` maps each name to its class. The in-memory runner, Store Sync (its routes,
initiator and responder), the command line's choices and the tests read it and nothing
else, so a new method is one class and one row here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeAlias

from sdsync.errors import LocalProtocolError
from sdsync.reconcile.prolly import ProllySession
from sdsync.reconcile.rbsr import RbsrSession
from sdsync.reconcile.riblt import RibltSession
from sdsync.reconcile.session import MethodSession

Method: TypeAlias = str
"""A method's name: a key of :data:`METHODS`."""

METHODS: Mapping[Method, type[MethodSession[Any]]] = MappingProxyType(
    {session.name: session for session in (RbsrSession, ProllySession, RibltSession)}
)
"""Every method, by name, in the order the command line offers them."""


def session_class(method: Method) -> type[MethodSession[Any]]:
    """The session class of ``method``; LocalProtocolError for a name not in the table."""
    try:
        return METHODS[method]
    except KeyError:
        raise LocalProtocolError(
            f"unknown reconciliation method {method!r}; use one of {', '.join(METHODS)}"
        ) from None
