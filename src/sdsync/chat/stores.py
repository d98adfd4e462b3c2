"""The store nodes a chat fetches missing messages from (``--store``).

Theory of operation
-------------------
A ``--store`` value names a store node one of two ways: an ``http(s)://`` base URL is its
REST API (:class:`~sdsync.store.HttpStoreClient`), a libp2p multiaddr with ``/p2p/<id>``
(TCP or websocket) is a Waku store peer, asked over ``/vac/waku/store-query/3.0.0``
through the chat's own transport (:meth:`~sdsync.store.WakuStoreClient.over`), which
dials it when asked. :func:`store_kind` tells which, and refuses anything else before the
chat starts (exit 2). :func:`refuse_stores_without_v3` asks each Waku store peer once at
start, and refuses one that is reachable but does not speak store v3 (go-waku 0.9.0
serves only the legacy ``/vac/waku/store/2.0.0-beta4``): asking it all run long would
only ever fetch nothing. One that cannot be reached yet is let be: it may come.

:class:`StoreChoice` is the runtime's StoreClient for all of them: each fetch or catch-up
asks the stores in the order given and moves on to the next only while one is unavailable
(unreachable, too slow, or busy: an ``OSError``; a catch-up cut off midway starts over at
the next store, which fetches none of what the first one brought: the channel has seen
it); when none answers the last error goes to the runtime, which asks again on its next
store query or catch-up. It counts what it fetched and caught up, for the chat's closing
report.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from sdsync.errors import (
    LocalProtocolError,
    OptionError,
    ProtocolNotSupportedError,
    RemoteProtocolError,
)
from sdsync.lifecycle import AsyncLifecycle
from sdsync.waku.node import Received, WakuRequester
from sdsync.waku.store.rpc import MAX_STORE_RESPONSE_BYTES, STORE_QUERY_PROTOCOL, StoreQueryRequest
from sdsync.wire import HistoryEntry

if TYPE_CHECKING:
    from sdsync.waku.store.client import StoreQueries

logger = logging.getLogger("sdsync.chat")

StoreKind = Literal["rest", "waku"]
PROBE_TIMEOUT_S = 5.0


def store_kind(value: str) -> StoreKind:
    """``"rest"`` for an http(s) URL, ``"waku"`` for a multiaddr of a peer; a value that is
    neither is the caller's mistake (LocalProtocolError)."""
    if value.startswith("/"):
        check_peer_address("stores", value)
        return "waku"
    url = urlsplit(value)
    if url.scheme in ("http", "https") and url.netloc:
        return "rest"
    raise OptionError(
        "stores",
        f"{value!r} is neither an http(s) URL (a store's REST API, e.g. "
        "http://127.0.0.1:8645) nor a libp2p multiaddr of a Waku store peer "
        "(/ip4/HOST/tcp/PORT/p2p/PEER_ID)",
    )


def check_peer_address(option: str, value: str) -> None:
    """Refuse (OptionError) a value of ``option`` that is no multiaddr of a peer."""
    import multiaddr  # the p2p extra, which the chat needs anyway

    try:
        peer_id = multiaddr.Multiaddr(value).get_peer_id()
    except Exception as exc:
        raise OptionError(option, f"{value!r} is not a multiaddr: {exc}") from None
    if peer_id is None:
        raise OptionError(
            option, f"{value!r} names no peer: end it with /p2p/PEER_ID, as a node prints it"
        )


async def refuse_stores_without_v3(
    stores: Sequence[tuple[str, str]], transport: WakuRequester
) -> None:
    """Ask each Waku store peer of ``stores`` (option, value) for one hash: OptionError
    naming the first that is reachable but does not speak store v3."""
    probe = StoreQueryRequest(request_id=uuid.uuid4().hex, pagination_limit=1).to_bytes()
    for option, value in stores:
        if store_kind(value) != "waku":
            continue
        try:
            await transport.request(
                value,
                STORE_QUERY_PROTOCOL,
                probe,
                max_response_bytes=MAX_STORE_RESPONSE_BYTES,
                timeout_s=PROBE_TIMEOUT_S,
            )
        except ProtocolNotSupportedError:
            raise OptionError(
                option,
                f"{value} does not serve Waku store v3 ({STORE_QUERY_PROTOCOL}; go-waku "
                "serves only the legacy store): name a store v3 peer as a store",
            ) from None
        except (OSError, RemoteProtocolError) as exc:  # not there yet, perhaps: asked again
            logger.info("store %s did not answer at start: %s", value, exc)


def open_stores(values: Sequence[str], transport: WakuRequester) -> StoreChoice:
    """The clients of the stores ``values`` names, in order; Waku store peers are asked
    through ``transport``."""
    from sdsync.store import HttpStoreClient, WakuStoreClient

    return StoreChoice(
        [
            HttpStoreClient(value)
            if store_kind(value) == "rest"
            else WakuStoreClient.over(transport, value)
            for value in values
        ]
    )


class StoreChoice(AsyncLifecycle):
    """A StoreClient that asks the first store able to answer."""

    def __init__(self, stores: Sequence[StoreQueries]) -> None:
        if not stores:
            raise LocalProtocolError("no store to ask")
        self.stores = list(stores)
        self.fetches = 0  # fetches a store answered
        self.fetched = 0  # messages those answers held
        self.unavailable = 0  # times a store could not answer
        self.catch_ups = 0  # catch-ups a store answered to the end
        self.caught_up = 0  # messages catch-ups fetched (the ones the channel had not seen)

    async def start(self) -> None:
        """Nothing to start: each client connects when asked."""

    async def fetch(self, channel_id: str, entries: tuple[HistoryEntry, ...]) -> list[Received]:
        failure: OSError | None = None
        for store in self.stores:
            try:
                found = await store.fetch(channel_id, entries)
            except OSError as exc:
                failure = self._unavailable(store, exc)
                continue
            self.fetches += 1
            self.fetched += len(found)
            return found
        assert failure is not None
        raise failure

    async def catch_up(
        self,
        content_topic: str,
        start_ms: int,
        end_ms: int,
        page_size: int,
        unseen: Callable[[list[bytes]], list[bytes]],
    ) -> AsyncIterator[list[Received]]:
        failure: OSError | None = None
        for store in self.stores:
            pages = store.catch_up(content_topic, start_ms, end_ms, page_size, unseen)
            try:
                async for page in pages:
                    self.caught_up += len(page)
                    yield page
            except OSError as exc:
                failure = self._unavailable(store, exc)
                continue
            self.catch_ups += 1
            return
        assert failure is not None
        raise failure

    def _unavailable(self, store: StoreQueries, exc: OSError) -> OSError:
        """Count and log a store that could not answer; the next one is asked."""
        self.unavailable += 1
        logger.info("store %s unavailable: %s", store.name, exc)
        return exc

    async def close(self) -> None:
        for store in self.stores:
            if isinstance(store, AsyncLifecycle):
                await store.close()
