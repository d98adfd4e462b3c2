"""The HTTP client of a store node's REST API (``/store/v3/messages``, nwaku's too),
and its ingestion route.

The queries by page, by hash and the runtime's StoreClient come from
:class:`~sdsync.waku.store.client.StoreQueries`, as they do for the libp2p client
:class:`~sdsync.waku.store.client.WakuStoreClient`; the HTTP statuses map onto the v3
ones (:func:`~sdsync.waku.store.client.check_status`): 429, 503 and 504 raise
:class:`~sdsync.waku.store.client.StoreUnavailableError`, any other error a
:class:`~sdsync.errors.RemoteProtocolError` (with the text of nwaku's ``text/plain``
body when it answers that way).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import aiohttp

from sdsync.errors import RemoteProtocolError
from sdsync.lifecycle import AsyncLifecycle
from sdsync.store import rest
from sdsync.waku.messages import StoredMessage
from sdsync.waku.store.client import StoreQueries, StoreUnavailableError, check_status
from sdsync.waku.store.model import Page, StoreQuery

logger = logging.getLogger("sdsync.store.client")


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
