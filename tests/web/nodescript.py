"""Run a page module's test script in Node (no browser): what it prints, as JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest


def run_script(script: str) -> Any:
    """``script`` (an ES module that prints one JSON value) run by ``node``; the value."""
    if shutil.which("node") is None:
        pytest.fail("node is not installed (make test needs it for the web tests)")
    result = subprocess.run(
        ["node", "--input-type=module", "-e", script],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(result.stdout)
