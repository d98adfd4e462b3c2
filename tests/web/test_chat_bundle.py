"""The chat page's script, shipped in the package, is the one the lockfile builds.

``make web`` bundles ``web/`` (its sources, with the packages ``web/package-lock.json``
pins) into ``src/sdsync/store/web/chat/chat.js`` and records in ``chat.json`` the sha256 of
every input and of the bundle. The first test holds that record against the files as they
are (no Node needed): a source or lockfile changed without ``make web`` fails it. The
second builds the bundle again from ``web/node_modules`` (``npm ci``, which ``make test``
runs) and compares bytes: esbuild's output depends only on its version, options and
inputs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
SHIPPED = ROOT / "src" / "sdsync" / "store" / "web" / "chat"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_record_names_the_inputs_and_bundle_as_they_are() -> None:
    record = json.loads((SHIPPED / "chat.json").read_text())
    inputs = {"build.mjs", "package.json", "package-lock.json"}
    inputs |= {f"src/{path.name}" for path in (WEB / "src").glob("*.mjs")}
    assert set(record["inputs_sha256"]) == inputs
    stale = [
        name for name, digest in record["inputs_sha256"].items() if sha256(WEB / name) != digest
    ]
    assert stale == [], f"changed since the bundle was built (run make web): {stale}"
    assert record["bundle_sha256"] == sha256(SHIPPED / "chat.js")
    assert record["bundle_bytes"] == (SHIPPED / "chat.js").stat().st_size


def test_the_lockfile_builds_the_shipped_bundle_byte_for_byte() -> None:
    if shutil.which("node") is None or not (WEB / "node_modules" / "esbuild").is_dir():
        pytest.fail("web/node_modules is not installed: run `make web` (make test installs it)")
    result = subprocess.run(
        ["node", str(WEB / "build.mjs"), "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
