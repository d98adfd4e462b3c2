"""The chat page of a real `sdsync store serve --web`, in Chromium, beside terminal chats.

One store node relays the channel's shard, serves LightPush, Filter and store-query, and
the page at ``/chat/``. Two browser pages (each in its own browser context, so each is its
own participant with its own localStorage) and two interactive `sdsync chat` processes
(relay nodes dialing the store node) join channel ``room``:

1. each of the four says something, and each sees the other three;
2. page B is taken offline (``BrowserContext.set_offline``): the others go on talking, B
   types a line while offline; back online, B reconnects (its connection count goes to
   2), catches up from the store, and its line reaches the others;
3. page A is reloaded without ``?name=``: it is still ``pa`` (localStorage), and its
   history, its own earlier lines included, comes back from the store; it speaks again;
4. every member ends with the same messages, once each, in the same order (Lamport
   timestamp, message id), the pages' lists held against the chats' ``--print-log``; the
   pages' own lines reach "acknowledged".

Then bad input: a text over the node's limit, a channel on a shard the node does not relay
and a channel name that is no topic segment each give a visible error in the page, a second
tab with the same name is asked for another, markup
in a text is shown as text and never run, and the node is unharmed. No page logs a
Content-Security-Policy violation or an uncaught error. Screenshots go to ``tmp_path``, or
to ``$SDSYNC_SCREENSHOTS`` (docs/img) when that is set.
"""

from __future__ import annotations

import os
import re
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chatprocess import TypedChat, assert_same_logs, wait_for
from storeprocess import StoreProcess, store_serve

from sdsync.store.chat_page import MAX_TEXT_BYTES
from sdsync.testing.hostile import soak_scale
from sdsync.waku.filter.rpc import FILTER_SUBSCRIBE_PROTOCOL
from sdsync.waku.lightpush.rpc import LIGHTPUSH_PROTOCOL
from sdsync.waku.relay.topics import WakuRelayConfig

# Chromium, a store node and terminal chats at once: never beside the other groups of
# processes (a chat group was starved past its patience when this ran alongside in CI).
pytestmark = pytest.mark.xdist_group("many-processes")

CHANNEL = "room"
PUBSUB = WakuRelayConfig().pubsub_topic(f"/sds/1/{CHANNEL}/proto")
OTHER_SHARD = next(
    f"/waku/2/rs/1/{shard}" for shard in range(8) if not PUBSUB.endswith(f"/{shard}")
)
WAIT_S = 60.0  # a liveness bound: each step normally takes a second or two
# Fast SDS timers on both sides, so that acknowledgements and resends come in seconds.
PAGE_TIMERS = "sync_ms=1000&retry_ms=2000"
CHAT_OPTIONS = ["--sync-interval-ms", "1000", "--retry-ms", "2000"]
HOSTILE = '<img src="x" onerror="window.pwned = 1"><b>bold</b>'


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreProcess]:
    data_dir = tmp_path_factory.mktemp("chat-node")
    protocols = (LIGHTPUSH_PROTOCOL, FILTER_SUBSCRIBE_PROTOCOL)
    with store_serve(data_dir, PUBSUB, *protocols, flags=["--web"]) as process:
        yield process


def screenshot_path(tmp_path: Path, name: str) -> Path:
    directory = os.environ.get("SDSYNC_SCREENSHOTS")
    return Path(directory) / name if directory else tmp_path / name


class Page:
    """One browser participant: a page in its own context, its console watched."""

    def __init__(self, browser: Any, base_url: str) -> None:
        self.base_url = base_url
        self.context = browser.new_context(viewport={"width": 1000, "height": 640})
        self.problems: list[str] = []
        self.page = self._new_page()

    def _new_page(self) -> Any:
        page = self.context.new_page()
        page.on("pageerror", lambda error: self.problems.append(f"uncaught: {error}"))
        page.on("console", self._console)
        return page

    def reopen(self, query: str) -> None:
        """Closes the tab and opens the page again in a new one (same browser profile, so
        the same localStorage)."""
        self.page.close()
        self.page = self._new_page()
        self.open(query)

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            self.problems.append(f"CSP: {message.text}")

    def open(self, query: str) -> None:
        """Loads the page and waits until it is subscribed and caught up."""
        self.page.goto(f"{self.base_url}/chat/?{query}")
        self.wait_status("subscription", "subscribed")
        self.wait_status("catchup", "caught-up")

    def wait_status(self, which: str, state: str) -> None:
        self.page.wait_for_selector(f"#{which}[data-state='{state}']", timeout=WAIT_S * 1000)

    def send(self, text: str) -> None:
        self.page.fill("#text", text)
        self.page.click("#send")

    def entries(self) -> list[dict[str, str]]:
        result: list[dict[str, str]] = self.page.eval_on_selector_all(
            "#log li",
            """items => items.map(li => ({id: li.dataset.id, sender: li.dataset.sender,
                lamport: li.dataset.lamport, state: li.dataset.state,
                text: li.querySelector('.text').textContent}))""",
        )
        return result

    def shows(self, *texts: str, timeout_s: float = WAIT_S) -> None:
        """Waits until the log holds each of ``texts``."""
        try:
            self.page.wait_for_function(
                "texts => texts.every(t => [...document.querySelectorAll('#log .text')]"
                ".some(e => e.textContent === t))",
                arg=list(texts),
                timeout=timeout_s * 1000,
            )
        except Exception as exc:  # Playwright's TimeoutError: say what the page shows
            raise AssertionError(f"{texts} not all shown:\n{self.describe()}") from exc

    def describe(self) -> str:
        status = self.page.eval_on_selector_all(
            "header dd, #error, #missing",
            "els => els.map(e => `${e.id}[${e.dataset.state ?? ''}]: ${e.textContent}`)",
        )
        lines = [*status, *(f"  {e}" for e in self.entries())]
        return "\n".join(lines)

    def connects(self) -> int:
        """How many times the page has connected to its node."""
        return int(self.page.get_attribute("#connection", "data-connects") or 0)

    def reconnected_after(self, outages: int) -> None:
        """The page connected once at first and once after each outage, plus once after
        each time it lost the node while online (a busy CI machine can cost a ping)."""
        drops = int(self.page.get_attribute("#connection", "data-drops") or 0)
        assert drops <= outages, f"the page lost its node {drops} times while online"
        assert self.connects() == 1 + outages + drops, f"{drops} drop(s) while online"

    def badge_of(self, text: str) -> str | None:
        """How the state of the line ``text`` reads in the page."""
        badges: list[str] = self.page.eval_on_selector_all(
            "#log li",
            "(items, text) => items.filter(li => li.querySelector('.text').textContent === text)"
            ".map(li => li.querySelector('.state').textContent)",
            text,
        )
        return badges[0] if badges else None

    def state_of(self, text: str) -> str | None:
        return next((e["state"] for e in self.entries() if e["text"] == text), None)

    def log(self, length: int, timeout_s: float = WAIT_S) -> list[dict[str, Any]]:
        """The page's log once it holds ``length`` wrapped messages, as `--print-log`
        prints a log."""

        def complete() -> list[dict[str, str]] | None:
            wrapped = [e for e in self.entries() if e["lamport"]]
            return wrapped if len(wrapped) == length else None

        entries = wait_for(complete, f"{length} messages in the page's log", timeout_s)
        return [
            {
                "message_id": e["id"],
                "sender_id": e["sender"],
                "lamport_timestamp": int(e["lamport"]),
                "text": e["text"],
            }
            for e in entries
        ]

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def pages(browser: Any, node: StoreProcess) -> Iterator[list[Page]]:
    opened = [Page(browser, node.url), Page(browser, node.url)]
    try:
        yield opened
    finally:
        for page in opened:
            page.close()


def terminal(tmp_path: Path, name: str, node: StoreProcess, channel: str = CHANNEL) -> TypedChat:
    tcp = next(addr for addr in node.relay_addrs if "/ws" not in addr)
    args = ["--peer", tcp, "--store", tcp, *CHAT_OPTIONS]
    return TypedChat(tmp_path, name, channel, args, patience_s=WAIT_S)


def chat_says(chat: TypedChat, sender: str, text: str) -> None:
    chat.shows(rf"{sender}: {re.escape(text)}$", f"{sender}'s {text!r}")


def test_two_pages_and_two_terminal_chats_end_with_one_log(
    tmp_path: Path, node: StoreProcess, pages: list[Page]
) -> None:
    page_a, page_b = pages
    page_a.open(f"channel={CHANNEL}&name=pa&{PAGE_TIMERS}")
    page_b.open(f"channel={CHANNEL}&name=pb&{PAGE_TIMERS}")
    # The bundle's js-waku is the one its mends were written for: all of them apply
    # (tests/web/test_mends.py: the same as in the interop tests' driver).
    mends = page_a.page.evaluate("window.sdsyncChat.mends.report")
    assert mends["installed"] == mends["written_for"], mends
    assert (mends["skipped"], mends["warnings"]) == ([], []), mends
    chats = [terminal(tmp_path, "ta", node), terminal(tmp_path, "tb", node)]
    ta, tb = chats
    try:
        for chat in chats:
            wait_for(chat.has_mesh, f"the store node in {chat.name}'s mesh", WAIT_S)
        # The operator sees the two pages as the node's Filter subscribers.
        assert node.metric("sdsync_store_filter_subscribers") == 2
        status = page_a.context.new_page()
        status.goto(f"{node.url}/status")
        assert status.text_content('[data-sample="sdsync_store_filter_subscribers"]') == "2"
        status.close()

        # 1. Each says something; each sees the other three.
        ta.type("ta: hello")
        page_a.send("pa: hello")
        tb.type("tb: hello")
        page_b.send("pb: hello")
        first = ["ta: hello", "pa: hello", "tb: hello", "pb: hello"]
        for page in pages:
            page.shows(*first)
        for chat in chats:
            for text in first:
                if not text.startswith(chat.name):
                    chat_says(chat, text.split(":")[0], text)

        # 2. B goes offline; the others talk on, B types a line meanwhile.
        page_b.context.set_offline(True)
        page_b.wait_status("connection", "offline")
        ta.type("ta: while pb was away")
        page_a.send("pa: while pb was away")
        page_a.shows("ta: while pb was away")
        tb.shows(r"pa: pa: while pb was away$", "pa's line")
        page_b.send("pb: typed offline")
        assert "pa: while pb was away" not in [e["text"] for e in page_b.entries()]
        page_b.context.set_offline(False)
        page_b.wait_status("connection", "connected")
        page_b.shows("ta: while pb was away", "pa: while pb was away")
        page_b.reconnected_after(1)
        page_a.shows("pb: typed offline")
        chat_says(ta, "pb", "pb: typed offline")

        # 3. A reloads without its name: same participant, history back from the store.
        page_a.open(f"channel={CHANNEL}&{PAGE_TIMERS}")
        assert page_a.page.text_content("#me") == "pa"
        page_a.shows(*first, "pa: while pb was away", "pb: typed offline")
        assert page_a.state_of("pa: hello") == "archived"
        page_a.send("pa: back after a reload")
        tb.type("tb: last")
        for page in pages:
            page.shows("pa: back after a reload", "tb: last")

        # 4. One log everywhere; the pages' lines acknowledged.
        texts = [*first, "ta: while pb was away", "pa: while pb was away", "pb: typed offline"]
        texts += ["pa: back after a reload", "tb: last"]
        for page, own in ((page_b, "pb: typed offline"), (page_a, "pa: back after a reload")):
            wait_for(lambda: page.state_of(own) == "acknowledged", f"{own!r} acknowledged", WAIT_S)  # noqa: B023
        page_logs = [page.log(len(texts)) for page in pages]
        page_a.page.screenshot(path=str(screenshot_path(tmp_path, "chat.png")))
        for chat in chats:
            chat.quit()
        chat_logs = [chat.print_log() for chat in chats]
    finally:
        for chat in chats:
            chat.stop()
    assert_same_logs([*chat_logs, *page_logs], Counter(texts))
    assert [page.problems for page in pages] == [[], []]


def test_bad_input_gets_a_visible_error_and_harms_nothing(
    tmp_path: Path, node: StoreProcess, pages: list[Page]
) -> None:
    page, elsewhere = pages
    page.open(f"channel=bad-input&name=mallory&{PAGE_TIMERS}")
    page.send("x" * (MAX_TEXT_BYTES + 1))
    page.page.wait_for_selector("#error:not([hidden])", timeout=WAIT_S * 1000)
    assert f"this node takes at most {MAX_TEXT_BYTES:,}" in (page.page.text_content("#error") or "")
    assert page.entries() == []
    page.send("a line of normal size")
    page.shows("a line of normal size")
    assert page.page.is_hidden("#error")
    # A second tab of the same browser would be the same participant (the name is in
    # localStorage): it is asked for another name instead.
    twin = page.context.new_page()
    twin.goto(f"{node.url}/chat/?channel=bad-input")
    twin.wait_for_selector("#join:not([hidden])", timeout=WAIT_S * 1000)
    assert "mallory is in bad-input in another tab" in (twin.text_content("#error") or "")
    assert twin.input_value("#join-name") == ""
    twin.close()
    # Markup in a message is text: shown as typed, never run.
    page.send(HOSTILE)
    page.shows(HOSTILE)
    assert page.page.locator("#log img").count() == 0
    assert page.page.evaluate("window.pwned") is None

    # A node that relays another shard: every /sds/1/... channel is autosharded to PUBSUB
    # (autosharding hashes the application and version, not the name), so it is refused.
    with store_serve(tmp_path / "other", OTHER_SHARD, flags=["--web"]) as other:
        elsewhere.page.goto(f"{other.url}/chat/?channel={CHANNEL}&name=mallory")
        elsewhere.page.wait_for_selector("#error:not([hidden])", timeout=WAIT_S * 1000)
        error = elsewhere.page.text_content("#error") or ""
        assert f'does not serve channel "{CHANNEL}"' in error, error
        assert f"{PUBSUB}, and the node relays {OTHER_SHARD}" in error, error
        assert elsewhere.page.is_hidden("#compose")
        elsewhere.page.screenshot(path=str(screenshot_path(tmp_path, "chat-unserved.png")))
        assert other.metric("sdsync_store_lightpush_total", status="200") == 0

    # A channel name that is no content topic segment: the join form says why.
    elsewhere.page.goto(f"{node.url}/chat?channel=a/b&name=mallory")
    elsewhere.page.wait_for_selector("#join:not([hidden])", timeout=WAIT_S * 1000)
    assert "A channel name is" in (elsewhere.page.text_content("#error") or "")

    with urllib.request.urlopen(f"{node.url}/health", timeout=10) as response:
        assert response.status == 200
    assert node.metric("sdsync_store_lightpush_total", status="200") >= 1
    assert [p.problems for p in pages] == [[], []]


def test_bursts_through_repeated_outages_end_in_one_log(
    tmp_path: Path, node: StoreProcess, pages: list[Page]
) -> None:
    """Round after round, page B goes offline and everyone (B too) sends a burst; B comes
    back. In the end: one log, each message once, every page line acknowledged. 3 rounds of
    4 lines each here, 10 of 20 in `make soak`."""
    rounds, burst = soak_scale(3, 10), soak_scale(4, 20)
    patience = soak_scale(WAIT_S, 5 * WAIT_S)  # for the waits on a whole burst
    channel = "bursts"
    page_a, page_b = pages
    page_a.open(f"channel={channel}&name=qa&{PAGE_TIMERS}")
    page_b.open(f"channel={channel}&name=qb&{PAGE_TIMERS}")
    chat = terminal(tmp_path, "tq", node, channel)
    texts: list[str] = []
    try:
        wait_for(chat.has_mesh, "the store node in the chat's mesh", WAIT_S)
        for r in range(rounds):
            page_b.context.set_offline(True)
            page_b.wait_status("connection", "offline")
            for i in range(burst):
                for sender in ("qa", "qb", "tq"):
                    texts.append(text := f"{sender} {r}.{i}")
                    if sender == "tq":
                        chat.type(text)
                    else:
                        (page_a if sender == "qa" else page_b).send(text)
            page_b.context.set_offline(False)
            page_b.wait_status("connection", "connected")
        for page in pages:
            page.shows(*texts, timeout_s=patience)
        for page, own in ((page_a, "qa"), (page_b, "qb")):
            mine = [t for t in texts if t.startswith(own)]
            try:
                wait_for(
                    lambda: all(page.state_of(t) == "acknowledged" for t in mine),  # noqa: B023
                    f"every line of {own} acknowledged",
                    patience,
                )
            except AssertionError as exc:
                states = Counter(page.state_of(t) for t in mine)
                lightpush = {
                    s: node.metric("sdsync_store_lightpush_total", status=s) for s in ("200", "429")
                }
                raise AssertionError(f"{exc}: {states}; node LightPush {lightpush}") from None
        page_logs = [page.log(len(texts), patience) for page in pages]
        chat.quit()
        chat_log = chat.print_log()
    finally:
        chat.stop()
    assert_same_logs([chat_log, *page_logs], Counter(texts))
    page_b.reconnected_after(rounds)
    assert [page.problems for page in pages] == [[], []]
