"""Clients of store nodes: v3 queries, ingestion, and the runtime's StoreClient.

Theory of operation
-------------------
:class:`StoreQueries` is what every store client offers on top of its one transport
call, :meth:`~StoreQueries.query` (one page): :meth:`~StoreQueries.pages` follows the
pagination cursor to the end, :meth:`~StoreQueries.get` asks for messages by hash, and
:meth:`~StoreQueries.fetch` and :meth:`~StoreQueries.catch_up` are the
:class:`~sdsync.runtime.reliable.StoreClient` of a ReliableChannel.  Two transports:
:class:`HttpStoreClient` here speaks the REST API of :mod:`sdsync.store.server` (which
is nwaku's ``/store/v3/messages``, so it works against nwaku too),
:class:`~sdsync.store.waku_store.WakuStoreClient` the libp2p protocol
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
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from typing import Any

import aiohttp

from sdsync.errors import RemoteProtocolError
from sdsync.lifecycle import AsyncLifecycle
from sdsync.store import rest
from sdsync.store.model import MAX_HASHES, Page, StatusCode, StoredMessage, StoreQuery
from sdsync.transport.base import Received
from sdsync.wire import HistoryEntry
from sdsync.wire.waku import HASH_SIZE

logger = logging.getLogger("sdsync.store.client")


class StoreUnavailableError(OSError):
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


class HttpStoreClient(StoreQueries, AsyncLifecycle):
    hashes_per_query = 50  # 50 hashes as 0x hex: ~3.3 kB of URL, far below server limits

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = self.name = base_url.rstrip("/")
        self.token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session = session
        self._owns_session = session is None

    async def start(self) -> None:
        """Nothing to start: the HTTP session opens on first use."""

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use: a ClientSession belongs to the running event loop.
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def query(self, query: StoreQuery) -> Page:
        body = await self._request("GET", "/store/v3/messages", params=rest.query_params(query))
        if isinstance(body, dict):  # nwaku may answer 200 and put the real status inside
            check_status(self.base_url, body.get("statusCode"), body.get("statusDesc"))
        return rest.read_page(body, include_data=query.include_data)

    # -- writes

    async def post(self, messages: Iterable[StoredMessage]) -> dict[str, Any]:
        """Ingest ``messages`` (needs the node's token); returns the node's counts."""
        body = {"messages": [rest.entry_json(m) for m in messages]}
        answer = await self._request("POST", "/store/v3/messages", json_body=body)
        if not isinstance(answer, dict):
            raise RemoteProtocolError("ingestion answer is not a JSON object")
        return answer

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json_body: Any = None,
    ) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with self._client().request(
                method, self.base_url + path, params=params, json=json_body, headers=headers
            ) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise StoreUnavailableError(f"{self.base_url}: {exc or type(exc).__name__}") from exc
        if status >= 500 or status == 429:  # busy or failing: worth asking again later
            raise StoreUnavailableError(f"{self.base_url}: HTTP {status}: {_excerpt(text)}")
        try:
            return json.loads(text)
        except ValueError:
            # nwaku answers its errors as text/plain: the text is the store's reason.
            raise RemoteProtocolError(f"{self.base_url}: HTTP {status}: {_excerpt(text)}") from None


def _excerpt(text: str) -> str:
    """A remote's text, on one line and at most 200 characters, for an error message."""
    return " ".join(text.split())[:200]
