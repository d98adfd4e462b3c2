"""Issue 38's six attacks on a real ``sdsync store serve``, one table of what each left.

The attacks are the tests' own, imported and run as they are (each test function starts
its node, attacks it from 127.0.0.2 and the like while an honest peer probes, and
asserts); nothing is copied here:

1. a fresh identity per refusal (LightPush) — tests/store/test_hostile_node.py row 5b;
2. a handful of addresses fill the handshake table — row 3b;
3. ``/status`` and ``/metrics`` in a loop — tests/store/test_public_pages.py;
4. 250 connections from 127.0.0.1, and a greedy client behind a trusted proxy —
   tests/store/test_proxy_clients.py;
5. memory given back: unread store answers, a relay flood, RIBLT streams never read —
   rows 4, 7 and 22;
6. close means close: a client that reconnects from the honest peer's address — row 6.
   Not a latency attack (it asks nothing of the node but connections that must go at
   once): its figures say whether the reconnections were refused and the honest peer,
   on the same address, still served.

For each it prints the honest peer's probes (count, failed, p50 and max latency in
seconds), the node's RSS before the attack, its peak, and 60 s after the attack's end
(``SDSYNC_GIVE_BACK_WHOLE=1``: :func:`sdsync.testing.hostile.given_back` reads on to the
end of the minute, where the tests stop at the first reading within 50 MB), the
refusals the node counted, the wall time, and the machine's 1-minute load average
sampled every second while the attack ran (mean and max; the attacks share 2 CPUs with
whatever else runs, so a high load is said, not hidden). ``--soak`` runs the sizes of
``make soak`` (``SDSYNC_SOAK=1``). An attack whose test fails is marked FAILED with its
assertion; the exit status is then 1. Latencies are reported, never raced.

    .venv/bin/python bench/hostile_attacks.py             # make test's sizes, ~10 min
    .venv/bin/python bench/hostile_attacks.py --soak      # make soak's sizes
    .venv/bin/python bench/hostile_attacks.py --only 1,6  # some attacks
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sdsync.testing.hostile import load_average

ROOT = Path(__file__).resolve().parent.parent
_MB = 2**20


@dataclass
class Row:
    attack: int
    name: str
    probes: int
    failed: int
    p50_s: float
    max_s: float
    rss_start_mb: float
    rss_peak_mb: float
    rss_after_mb: float
    after_s: float
    refusals: str
    wall_s: float
    load_mean: float
    load_max: float
    error: str = ""


class LoadSampler:
    """The 1-minute load average (/proc/loadavg), every second, in a thread."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(load_average())
            self._stop.wait(1.0)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


#: The attacks: number, name, and the test that runs it (module, the start of its name).
ATTACKS = [
    (1, "fresh identity per refusal", "test_hostile_node", "test_row5b_"),
    (2, "a handful of addresses", "test_hostile_node", "test_row3b_"),
    (3, "/status and /metrics loop", "test_public_pages", "test_a_status_and_metrics_loop"),
    (4, "250 connections from loopback", "test_proxy_clients", "test_connections_from_loopback"),
    (4, "behind a trusted proxy", "test_proxy_clients", "test_a_trusted_proxys_clients"),
    (5, "unread store answers", "test_hostile_node", "test_row4_"),
    (5, "relay flood", "test_hostile_node", "test_row7_"),
    (5, "RIBLT streams never read", "test_hostile_node", "test_row22_"),
    (6, "close means close", "test_hostile_node", "test_row6_"),
]


def the_test(module: str, prefix: str) -> Callable[[Path], None]:
    """The one test function of ``module`` (from tests/ or tests/store/) named
    ``prefix``..., imported once the environment is set (sizes are read at import)."""
    for folder in ("tests", "tests/store"):
        if str(ROOT / folder) not in sys.path:
            sys.path.insert(0, str(ROOT / folder))
    imported = importlib.import_module(module)
    (name,) = [name for name in vars(imported) if name.startswith(prefix)]
    test: Callable[[Path], None] = getattr(imported, name)
    return test


def run_one(number: int, name: str, test: Callable[[Path], None], reported: list[Any]) -> Row:
    """``test`` on a fresh folder; its figures, from what it reported."""
    seen = len(reported)
    error = ""
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="hostile-bench-") as folder,
        LoadSampler() as load,
        contextlib.redirect_stdout(io.StringIO()),
    ):
        try:
            test(Path(folder))
        except AssertionError as exc:
            error = f"FAILED: {str(exc).splitlines()[0][:160]}"
        except Exception as exc:  # an attack that broke: said, and the next one runs
            error = f"ERROR: {type(exc).__name__}: {exc}"[:160]
            traceback.print_exc()
    wall = time.monotonic() - started
    samples = load.samples or [0.0]
    mean, top = sum(samples) / len(samples), max(samples)
    if len(reported) == seen:  # it failed before it reported
        return Row(number, name, 0, 0, 0, 0, 0, 0, 0, 0, "", wall, mean, top, error or "?")
    figures = reported[-1]
    watched, back = figures.watched, figures.back
    return Row(
        attack=number,
        name=name,
        probes=watched.probes,
        failed=watched.failures,
        p50_s=watched.latency_p50_s,
        max_s=watched.latency_max_s,
        rss_start_mb=watched.rss_before / _MB,
        rss_peak_mb=watched.rss_peak / _MB,
        rss_after_mb=(watched.rss_before + back.kept) / _MB,
        after_s=back.after_s,
        refusals=figures.refusals,
        wall_s=wall,
        load_mean=mean,
        load_max=top,
        error=error,
    )


def table(rows: list[Row]) -> str:
    head = (
        "| # | attack | probes | failed | p50 s | max s | RSS start MB | peak MB |"
        " 60 s after MB | refusals | wall s | load mean/max |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        refusals = r.refusals.replace("|", "/") + (f" **{r.error}**" if r.error else "")
        lines.append(
            f"| {r.attack} | {r.name} | {r.probes} | {r.failed} | {r.p50_s:.2f} | {r.max_s:.2f}"
            f" | {r.rss_start_mb:.0f} | {r.rss_peak_mb:.0f} | {r.rss_after_mb:.0f}"
            f" ({r.rss_after_mb - r.rss_start_mb:+.0f}, at {r.after_s:.0f} s)"
            f" | {refusals} | {r.wall_s:.0f} | {r.load_mean:.2f}/{r.load_max:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--soak", action="store_true", help="make soak's sizes (SDSYNC_SOAK=1)")
    parser.add_argument("--only", default="", help="attack numbers, e.g. 1,6 (default: all)")
    parser.add_argument(
        "--first-within",
        action="store_true",
        help="stop reading RSS once within 50 MB, as the tests do (default: read 60 s)",
    )
    parser.add_argument("--json", type=Path, help="write the rows as JSON here too")
    args = parser.parse_args()
    if args.soak:
        os.environ["SDSYNC_SOAK"] = "1"
    if not args.first_within:
        os.environ["SDSYNC_GIVE_BACK_WHOLE"] = "1"
    logging.disable(logging.ERROR)  # py-libp2p's complaints about refused dials

    wanted = {int(n) for n in args.only.split(",") if n}
    chosen = [
        (number, name, the_test(module, prefix))
        for number, name, module, prefix in ATTACKS
        if not wanted or number in wanted
    ]
    reported = importlib.import_module("test_hostile_node").REPORTED
    print(
        f"{len(chosen)} attacks, {'soak' if args.soak else 'test'} sizes;"
        f" load average at the start {load_average():.2f}",
        flush=True,
    )
    rows = []
    for number, name, test in chosen:
        rows.append(run_one(number, name, test, reported))
        r = rows[-1]
        print(
            f"  {number} {name}: {r.wall_s:.0f} s, load {r.load_mean:.2f}"
            f"{'; ' + r.error if r.error else ''}",
            flush=True,
        )
    print()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
