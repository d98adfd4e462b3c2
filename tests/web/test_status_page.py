"""The operator's status page of a real `sdsync store serve`, in Chromium.

Messages are posted with the token (and refused without it), then the page is read in a
headless Chromium and held against the node's ``/metrics`` read at the same moment: every
figure that names a sample shows that sample's value; the chart draws the posted messages;
the page loads with no console error (a CSP violation is one); a hostile content topic is
shown as text; the admin part needs the token. The screenshot goes to ``tmp_path`` (its
path printed), or to ``$SDSYNC_SCREENSHOTS/status.png`` when that is set (docs/img).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from storeprocess import StoreProcess, store_serve

from sdsync.store import StoredMessage
from sdsync.store.rest import entry_json
from sdsync.store.status import sample_key
from sdsync.wire.waku import WakuMessage

PUBSUB = "/waku/2/rs/1/0"
TOKEN = "status-token"
HOSTILE = '<script>alert("x")</script><b>&amp;'
CHAT = "/app/1/chat/proto"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreProcess]:
    """A store node holding 5 chat messages and 3 on a hostile topic, posted with the
    token, and 2 refused requests."""
    data_dir = tmp_path_factory.mktemp("status-node")
    with store_serve(data_dir, PUBSUB, flags=["--token", TOKEN]) as process:
        now = time.time_ns()
        messages = [_message(CHAT, now - i * 10**9, i) for i in range(5)]
        messages += [_message(HOSTILE, now - i * 10**9, i) for i in range(3)]
        assert _post(process.url, messages, TOKEN) == 200
        assert _post(process.url, messages[:1], None) == 401
        assert _get_status(f"{process.url}/store/v3/messages?pageSize=x") == 400
        yield process


def _message(content_topic: str, timestamp: int, i: int) -> StoredMessage:
    waku = WakuMessage(payload=f"m{i}".encode(), content_topic=content_topic, timestamp=timestamp)
    return StoredMessage.of(PUBSUB, waku)


def _post(url: str, messages: list[StoredMessage], token: str | None) -> int:
    body = json.dumps({"messages": [entry_json(m) for m in messages]}).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{url}/store/v3/messages", body, headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        sample_key(sample.name, sample.labels): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _open(browser: Any, url: str, **context_options: Any) -> tuple[Any, Any, list[str]]:
    """A fresh page on ``url``/status, and the console errors it logs (CSP violations
    are reported there)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900}, **context_options)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda d: errors.append(f"dialog: {d.message}"))
    response = page.goto(f"{url}/status", wait_until="load")
    assert response is not None and response.status == 200
    csp = response.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "unsafe-inline" not in csp
    return context, page, errors


def test_status_page_shows_what_metrics_report(
    browser: Any, node: StoreProcess, tmp_path: Path
) -> None:
    context, page, errors = _open(browser, node.url)
    try:
        shown = {
            element.get_attribute("data-sample"): element.inner_text()
            for element in page.locator("[data-sample]").all()
        }
        metrics = _metrics(node.url)
        # The figures the test made, as /metrics counts them and as the page shows them.
        made = {
            sample_key("sdsync_store_messages", {}): 8,
            sample_key("sdsync_store_ingested_messages_total", {"source": "http"}): 8,
            sample_key(
                "sdsync_store_refused_total",
                {"route": "POST /store/v3/messages", "reason": "missing_token"},
            ): 1,
            sample_key(
                "sdsync_store_refused_total",
                {"route": "GET /store/v3/messages", "reason": "bad_page_size"},
            ): 1,
        }
        for key, count in made.items():
            assert metrics[key] == count, key
            assert shown[key] == str(count), key
        for key, text in shown.items():
            assert float(text.replace(",", "")) == metrics[key], key

        # The chart: the 8 messages, in POST's colour, in the last minutes' bars.
        chart = page.locator("svg.chart")
        box = chart.bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 50
        bars = chart.locator("g.bar")
        assert 1 <= bars.count() <= 2  # posted within a minute: one bar, or two across a minute
        assert sum(int(b.get_attribute("data-total") or 0) for b in bars.all()) == 8
        rect = chart.locator("rect.src-http").first.bounding_box()
        assert rect is not None and rect["height"] > 0 and rect["width"] > 0
        fill = chart.locator("rect.src-http").first.evaluate("e => getComputedStyle(e).fill")
        assert fill == "rgb(26, 127, 55)"  # status.css applied: the stylesheet loaded

        # The hostile topic is text in its cell, never markup.
        topics = page.locator("#topics td")
        assert HOSTILE in topics.all_inner_texts()
        assert page.locator("script").count() == 0 and page.locator("b").count() == 0

        # Without the token, no admin part.
        assert page.locator("#admin").count() == 0
        assert errors == []
        shot = Path(os.environ.get("SDSYNC_SCREENSHOTS") or tmp_path) / "status.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"status page screenshot: {shot}")
    finally:
        context.close()


def test_status_page_admin_part_needs_the_token(browser: Any, node: StoreProcess) -> None:
    context, page, errors = _open(
        browser, node.url, extra_http_headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        admin = page.locator("#admin")
        assert admin.count() == 1
        assert "sqlite" in admin.inner_text()
        assert "periodic Store Sync is off" in admin.inner_text()
        assert errors == []
    finally:
        context.close()
    context, page, errors = _open(
        browser, node.url, extra_http_headers={"Authorization": "Bearer wrong"}
    )
    try:
        assert page.locator("#admin").count() == 0
        assert errors == []
    finally:
        context.close()


def test_root_redirects_to_the_status_page(browser: Any, node: StoreProcess) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{node.url}/", wait_until="load")
        assert page.url == f"{node.url}/status"
        assert page.title() == "sdsync store node: status"
    finally:
        context.close()
