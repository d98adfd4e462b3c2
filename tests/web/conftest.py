"""Browser tests: Playwright (Python) driving Debian's Chromium, headless.

Playwright's own browser download is not reachable from CI, so the browser is the system's
``chromium`` (``make chromium`` installs Debian's package; ``SDSYNC_CHROMIUM`` names another
binary). Without Playwright or Chromium the tests skip locally and fail in CI
(:mod:`testdeps`). ``--no-sandbox``: CI runs as root, where Chromium's sandbox refuses to
start.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from testdeps import in_ci, require


def chromium_path() -> str | None:
    return (
        os.environ.get("SDSYNC_CHROMIUM")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, headless, shared by a module's tests (each opens its own context).

    Per module, not per session: Playwright's sync API keeps an event loop running in the
    thread while it is open, and a later test of another module in the same worker could
    not call ``asyncio.run``."""
    sync_api = require("playwright.sync_api", "the browser tests; make test installs it")
    path = chromium_path()
    if path is None:
        message = "no Chromium (make chromium installs Debian's; or set SDSYNC_CHROMIUM)"
        if in_ci():
            pytest.fail(f"{message}; CI is set, so the browser tests must run", pytrace=False)
        pytest.skip(message)
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=path, headless=True, args=["--no-sandbox"]
        )
        try:
            yield chromium
        finally:
            chromium.close()
