"""An HTTP client of store nodes: v3 queries, ingestion, and the runtime's StoreClient.

Theory of operation
-------------------
:class:`HttpStoreClient` speaks the REST API of :mod:`sdsync.store.server` (which is
nwaku's ``/store/v3/messages``, so it works against nwaku too).  :meth:`query` returns
one page, :meth:`pages` follows the pagination cursor to the end.

:meth:`fetch` is the :class:`~sdsync.runtime.reliable.StoreClient` of a
ReliableChannel: the retrieval hints of the missing entries are Waku message hashes, so
it asks for them by hash (in chunks that keep URLs short) and hands back each message's
payload — the SDS bytes — with its hash as retrieval hint.  Entries without a hint
cannot be asked for: a store indexes messages by hash, not by SDS message id.  Every
returned message is checked against its hash and against what was asked for.  A store
that cannot be reached raises :class:`StoreUnavailableError` (an ``OSError``, which the
runtime retries on its next sweep); a store that answers nonsense is logged and its
answer dropped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Any

import aiohttp

from sdsync.errors import RemoteProtocolError
from sdsync.lifecycle import AsyncLifecycle
from sdsync.store import rest
from sdsync.store.model import MAX_HASHES, Page, StoredMessage, StoreQuery
from sdsync.transport.base import Received
from sdsync.wire import HistoryEntry
from sdsync.wire.waku import HASH_SIZE

logger = logging.getLogger("sdsync.store.client")
HASHES_PER_REQUEST = 50  # 50 hashes as 0x hex: ~3.3 kB of URL, far below server limits


class StoreUnavailableError(OSError):
    """The store could not be reached or did not answer in time."""


class HttpStoreClient(AsyncLifecycle):
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
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

    # -- queries

    async def query(self, query: StoreQuery) -> Page:
        """One page; RemoteProtocolError if the store's answer is malformed or an error."""
        body = await self._request("GET", "/store/v3/messages", params=rest.query_params(query))
        return rest.read_page(body, include_data=query.include_data)

    async def pages(self, query: StoreQuery) -> AsyncIterator[Page]:
        """Every page of ``query``, following the cursor."""
        while True:
            page = await self.query(query)
            yield page
            if page.cursor is None:
                return
            query = replace(query, cursor=page.cursor)

    async def get(self, hashes: Iterable[bytes]) -> list[StoredMessage]:
        """The messages the store holds among ``hashes``."""
        wanted = list(dict.fromkeys(hashes))
        found: list[StoredMessage] = []
        for start in range(0, len(wanted), HASHES_PER_REQUEST):
            chunk = tuple(wanted[start : start + HASHES_PER_REQUEST])
            query = StoreQuery(include_data=True, message_hashes=chunk, page_size=MAX_HASHES)
            async for page in self.pages(query):
                found.extend(m for m in page.messages if m.message_hash in chunk)
        return found

    # -- the runtime's StoreClient

    async def fetch(self, channel_id: str, entries: tuple[HistoryEntry, ...]) -> list[Received]:
        hints = [
            e.retrieval_hint
            for e in entries
            if e.retrieval_hint is not None and len(e.retrieval_hint) == HASH_SIZE
        ]
        try:
            found = await self.get(hints)
        except RemoteProtocolError as exc:
            logger.warning(
                "store %s answered badly for channel %s: %s", self.base_url, channel_id, exc
            )
            return []
        return [Received(m.message.payload, m.message_hash) for m in found]

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
            raise StoreUnavailableError(f"{self.base_url}: HTTP {status}: {text[:200]}")
        try:
            return json.loads(text)
        except ValueError:
            raise RemoteProtocolError(f"{self.base_url}: HTTP {status}: {text[:200]!r}") from None
