"""The chat page's cost to a visitor: bytes loaded and time to the first message.

One `sdsync store serve --web` on loopback holds one message of channel ``bench`` (sent by
a scripted `sdsync chat`). Chromium (Debian's, through Playwright) opens the page
``--runs`` times, each in a fresh browser context (a cold cache), then once more as a
reload of the last one (a warm cache: ETags answer 304). Per load it records the bytes
transferred (the Resource Timing API's ``transferSize``, what went over the wire, gzip
included) and, from the start of navigation: DOMContentLoaded, the service node
connected and identified, the Filter subscription, and the stored message shown (the
store catch-up done and the message delivered by the channel).

The anchor is the same js-waku light node in Node (tests/interop/waku_light/light.mjs,
@waku/sdk 0.0.36) dialing the same node over the same WebSocket listener: the time from
spawning it to the stored message in its store query answer. Ratios are page / Node.

    .venv/bin/python bench/chat_page.py [--runs 5]

Needs Chromium (make chromium) and tests/interop/waku_light/node_modules (make test).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import Browser, Page, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
LIGHT = ROOT / "tests" / "interop" / "waku_light" / "light.mjs"
CHANNEL = "bench"
SEED = "the message already in the store"
TIMEOUT_MS = 60_000
MILESTONES = ("dom", "connected", "subscribed", "first message")


def start_node(data_dir: Path) -> tuple[subprocess.Popen[str], str, str, str]:
    """`store serve --web`: the process, its HTTP URL, its TCP and WebSocket addresses."""
    argv = [sys.executable, "-m", "sdsync.cli", "store", "serve", "--web"]
    argv += ["--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--retention", "none"]
    node = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert node.stdout is not None
    url = node.stdout.readline().split()[4]
    relay = node.stdout.readline()
    addrs = re.findall(r"(/ip4/\S+?/p2p/\w+)", relay)
    tcp = next(a for a in addrs if "/ws/" not in a)
    ws = next(a for a in addrs if "/ws/" in a)
    return node, url, tcp, ws


def seed(tcp: str, state: Path) -> None:
    argv = [sys.executable, "-m", "sdsync.cli", "chat", "--channel", CHANNEL, "--name", "seed"]
    argv += ["--state-dir", str(state), "--peer", tcp, "--send", SEED]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


def load(page: Page, url: str) -> dict[str, float]:
    """Opens ``url``; the bytes it transferred and its milestones in ms from navigation."""
    page.goto(url)
    page.wait_for_selector("#connection[data-state='connected']", timeout=TIMEOUT_MS)
    connected = page.evaluate("performance.now()")
    page.wait_for_selector("#subscription[data-state='subscribed']", timeout=TIMEOUT_MS)
    subscribed = page.evaluate("performance.now()")
    page.wait_for_function(
        "text => [...document.querySelectorAll('#log .text')].some(e => e.textContent === text)",
        arg=SEED,
        timeout=TIMEOUT_MS,
    )
    shown = page.evaluate("performance.now()")
    timing: dict[str, float] = page.evaluate(
        """() => {
            const nav = performance.getEntriesByType('navigation')[0];
            const resources = performance.getEntriesByType('resource');
            const bytes = [nav, ...resources].reduce((sum, e) => sum + e.transferSize, 0);
            return {bytes, dom: nav.domContentLoadedEventEnd};
        }"""
    )
    return {**timing, "connected": connected, "subscribed": subscribed, "first message": shown}


def browser_loads(
    browser: Browser, url: str, runs: int
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """``runs`` loads in fresh contexts, then a load and a reload in one (the warm one)."""
    cold: list[dict[str, float]] = []
    for i in range(runs):
        context = browser.new_context()
        cold.append(load(context.new_page(), f"{url}&name=visitor{i}"))
        context.close()
        print(f"  page load {i + 1}/{runs}: {cold[-1]['first message']:.0f} ms", file=sys.stderr)
    context = browser.new_context()
    page = context.new_page()
    load(page, f"{url}&name=returning")
    warm = load(page, f"{url}&name=returning")
    context.close()
    return cold, warm


def node_light_client(ws: str) -> float:
    """Seconds from spawning light.mjs to the stored message in its store answer."""
    started = time.perf_counter()
    light = subprocess.Popen(
        ["node", str(LIGHT), "--peer", ws],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert light.stdin is not None and light.stdout is not None
    try:
        ready = json.loads(light.stdout.readline())
        assert ready.get("ok"), ready
        request = {"op": "store_query", "content_topic": f"/sds/1/{CHANNEL}/proto"}
        light.stdin.write(json.dumps(request) + "\n")
        light.stdin.flush()
        answer = json.loads(light.stdout.readline())
        assert answer.get("ok") and answer["messages"], answer
        return time.perf_counter() - started
    finally:
        light.kill()
        light.wait()


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="cold page loads (and Node runs)")
    args = parser.parse_args()
    chromium = os.environ.get("SDSYNC_CHROMIUM") or shutil.which("chromium")
    if chromium is None or not (LIGHT.parent / "node_modules").is_dir():
        sys.exit("needs Chromium (make chromium) and tests/interop/waku_light/node_modules")
    with tempfile.TemporaryDirectory() as tmp:
        node, url, tcp, ws = start_node(Path(tmp) / "node")
        try:
            seed(tcp, Path(tmp) / "seed")
            page_url = f"{url}/chat/?channel={CHANNEL}"
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=chromium, headless=True, args=["--no-sandbox"]
                )
                cold, warm = browser_loads(browser, page_url, args.runs)
                browser.close()
            node_s = [node_light_client(ws) for _ in range(args.runs)]
        finally:
            node.terminate()
            node.wait()
    node_ms = [s * 1000 for s in node_s]
    print(
        f"chat page, {args.runs} cold loads (fresh context) and 1 warm reload; ms from navigation"
    )
    print(f"{'':24} {'cold, median (min-max)':>28} {'warm':>10}")
    sent = summary([r["bytes"] for r in cold])
    print(f"{'bytes transferred':24} {sent:>28} {warm['bytes']:>10,.0f}")
    for key in MILESTONES:
        print(f"{key:24} {summary([r[key] for r in cold]):>28} {warm[key]:>10,.0f}")
    ratio = statistics.median(r["first message"] for r in cold) / statistics.median(node_ms)
    print(f"js-waku light node in Node, spawn to the stored message: {summary(node_ms)} ms")
    print(f"first message, page (cold) / Node: {ratio:.2f}x")


if __name__ == "__main__":
    main()
