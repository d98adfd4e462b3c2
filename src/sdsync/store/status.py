"""The operator's status page: ``GET /status`` on the store node.

Theory of operation
-------------------
Three steps, only the first doing I/O:

1. :func:`gather` reads the node: every sample of its Prometheus registry (the same
   collectors ``GET /metrics`` exports, gauges refreshed first, so the page never keeps
   counts of its own), the archive's largest topics
   (:meth:`~sdsync.store.archive.Archive.topic_counts`), the last hour of ingestion per
   minute (:class:`~sdsync.store.metrics.MinuteTraffic`) and, for a caller holding the
   node's token, :meth:`~sdsync.store.served.ServedNode.info` (backend, retention, Store
   Sync peers and last round, Store Resume), which ``GET /admin/v1/info`` guards alike.
2. :func:`build_view` turns those figures into a :class:`StatusView`: plain data, no
   HTML, testable without a server.
3. :func:`render` writes the HTML, the traffic chart as inline SVG drawn here.  Every
   string from outside (topics are chosen by peers; routes, reasons and peers come from
   labels and configuration) passes through :func:`html.escape`.

Each figure taken from the registry carries the sample it shows in a ``data-sample``
attribute (``name{label="value",...}``, labels sorted), so a test can hold the page
against ``/metrics``.  The page runs no script: it reloads itself every
:data:`REFRESH_S` seconds (``<meta http-equiv="refresh">``) and takes its looks from
``status.css`` (:data:`ASSETS`); :data:`HEADERS` forbid inline script and
style (Content-Security-Policy) and caching (the admin part must not linger).
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from string import Template
from typing import Any

from prometheus_client import CollectorRegistry

from sdsync.store.archive import TopicCount
from sdsync.store.served import ServedNode
from sdsync.store.summary import SUMMARY_TOPICS

REFRESH_S = 10
MAX_TOPICS = SUMMARY_TOPICS
"""Topic rows on the page (the largest first)."""
ASSETS = {"status.css": "text/css", "favicon.svg": "image/svg+xml"}
"""The page's files (in ``web/``), served at ``/status/<name>``, and their types."""
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: Ingestion sources (the ``source`` label), in chart order, with their names on the page.
SOURCES = (
    ("relay", "relay"),
    ("lightpush", "LightPush"),
    ("http", "POST"),
    ("sync", "Store Sync"),
    ("waku-sync", "Waku Sync"),
    ("resume", "Resume"),
)
#: The counter tables: title, counter (its ``_total`` samples), the labels of its rows.
COUNTER_TABLES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Archived, by source", "sdsync_store_ingested_messages", ("source",)),
    ("Duplicates, by source", "sdsync_store_duplicate_messages", ("source",)),
    ("Refused, by route and reason", "sdsync_store_refused", ("route", "reason")),
    ("LightPush requests, by status", "sdsync_store_lightpush", ("status",)),
    ("Filter pushes, by outcome", "sdsync_store_filter_pushes", ("outcome",)),
    ("Filter subscriptions dropped", "sdsync_store_filter_subscriptions_dropped", ("reason",)),
    ("Store Sync rounds, by role", "sdsync_store_sync_rounds", ("role",)),
    ("Store Sync differences", "sdsync_store_sync_differences", ("side",)),
    ("Store Sync bytes", "sdsync_store_sync_bytes", ("direction",)),
    (
        "Waku Sync exchanges, by role and method",
        "sdsync_store_waku_sync_sessions",
        ("role", "method"),
    ),
    ("Waku Sync refusals, by reason", "sdsync_store_waku_sync_refused", ("reason",)),
    ("Waku Sync messages", "sdsync_store_waku_sync_messages", ("direction",)),
    ("Store v3 queries, by status", "sdsync_store_queries", ("status",)),
)
_WEB = resources.files("sdsync.store") / "web"

Samples = Mapping[str, Sequence[tuple[Mapping[str, str], float]]]
"""Sample name (``..._total`` for a counter) to its (labels, value) pairs."""


# -- the view model


@dataclass(frozen=True)
class Figure:
    """One number on the page and the ``/metrics`` sample it shows ("" if none)."""

    label: str
    value: float
    sample: str = ""


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    figures: tuple[Figure, ...] = ()
    """Figures, one per row, in the last column (empty: the rows say everything)."""


@dataclass(frozen=True)
class Traffic:
    first_minute: int
    """Unix s // 60 of the first bar."""
    per_minute: tuple[tuple[int, ...], ...]
    """Per minute, oldest first: messages newly archived per source, in :data:`SOURCES` order."""


@dataclass(frozen=True)
class StatusView:
    generated_ns: int
    measured_ns: int
    """When the archive's figures (messages, bytes, topics) were measured."""
    summary: tuple[Figure, ...]
    topics: Table
    traffic: Traffic
    tables: tuple[Table, ...]
    admin: tuple[Table, ...] | None
    """None: the caller did not show the node's token."""


def registry_samples(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of ``registry`` as ``/metrics`` would export it now."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in registry.collect():
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    """``name{a="x",b="y"}`` (labels sorted), as a test finds the sample in ``/metrics``."""
    inner = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
    return f"{name}{{{inner}}}" if inner else name


def build_view(
    samples: Samples,
    topics: Sequence[TopicCount],
    traffic: tuple[int, Sequence[Mapping[str, int]]],
    info: Mapping[str, Any] | None,
    *,
    now_ns: int,
    measured_ns: int | None = None,
) -> StatusView:
    """What the page shows: ``samples`` from the node's registry, its largest
    ``topics``, ``traffic`` (:meth:`~sdsync.store.metrics.MinuteTraffic.last`) and, for
    the node's operator, ``info`` (``GET /admin/v1/info``)."""
    first, minutes = traffic
    return StatusView(
        generated_ns=now_ns,
        measured_ns=now_ns if measured_ns is None else measured_ns,
        summary=(
            _gauge(samples, "sdsync_store_messages", "messages archived"),
            _gauge(samples, "sdsync_store_archive_bytes", "database bytes"),
            _gauge(samples, "sdsync_store_filter_subscribers", "Filter subscribers"),
        ),
        topics=_topics_table(topics),
        traffic=Traffic(
            first, tuple(tuple(m.get(s, 0) for s, _ in SOURCES) for m in minutes)
        ),
        tables=tuple(_counter_table(samples, *spec) for spec in COUNTER_TABLES),
        admin=None if info is None else _admin_tables(info),
    )  # fmt: skip


def _gauge(samples: Samples, name: str, label: str) -> Figure:
    values = samples.get(name, ())
    return Figure(label, values[0][1] if values else 0.0, sample_key(name, {}))


def _counter_table(samples: Samples, title: str, name: str, labels: tuple[str, ...]) -> Table:
    """The counter ``name``'s samples, one row each, labelled by ``labels``."""
    total = f"{name}_total"
    found = sorted(samples.get(total, ()), key=lambda s: tuple(s[0].get(k, "") for k in labels))
    return Table(
        title,
        (*labels, "count"),
        tuple(tuple(s.get(k, "") for k in labels) for s, _ in found),
        tuple(Figure(" ".join(s.values()), v, sample_key(total, s)) for s, v in found),
    )


def _topics_table(topics: Sequence[TopicCount]) -> Table:
    return Table(
        f"Archived topics (the {MAX_TOPICS} largest)",
        ("pubsub topic", "content topic", "oldest", "newest", "messages"),
        tuple((t.pubsub_topic, t.content_topic, _when(t.oldest), _when(t.newest)) for t in topics),
        tuple(Figure(t.content_topic, t.messages) for t in topics),
    )


def _admin_tables(info: Mapping[str, Any]) -> tuple[Table, ...]:
    node = Table(
        "Node",
        ("setting", "value"),
        (
            ("backend", str(info.get("backend"))),
            ("retention", ", ".join(info.get("retention") or ()) or "none"),
            ("Store Sync peers", ", ".join(info.get("peers") or ()) or "none"),
            ("last Store Resume", _resume(info.get("resume"))),
        ),
    )
    return node, _sync_table(info.get("sync")), _waku_sync_table(info.get("waku_sync"))


def _resume(resume: Mapping[str, Any] | None) -> str:
    if not resume:
        return "none"
    outcome = f"failed: {resume['error']}" if resume.get("error") else "ok"
    return f"from {resume.get('peer')}: {resume.get('stored', 0)} stored, {outcome}"


def _sync_table(sync: Mapping[str, Any] | None) -> Table:
    """Store Sync's periodic rounds (:meth:`~sdsync.store.sync.periodic.PeriodicSync.info`):
    the last few, newest first."""
    columns = ("when", "peer", "method", "differences", "bytes sent", "bytes received", "outcome")
    title = "Store Sync: last rounds"
    if not sync:
        return Table(title, columns, (("", "periodic Store Sync is off", "", "", "", "", ""),))
    rounds = f"{sync.get('rounds', 0)} rounds, {sync.get('failures', 0)} failed"
    rows = tuple(map(_sync_row, sync.get("recent") or ()))
    if not rows:
        rows = (("", "no round yet", str(sync.get("method", "")), "", "", "", ""),)
    return Table(f"{title} ({rounds})", columns, rows)


def _sync_row(round_: Mapping[str, Any]) -> tuple[str, ...]:
    when = _when(int(round_.get("at_ns", 0)))
    peer, method, outcome = str(round_["peer"]), str(round_["method"]), str(round_["outcome"])
    if "have" not in round_:  # a failed round
        return (when, peer, method, "", "", "", outcome)
    differences = f"{round_['have']} we held, {round_['need']} we lacked"
    if outcome == "ok":
        outcome = f"ok: {round_['stored']} new here, {round_['peer_stored']} new there"
    sent, received = str(round_["bytes_sent"]), str(round_["bytes_received"])
    return (when, peer, method, differences, sent, received, outcome)


def _waku_sync_table(sync: Mapping[str, Any] | None) -> Table:
    """Waku Sync's last exchanges (:meth:`~sdsync.waku.sync.WakuSync.info`), ours and
    peers', newest first."""
    columns = (
        "when",
        "peer",
        "role, method",
        "differences",
        "bytes sent",
        "bytes received",
        "outcome",
    )
    title = "Waku Sync: last exchanges"
    if not sync:
        return Table(title, columns, (("", "Waku Sync is off", "", "", "", "", ""),))
    rounds = f"{sync.get('rounds', 0)} rounds of ours, {sync.get('failures', 0)} failed"
    rows = tuple(map(_waku_sync_row, sync.get("recent") or ()))
    if not rows:
        rows = (("", "no exchange yet", "", "", "", "", ""),)
    return Table(f"{title} ({rounds})", columns, rows)


def _waku_sync_row(exchange: Mapping[str, Any]) -> tuple[str, ...]:
    when = _when(int(exchange.get("at_ns", 0)))
    peer, outcome = str(exchange["peer"]), str(exchange["outcome"])
    role = f"{exchange.get('role', '')}, {exchange.get('method', '')}".strip(", ")
    if "pushed" not in exchange:  # a failed round
        return (when, peer, role, "", "", "", outcome)
    differences = f"{exchange['pushed']} pushed, {exchange['expected']} expected"
    sent, received = str(exchange["bytes_sent"]), str(exchange["bytes_received"])
    return (when, peer, role, differences, sent, received, outcome)


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))


async def gather(node: ServedNode, *, admin: bool, topics: int = MAX_TOPICS) -> StatusView:
    """The node's status now (the archive's figures as last measured in the background);
    its admin part only if ``admin`` (the caller showed the token)."""
    await node.refresh_gauges()
    summary = await node.archive_summary()
    return build_view(
        registry_samples(node.metrics.registry),
        summary.topics[:topics],
        node.metrics.traffic.last(),
        await node.info() if admin else None,
        now_ns=node.now_ns(),
        measured_ns=summary.measured_ns,
    )


# -- HTML

_E = html.escape
CHART_WIDTH, CHART_HEIGHT, CHART_TOP = 600, 160, 14


def render(view: StatusView) -> str:
    page = Template((_WEB / "status.html").read_text(encoding="utf-8"))
    return page.substitute(
        refresh=REFRESH_S,
        generated=_E(_when(view.generated_ns)),
        measured=_E(_when(view.measured_ns)),
        summary="".join(
            f'<li><span class="figure"{_data(f)}>{_number(f.value)}</span> {_E(f.label)}</li>'
            for f in view.summary
        ),
        chart=render_chart(view.traffic),
        topics=render_table(view.topics),
        tables="\n".join(render_table(t) for t in view.tables),
        admin=(
            '<p class="note">Send the node\'s token (Authorization: Bearer) to see its '
            "configuration and Store Sync rounds.</p>"
            if view.admin is None
            else '<section id="admin">'
            + "\n".join(render_table(t) for t in view.admin)
            + "</section>"
        ),
    )


def render_table(table: Table) -> str:
    head = "".join(f"<th>{_E(c)}</th>" for c in table.columns)
    rows = []
    for i, row in enumerate(table.rows):
        cells = "".join(f"<td>{_E(c)}</td>" for c in row)
        if table.figures:
            figure = table.figures[i]
            cells += f'<td class="figure"{_data(figure)}>{_number(figure.value)}</td>'
        rows.append(f"<tr>{cells}</tr>")
    body = "".join(rows) or f'<tr><td colspan="{len(table.columns)}">none yet</td></tr>'
    return (
        f"<section><h2>{_E(table.title)}</h2>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>"
    )


def render_chart(traffic: Traffic) -> str:
    """Messages archived per minute as stacked bars, one colour (CSS class) per source."""
    slots = max(len(traffic.per_minute), 1)
    peak = max((sum(m) for m in traffic.per_minute), default=0) or 1
    scale = (CHART_HEIGHT - CHART_TOP) / peak
    width = CHART_WIDTH / slots
    bars = []
    for i, counts in enumerate(traffic.per_minute):
        if not sum(counts):
            continue
        rects, y = [], float(CHART_HEIGHT)
        for (source, _), count in zip(SOURCES, counts, strict=True):
            if count:
                height = count * scale
                y -= height
                rects.append(
                    f'<rect class="src-{source}" x="{i * width:.1f}" y="{y:.1f}" '
                    f'width="{max(width - 1, 1):.1f}" height="{height:.1f}"/>'
                )
        minute = time.strftime("%H:%M", time.gmtime((traffic.first_minute + i) * 60))
        label = ", ".join(f"{name} {c}" for (_, name), c in zip(SOURCES, counts, strict=True) if c)
        bars.append(
            f'<g class="bar" data-minute="{traffic.first_minute + i}" data-total="{sum(counts)}">'
            f"<title>{minute} UTC: {label}</title>{''.join(rects)}</g>"
        )
    legend = "".join(
        f'<li><span class="swatch src-{source}"></span>{_E(name)}</li>' for source, name in SOURCES
    )
    return (
        f'<svg class="chart" viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" width="{CHART_WIDTH}" '
        f'height="{CHART_HEIGHT}" role="img" aria-label="messages archived per minute">'
        f'<text class="axis" x="2" y="10">{peak if any(map(sum, traffic.per_minute)) else 0}'
        f" per minute</text>{''.join(bars)}"
        f'<line class="axis" x1="0" y1="{CHART_HEIGHT}" x2="{CHART_WIDTH}" y2="{CHART_HEIGHT}"/>'
        f'</svg><ul class="legend">{legend}</ul>'
    )


def _data(figure: Figure) -> str:
    return f' data-sample="{_E(figure.sample)}"' if figure.sample else ""


def _number(value: float) -> str:
    return f"{int(value):,}" if value == int(value) else f"{value:,.3f}"


def asset(name: str) -> tuple[bytes, str] | None:
    """The page's file ``name`` and its content type; None if it has none of that name."""
    if name not in ASSETS:
        return None
    return (_WEB / name).read_bytes(), ASSETS[name]
