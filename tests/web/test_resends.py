"""The page's resend policy (web/src/resends.mjs), run in Node without a browser.

ReliableChannel calls a resend that may settle the message before it returns: the
acknowledgement, or a send anew under the same id. A CI run of the browser test caught
the page throwing "Cannot read properties of undefined (reading 'timer')" from the old
schedule in that case. Each test drives that moment directly, with 1-ms delays.
"""

from __future__ import annotations

import json
from pathlib import Path

from nodescript import run_script

RESENDS = Path(__file__).resolve().parents[2] / "web" / "src" / "resends.mjs"

# Runs SCENARIO (a function body of `resends` and `sent`) for 200 ms, then prints what
# happened: the sends, what is still pending, and any uncaught error.
HARNESS = """
import { Resends } from %(module)s;
const errors = [];
process.on("uncaughtException", (err) => errors.push(String(err)));
const sent = [];
let connected = true;
const resends = new Resends(1, () => connected);
%(scenario)s
await new Promise((resolve) => setTimeout(resolve, 200));
console.log(JSON.stringify({ sent, pending: [...resends.pending.keys()], errors }));
process.exit(0);
"""


def _run(scenario: str) -> dict[str, list[str]]:
    script = HARNESS % {"module": json.dumps(RESENDS.as_uri()), "scenario": scenario}
    outcome: dict[str, list[str]] = run_script(script)
    return outcome


def test_a_resend_acknowledged_before_it_returns_ends_its_retries() -> None:
    outcome = _run(
        """
        resends.startRetries("m", () => { sent.push("m"); resends.stopRetries("m"); });
        """
    )
    assert outcome == {"sent": ["m"], "pending": [], "errors": []}


def test_a_resend_that_starts_retries_anew_keeps_one_schedule() -> None:
    outcome = _run(
        """
        let again = 0;
        const resend = () => {
          sent.push("m");
          if (again++ === 0) resends.startRetries("m", resend);
          else resends.stopRetries("m");
        };
        resends.startRetries("m", resend);
        """
    )
    # The first entry's chain stops when the second replaces it: two sends, not more.
    assert outcome == {"sent": ["m", "m"], "pending": [], "errors": []}


def test_nothing_is_resent_while_the_link_is_down_and_all_is_after_resume() -> None:
    outcome = _run(
        """
        connected = false;
        for (const id of ["a", "b", "c"]) resends.startRetries(id, () => sent.push(id));
        await new Promise((resolve) => setTimeout(resolve, 50));
        if (sent.length !== 0) throw new Error("resent while offline");
        connected = true;
        resends.resume();
        await new Promise((resolve) => setTimeout(resolve, 600));
        for (const id of ["a", "b", "c"]) resends.stopRetries(id);
        """
    )
    assert outcome["errors"] == []
    assert outcome["pending"] == []
    assert sorted(set(outcome["sent"])) == ["a", "b", "c"]
