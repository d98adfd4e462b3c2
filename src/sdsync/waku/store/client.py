"""Store clients: v3 queries by page, by hash, the runtime's StoreClient, and the one over
libp2p (``/vac/waku/store-query/3.0.0``).

Theory of operation
-------------------
:class:`StoreQueries` is what every store client offers on top of its one transport
call, :meth:`~StoreQueries.query` (one page): :meth:`~StoreQueries.pages` follows the
pagination cursor to the end, :meth:`~StoreQueries.get` asks for messages by hash, and
:meth:`~StoreQueries.fetch` and :meth:`~StoreQueries.catch_up` are the
:class:`~sdsync.runtime.reliable.StoreClient` of a ReliableChannel.  Two transports:
:class:`~sdsync.store.client.HttpStoreClient` speaks the REST API of
:mod:`sdsync.store.server` (which is nwaku's ``/store/v3/messages``, so it works against
nwaku too), :class:`WakuStoreClient` here the libp2p protocol
``/vac/waku/store-query/3.0.0``.

:meth:`~StoreQueries.fetch`: the retrieval hints of the missing entries are Waku
message hashes, so it asks for them by hash (in chunks that keep requests short) and
hands back each message's payload — the SDS bytes — with its hash as retrieval hint.
Entries without a hint cannot be asked for: a store indexes messages by hash, not by SDS
message id.  Every returned message is checked against its hash and against what was
asked for.  A store that cannot be reached, or that says it is busy or cannot answer now
(status 429, 503, 504: in the HTTP status, or inside a 200 when nwaku forwarded the
query), raises :class:`StoreUnavailableError` (an ``OSError``, which the runtime retries
on its next sweep, perhaps at another store); a store that answers nonsense or an error
of ours (300, 400: the text of its ``text/plain`` body when nwaku answers that way) is a
:class:`~sdsync.errors.RemoteProtocolError`, logged by ``fetch`` and its answer dropped.

:meth:`~StoreQueries.catch_up` is two-phase: a query by content topic and time range with
``include_data`` false lists a page of message hashes (tens of bytes each, where a
message with its bloom filter is hundreds or more), the runtime keeps those it has not
seen (heard live, or sent) and :meth:`~StoreQueries.get` fetches only those, so a
participant that heard everything downloads nothing but the listing.  Its errors go to
the runtime as they are (either kind: the catch-up failed and its window is asked again).

:class:`WakuStoreClient` asks over a ``request(protocol_id, payload) -> response``
callable that carries one request body to a peer and returns its response body (the
transport frames both; bind the peer and the response limit
:data:`~sdsync.waku.store.rpc.MAX_STORE_RESPONSE_BYTES` into it).
:meth:`WakuStoreClient.over` does that binding for any Waku node
(:class:`~sdsync.waku.node.WakuRequester`: a relay node, a light client).
"""

from __future__ import annotations

import functools
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace

from sdsync.errors import RemoteProtocolError, ServiceUnavailable
from sdsync.waku.messages import StoredMessage
from sdsync.waku.node import Received, WakuRequester
from sdsync.waku.rpc import Request
from sdsync.waku.store.model import MAX_HASHES, Page, StatusCode, StoreQuery
from sdsync.waku.store.rpc import (
    MAX_STORE_RESPONSE_BYTES,
    STORE_QUERY_PROTOCOL,
    StoreQueryResponse,
    WakuMessageKeyValue,
)
from sdsync.wire import HistoryEntry
from sdsync.wire.waku import HASH_SIZE

logger = logging.getLogger("sdsync.store.client")

QUERY_TIMEOUT_S = 10.0
"""How long :meth:`WakuStoreClient.over` gives a store peer to answer, dialling included."""


class StoreUnavailableError(ServiceUnavailable, OSError):
    """The store could not be reached, did not answer in time, or said it cannot answer
    now (429, 503, 504): ask again later, or elsewhere."""


#: The v3 status codes that mean "not now", wherever a store puts them.
UNAVAILABLE_STATUSES = frozenset(
    {StatusCode.TOO_MANY_REQUESTS, StatusCode.SERVICE_UNAVAILABLE, StatusCode.GATEWAY_TIMEOUT}
)


class StoreQueries(ABC):
    """Queries by page, by every page, by hash, and the runtime's ``fetch``, over one
    :meth:`query` that a transport supplies."""

    #: Who is asked, for messages and logs.
    name: str
    #: Hashes per query of :meth:`get`.
    hashes_per_query: int = MAX_HASHES

    @abstractmethod
    async def query(self, query: StoreQuery) -> Page:
        """One page: :class:`StoreUnavailableError` if the store cannot answer now,
        :class:`~sdsync.errors.RemoteProtocolError` if its answer is malformed or an error."""

    async def pages(self, query: StoreQuery) -> AsyncIterator[Page]:
        """Every page of ``query``, following the cursor."""
        while True:
            page = await self.query(query)
            yield page
            if page.cursor is None:
                return
            query = replace(query, pagination_cursor=page.cursor)

    async def get(self, hashes: Iterable[bytes]) -> list[StoredMessage]:
        """The messages the store holds among ``hashes``."""
        wanted = list(dict.fromkeys(hashes))
        found: list[StoredMessage] = []
        for start in range(0, len(wanted), self.hashes_per_query):
            chunk = tuple(wanted[start : start + self.hashes_per_query])
            query = StoreQuery(include_data=True, message_hashes=chunk, pagination_limit=MAX_HASHES)
            async for page in self.pages(query):
                found.extend(m for m in page.messages if m.message_hash in chunk)
        return found

    async def fetch(self, channel_id: str, entries: tuple[HistoryEntry, ...]) -> list[Received]:
        """The runtime's StoreClient: the messages of ``entries``, by retrieval hint."""
        hints = [
            e.retrieval_hint
            for e in entries
            if e.retrieval_hint is not None and len(e.retrieval_hint) == HASH_SIZE
        ]
        try:
            found = await self.get(hints)
        except RemoteProtocolError as exc:
            logger.warning("store %s answered badly for channel %s: %s", self.name, channel_id, exc)
            return []
        return [Received(m.message.payload, m.message_hash) for m in found]

    async def catch_up(
        self,
        content_topic: str,
        start_ms: int,
        end_ms: int,
        page_size: int,
        unseen: Callable[[list[bytes]], list[bytes]],
    ) -> AsyncIterator[list[Received]]:
        """The runtime's store catch-up: the hashes of the messages on ``content_topic``
        timestamped in [``start_ms``, ``end_ms``], a page at a time (a content filter
        without a pubsub topic, which nwaku and our store answer), and of each page the
        messages ``unseen`` keeps, fetched by hash (:meth:`get`)."""
        listing = StoreQuery(
            include_data=False,
            content_topics=(content_topic,),
            time_start=start_ms * 1_000_000,
            time_end=end_ms * 1_000_000,
            pagination_limit=page_size,
        )
        async for page in self.pages(listing):
            wanted = unseen(page.hashes)
            if wanted:
                found = await self.get(wanted)
                yield [Received(m.message.payload, m.message_hash) for m in found]


def check_status(name: str, status: object, description: object) -> None:
    """Raise for a v3 answer whose status is not 200: :class:`StoreUnavailableError` for
    "not now" (:data:`UNAVAILABLE_STATUSES`), RemoteProtocolError for any other."""
    if status == StatusCode.OK:
        return
    if status in UNAVAILABLE_STATUSES:
        raise StoreUnavailableError(f"{name}: store answered {status}: {description!r}")
    raise RemoteProtocolError(f"{name}: store answered {status}: {description!r}")


class WakuStoreClient(StoreQueries):
    """A store peer asked over ``/vac/waku/store-query/3.0.0``; the runtime's
    StoreClient like :class:`~sdsync.store.client.HttpStoreClient`.

    ``request(protocol_id, payload)`` carries one request body to the peer and returns its
    response body; a peer that cannot be reached or does not answer in time raises
    ``OSError`` or ``TimeoutError`` there, which this client reports as
    :class:`~sdsync.store.client.StoreUnavailableError`.
    """

    def __init__(self, request: Request, *, name: str = "waku store peer") -> None:
        self._request = request
        self.name = name

    @classmethod
    def over(
        cls, host: WakuRequester, peer: str, *, timeout_s: float = QUERY_TIMEOUT_S
    ) -> WakuStoreClient:
        """The store peer ``peer`` asked through ``host``, which dials it when asked;
        an answer must come within ``timeout_s`` and fit
        :data:`~sdsync.waku.store.rpc.MAX_STORE_RESPONSE_BYTES`."""
        request = functools.partial(
            host.request, peer, max_response_bytes=MAX_STORE_RESPONSE_BYTES, timeout_s=timeout_s
        )
        return cls(request, name=peer)

    async def query(self, query: StoreQuery) -> Page:
        request_id = uuid.uuid4().hex
        payload = replace(query, request_id=request_id).to_bytes()
        try:
            answer = await self._request(STORE_QUERY_PROTOCOL, payload)
        except (OSError, TimeoutError) as exc:
            raise StoreUnavailableError(f"{self.name}: {exc or type(exc).__name__}") from exc
        response = StoreQueryResponse.from_bytes(answer)
        check_status(self.name, response.status_code, response.status_desc)
        if response.request_id != request_id:
            raise RemoteProtocolError(
                f"{self.name}: answered request {response.request_id[:80]!r}, not {request_id}"
            )
        return Page(
            hashes=[_entry_hash(self.name, e) for e in response.messages],
            messages=[_stored(self.name, e) for e in response.messages]
            if query.include_data
            else [],
            cursor=response.pagination_cursor,
        )


def _entry_hash(name: str, entry: WakuMessageKeyValue) -> bytes:
    if entry.message_hash is None:
        raise RemoteProtocolError(f"{name}: an entry without a message hash")
    return entry.message_hash


def _stored(name: str, entry: WakuMessageKeyValue) -> StoredMessage:
    """The entry's message, its hash checked (RemoteProtocolError otherwise)."""
    if entry.message is None or entry.pubsub_topic is None:
        raise RemoteProtocolError(f"{name}: an entry without its message or pubsub topic")
    return StoredMessage(_entry_hash(name, entry), entry.pubsub_topic, entry.message)
