"""The page's kept lines (web/src/pending.mjs), run in Node over a storage like the
browser's localStorage: kept in order and once, forgotten by id, separate per channel and
name, a refusing browser told in words, and an unreadable entry not fatal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nodescript import run_script

PENDING = Path(__file__).resolve().parents[2] / "web" / "src" / "pending.mjs"

# A Map-backed storage with localStorage's methods; `full` makes setItem throw as a full
# (or disabled) one does. SCENARIO fills `out`, which is printed as JSON.
HARNESS = """
import { PendingLines } from %(module)s;
class Storage {
  constructor() { this.items = new Map(); this.full = false; }
  getItem(k) { return this.items.has(k) ? this.items.get(k) : null; }
  setItem(k, v) {
    if (this.full) throw new DOMException("The quota has been exceeded.", "QuotaExceededError");
    this.items.set(k, String(v));
  }
  removeItem(k) { this.items.delete(k); }
}
const storage = new Storage();
const out = {};
%(scenario)s
console.log(JSON.stringify(out));
"""


def run(scenario: str) -> dict[str, Any]:
    script = HARNESS % {"module": json.dumps(PENDING.as_uri()), "scenario": scenario}
    outcome: dict[str, Any] = run_script(script)
    return outcome


def test_lines_are_kept_in_order_once_and_forgotten_by_id() -> None:
    out = run("""
        const lines = new PendingLines(storage, "room", "pa");
        out.added = [lines.add("a", "first"), lines.add("b", "second"), lines.add("a", "first")];
        out.kept = lines.all();
        out.again = new PendingLines(storage, "room", "pa").all();  // a reload reads them
        out.removed = [lines.remove("a"), lines.remove("a")];
        out.left = lines.all();
        lines.remove("b");
        out.keys = [...storage.items.keys()];
    """)
    assert out["added"] == [None, None, None]
    assert (
        out["kept"]
        == out["again"]
        == [
            {"messageId": "a", "text": "first"},
            {"messageId": "b", "text": "second"},
        ]
    )
    assert out["removed"] == [True, False]
    assert out["left"] == [{"messageId": "b", "text": "second"}]
    assert out["keys"] == []  # nothing left behind once every line is settled


def test_each_channel_and_name_keeps_its_own_lines() -> None:
    out = run("""
        new PendingLines(storage, "room", "pa").add("a", "x");
        new PendingLines(storage, "room", "pb").add("b", "y");
        new PendingLines(storage, "other", "pa").add("c", "z");
        out.pa = new PendingLines(storage, "room", "pa").all().map((l) => l.messageId);
        out.pb = new PendingLines(storage, "room", "pb").all().map((l) => l.messageId);
    """)
    assert (out["pa"], out["pb"]) == (["a"], ["b"])


def test_a_browser_that_refuses_is_told_in_words_and_nothing_breaks() -> None:
    out = run("""
        const lines = new PendingLines(storage, "room", "pa");
        lines.add("a", "kept");
        storage.full = true;
        out.refused = lines.add("b", "not kept");
        out.kept = lines.all().map((l) => l.messageId);
    """)
    assert "did not keep the line" in out["refused"] and "quota" in out["refused"]
    assert out["kept"] == ["a"]


@pytest.mark.parametrize("stored", ["not json", '{"a": 1}', '[{"messageId": 5}, null, 3]'])
def test_an_unreadable_entry_counts_as_no_lines(stored: str) -> None:
    out = run(f"""
        storage.items.set("sdsync.chat.pending.room.pa", {json.dumps(stored)});
        const lines = new PendingLines(storage, "room", "pa");
        out.before = lines.all();
        lines.add("a", "new");
        out.after = lines.all();
    """)
    assert out["before"] == []
    assert out["after"] == [{"messageId": "a", "text": "new"}]
