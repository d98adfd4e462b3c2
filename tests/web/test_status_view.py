"""The status page without a browser: the view model from figures, the HTML from it,
and the per-minute traffic ring."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from sdsync.store.archive import TopicCount
from sdsync.store.metrics import MinuteTraffic, StoreMetrics
from sdsync.store.status import (
    SOURCES,
    StatusView,
    Traffic,
    build_view,
    registry_samples,
    render,
    render_chart,
    sample_key,
)

NOW_NS = 1_700_000_000 * 10**9
HOSTILE = "<img src=x onerror=alert(1)>&\"'"


def _view(
    metrics: StoreMetrics,
    info: Mapping[str, Any] | None = None,
    topics: Sequence[TopicCount] = (),
) -> StatusView:
    return build_view(
        registry_samples(metrics.registry),
        topics,
        metrics.traffic.last(),
        info,
        now_ns=NOW_NS,
    )


def test_view_shows_the_registry_counters() -> None:
    metrics = StoreMetrics()
    metrics.messages.set(12)
    metrics.ingested.labels(source="relay").inc(7)
    metrics.refuse("POST /store/v3/messages", "bad_token")
    view = _view(metrics)
    assert [(f.label, f.value) for f in view.summary] == [
        ("messages archived", 12),
        ("database bytes", 0),
        ("Filter subscribers", 0),
    ]
    tables = {t.title: t for t in view.tables}
    refused = tables["Refused, by route and reason"]
    assert refused.rows == (("POST /store/v3/messages", "bad_token"),)
    assert refused.figures[0].value == 1
    assert refused.figures[0].sample == sample_key(
        "sdsync_store_refused_total", {"reason": "bad_token", "route": "POST /store/v3/messages"}
    )
    assert tables["Archived, by source"].figures[0].value == 7
    assert view.admin is None


def test_traffic_ring_keeps_the_last_hour_by_minute() -> None:
    now = [600_000.0]
    ring = MinuteTraffic(minutes=60, clock=lambda: now[0])
    ring.add("relay", 3)
    ring.add("http", 2)
    now[0] += 60
    ring.add("relay", 1)
    first, counts = ring.last()
    assert first == 600_000 // 60 + 1 - 59
    assert counts[-2] == {"relay": 3, "http": 2} and counts[-1] == {"relay": 1}
    now[0] += 60 * 60  # an hour on: the first minutes have left the ring
    ring.add("sync", 4)
    _, counts = ring.last()
    assert counts[-1] == {"sync": 4} and sum(sum(c.values()) for c in counts) == 4
    assert len(ring._by_minute) <= 61  # bounded, whatever the clock did


def test_chart_stacks_sources_per_minute() -> None:
    per_minute = [(0,) * len(SOURCES)] * 58 + [(3, 0, 2, 0, 0, 0), (0, 1, 0, 0, 0, 0)]
    svg = render_chart(Traffic(1000, tuple(per_minute)))
    assert svg.count('<g class="bar"') == 2
    assert svg.count('class="src-relay"') == 1 and svg.count('class="src-http"') == 1
    assert 'data-total="5"' in svg and 'data-total="1"' in svg
    assert "relay 3, POST 2" in svg


def test_render_escapes_every_peer_string() -> None:
    metrics = StoreMetrics()
    metrics.refuse("relay", "bad_topic")
    topics = [TopicCount(HOSTILE, HOSTILE, 3, NOW_NS - 10**9, NOW_NS)]
    info = {"backend": HOSTILE, "retention": [HOSTILE], "peers": [HOSTILE], "resume": None}
    page = render(_view(metrics, info | {"sync": None}, topics))
    assert HOSTILE not in page
    assert page.count(html.escape(HOSTILE)) == 5  # 2 topic cells, backend, retention, peers
    assert "<script" not in page and " style=" not in page
    assert 'id="admin"' in page


def test_admin_part_shows_the_last_sync_rounds_newest_first() -> None:
    ok = {
        "at_ns": 2 * 10**18,
        "peer": "http://peer:1",
        "method": "riblt",
        "have": 2,
        "need": 5,
        "bytes_sent": 100,
        "bytes_received": 900,
        "stored": 5,
        "peer_stored": 2,
        "outcome": "ok",
    }
    failed = {"at_ns": 10**18, "peer": "http://peer:2", "method": "rbsr", "outcome": "failed: down"}
    sync = {"method": "riblt", "rounds": 3, "failures": 1, "recent": [ok, failed]}
    view = _view(StoreMetrics(), {"backend": "sqlite", "sync": sync})
    assert view.admin is not None
    table = view.admin[1]
    assert table.title == "Store Sync: last rounds (3 rounds, 1 failed)"
    assert table.rows[0] == (
        "2033-05-18 03:33:20 UTC",
        "http://peer:1",
        "riblt",
        "2 we held, 5 we lacked",
        "100",
        "900",
        "ok: 5 new here, 2 new there",
    )
    assert table.rows[1] == (
        "2001-09-09 01:46:40 UTC",
        "http://peer:2",
        "rbsr",
        "",
        "",
        "",
        "failed: down",
    )
    idle = _view(StoreMetrics(), {"sync": {"method": "riblt", "recent": []}})
    assert idle.admin is not None and idle.admin[1].rows[0][1] == "no round yet"


def test_admin_part_shows_the_last_waku_sync_exchanges() -> None:
    ours = {
        "at_ns": 2 * 10**18,
        "peer": "16Uiu2HAm",
        "role": "initiator",
        "method": "waku",
        "pushed": 3,
        "expected": 4,
        "bytes_sent": 600,
        "bytes_received": 1200,
        "outcome": "ok",
    }
    failed = {"at_ns": 10**18, "peer": "", "role": "initiator", "outcome": "failed: no peer"}
    waku_sync = {"rounds": 2, "failures": 1, "recent": [ours, failed]}
    view = _view(StoreMetrics(), {"backend": "sqlite", "sync": None, "waku_sync": waku_sync})
    assert view.admin is not None
    table = view.admin[2]
    assert table.title == "Waku Sync: last exchanges (2 rounds of ours, 1 failed)"
    assert table.rows[0][1:] == (
        "16Uiu2HAm",
        "initiator, waku",
        "3 pushed, 4 expected",
        "600",
        "1200",
        "ok",
    )
    assert table.rows[1][1:] == ("", "initiator", "", "", "", "failed: no peer")
    off = _view(StoreMetrics(), {"backend": "sqlite", "sync": None, "waku_sync": None})
    assert off.admin is not None and off.admin[2].rows[0][1] == "Waku Sync is off"
