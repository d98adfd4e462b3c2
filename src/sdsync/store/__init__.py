"""The store node: an archive of full Waku messages, queried with 13/WAKU2-STORE v3.

Theory of operation
-------------------
SDS recovers a missing message by its *retrieval hint*, the deterministic Waku message
hash; a store node is where that hint is redeemed.  It archives every full message it
hears, keyed by that hash, ordered by ``(timestamp, message_hash)``, and answers v3
queries — by hashes, or by pubsub topic, content topics and time range, a page at a
time with a cursor — over nwaku's REST API, so existing tooling can query it, and over
libp2p (``/vac/waku/store-query/3.0.0``), so Waku clients such as js-waku can.

The parts, from the bottom up:

* :mod:`~sdsync.waku.store.model` — a stored message (its hash checked on creation), a
  query (valid by construction), a page;
* :mod:`~sdsync.store.archive` — the archive contract, and the SQL shared by the
  SQLite (:mod:`~sdsync.store.sqlite`) and hourly-partitioned PostgreSQL
  (:mod:`~sdsync.store.postgres`) backends, chosen by :mod:`~sdsync.store.backend`.
  Besides queries it offers what Store Sync reconciles: sorted ``(timestamp, hash)``
  items of a time window, messages by hash, idempotent verified inserts, a count.  A
  failing database is :class:`~sdsync.store.archive.ArchiveUnavailable`, whichever the
  backend;
* :mod:`~sdsync.store.retention` — nwaku's time, capacity and size policies;
* :mod:`~sdsync.store.served` — the node as the HTTP API and Store Sync see it, and the
  one ingestion path into the archive;
* :mod:`~sdsync.store.rest`, :mod:`~sdsync.store.server` — the HTTP API (aiohttp);
* :mod:`~sdsync.waku.store.service` — the same queries over libp2p (sans-I/O: the
  transport carries the bytes), and :class:`~sdsync.waku.store.client.WakuStoreClient`;
* :mod:`~sdsync.waku.lightpush.service`, :mod:`~sdsync.waku.filter.service` — LightPush
  and Filter for light clients (sans-I/O), and :mod:`~sdsync.store.light_clients`, their
  I/O on the host;
* :mod:`~sdsync.store.resume` — Store Resume from a random peer after downtime;
* :mod:`~sdsync.store.node` — the node that runs all of it, and
  :mod:`~sdsync.store.launch`, which assembles one with its relay host from options
  (``sdsync store serve``);
* :mod:`~sdsync.store.client` — the HTTP client, also the runtime's StoreClient (as
  the Waku one is);
* :mod:`~sdsync.store.export` — Parquet for the Spark pipeline.
"""

from sdsync.store.archive import Archive, ArchiveUnavailable, SqlArchive
from sdsync.store.backend import open_archive
from sdsync.store.client import HttpStoreClient
from sdsync.store.export import ExportReport, export_parquet
from sdsync.store.launch import RelayOptions, run_node
from sdsync.store.node import NodeConfig, StoreNode, serve
from sdsync.store.retention import RetentionPolicy
from sdsync.waku.messages import StoredMessage
from sdsync.waku.store.client import StoreUnavailableError, WakuStoreClient
from sdsync.waku.store.model import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    Page,
    QueryError,
    StatusCode,
    StoreQuery,
)
from sdsync.waku.store.service import answer_store_query

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "Archive",
    "ArchiveUnavailable",
    "ExportReport",
    "HttpStoreClient",
    "NodeConfig",
    "Page",
    "QueryError",
    "RelayOptions",
    "RetentionPolicy",
    "SqlArchive",
    "StatusCode",
    "StoreNode",
    "StoreQuery",
    "StoreUnavailableError",
    "StoredMessage",
    "WakuStoreClient",
    "answer_store_query",
    "export_parquet",
    "open_archive",
    "run_node",
    "serve",
]
