"""One class for "try again later": every unavailable condition is a ServiceUnavailable,
and keeps the standard base its callers already catch (issue 36)."""

from __future__ import annotations

import pytest

from sdsync.errors import (
    LocalProtocolError,
    ProtocolNotSupportedError,
    RemoteProtocolError,
    SdsError,
    ServiceUnavailable,
)
from sdsync.store.archive import ArchiveUnavailable
from sdsync.store.served import QueriesBusy
from sdsync.transport.waku_light import NoServiceError
from sdsync.waku.rpc import LightServiceError, ServiceRefusedError
from sdsync.waku.store.client import StoreUnavailableError

UNAVAILABLE: list[tuple[Exception, type[BaseException] | None]] = [
    (StoreUnavailableError("store: HTTP 503"), OSError),
    (ArchiveUnavailable("database is locked"), None),
    (QueriesBusy("64 queries in flight"), None),
    (LightServiceError("no service"), ConnectionError),
    (ServiceRefusedError("svc", "/vac/waku/lightpush/3.0.0", 429, "too many"), ConnectionError),
    (NoServiceError("a LightPush", []), ConnectionError),
]


@pytest.mark.parametrize(("error", "also"), UNAVAILABLE, ids=lambda v: type(v).__name__)
def test_every_try_again_later_error_is_one_catchable_class(
    error: Exception, also: type[BaseException] | None
) -> None:
    with pytest.raises(ServiceUnavailable):
        raise error
    if also is not None:
        assert isinstance(error, also)
    # Nobody's fault: neither our caller's misuse nor a peer's bad data.
    assert not isinstance(error, SdsError)


def test_faults_and_a_peer_without_the_protocol_are_not_unavailable() -> None:
    for error in (
        LocalProtocolError("misuse"),
        RemoteProtocolError("garbage"),
        ProtocolNotSupportedError("peer", "/x/1"),  # asking it again will not help
    ):
        assert not isinstance(error, ServiceUnavailable)
