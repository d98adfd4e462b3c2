"""Our RBSR and Prolly-tree sync versus negentropy (nostr-tools nip77), on the same sets.

For each difference count d, two stores share N items and each holds d/2 of its own. The
sets are drawn from a seeded generator, written to a binary file and reconciled, in the
same run, by negentropy in Node (``bench/js/negentropy/negentropy_bench.mjs``) and by our
two methods in Python. Reported per method: bytes each way, frames and round trips, and
sync time (stores already built), with ratios to negentropy.

Timestamps are whole milliseconds inside a one-hour window, identical for all three:
nostr-tools encodes varints with 32-bit integer operations, so it cannot carry nanosecond
timestamps. (With nanoseconds our bounds grow by about three bytes each.)

``--sweep`` measures our parameters instead (RBSR fanout x item threshold, Prolly fanout).
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from sdsync.reconcile import (
    MemoryItemStore,
    Method,
    ProllyParams,
    RbsrParams,
    reconcile_in_memory,
)

JS_DIR = Path(__file__).parent / "js" / "negentropy"
WINDOW_MS = 3_600_000
UNLIMITED = 1 << 30


@dataclass(frozen=True)
class Sets:
    ts_a: npt.NDArray[np.int64]
    hashes_a: npt.NDArray[np.uint8]
    ts_b: npt.NDArray[np.int64]
    hashes_b: npt.NDArray[np.uint8]
    only_a: set[tuple[int, bytes]]
    only_b: set[tuple[int, bytes]]


@dataclass(frozen=True)
class Row:
    method: str
    bytes_a_to_b: int
    bytes_b_to_a: int
    frames: int
    seconds: float
    exact: bool

    @property
    def total(self) -> int:
        return self.bytes_a_to_b + self.bytes_b_to_a

    @property
    def round_trips(self) -> int:
        return (self.frames + 1) // 2


def make_sets(n: int, d: int, seed: int) -> Sets:
    rng = np.random.default_rng(seed)
    ts = rng.integers(0, WINDOW_MS, size=n + d, dtype=np.int64)
    hashes = rng.integers(0, 256, size=(n + d, 32), dtype=np.uint8)
    in_a = np.ones(n + d, dtype=bool)
    in_b = np.ones(n + d, dtype=bool)
    in_b[n : n + d // 2] = False
    in_a[n + d // 2 :] = False

    def items(mask: npt.NDArray[np.bool_]) -> set[tuple[int, bytes]]:
        return {(int(t), h.tobytes()) for t, h in zip(ts[mask], hashes[mask], strict=True)}

    extra = np.zeros(n + d, dtype=bool)
    extra[n:] = True
    return Sets(
        ts[in_a], hashes[in_a], ts[in_b], hashes[in_b], items(extra & ~in_b), items(extra & ~in_a)
    )


def write_sets(sets: Sets, path: Path) -> None:
    record = np.dtype([("ts", "<f8"), ("hash", "u1", 32)])
    with path.open("wb") as f:
        f.write(struct.pack("<II", len(sets.ts_a), len(sets.ts_b)))
        for ts, hashes in ((sets.ts_a, sets.hashes_a), (sets.ts_b, sets.hashes_b)):
            rows = np.zeros(len(ts), dtype=record)
            rows["ts"] = ts
            rows["hash"] = hashes
            f.write(rows.tobytes())


def ensure_node_modules() -> None:
    if not (JS_DIR / "node_modules" / "nostr-tools").exists():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=JS_DIR, check=True
        )


def run_negentropy(path: Path, sets: Sets, frame_limit: int) -> Row:
    out = subprocess.run(
        ["node", str(JS_DIR / "negentropy_bench.mjs"), str(path), str(frame_limit)],
        check=True,
        capture_output=True,
        text=True,
    )
    res = json.loads(out.stdout)
    exact = res["onlyA"] == len(sets.only_a) and res["onlyB"] == len(sets.only_b)
    return Row(
        "negentropy", res["bytesAtoB"], res["bytesBtoA"], res["frames"], res["syncSeconds"], exact
    )


def run_ours(
    method: Method,
    stores: tuple[MemoryItemStore, MemoryItemStore],
    sets: Sets,
    frame_limit: int,
    *,
    rbsr: RbsrParams | None = None,
    prolly: ProllyParams | None = None,
    label: str | None = None,
) -> Row:
    t0 = time.perf_counter()
    res = reconcile_in_memory(*stores, method, max_frame_size=frame_limit, rbsr=rbsr, prolly=prolly)
    seconds = time.perf_counter() - t0
    exact = (
        set(res.have) == sets.only_a
        and set(res.need) == sets.only_b
        and set(res.peer_have) == sets.only_b
        and set(res.peer_need) == sets.only_a
    )
    return Row(label or method, res.bytes_a_to_b, res.bytes_b_to_a, res.frames, seconds, exact)


def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}" if y else "-"


def print_table(n: int, d: int, frame_limit: int, rows: list[Row]) -> list[str]:
    anchor = rows[0]
    limit = "none" if frame_limit >= UNLIMITED else f"{frame_limit:,} B"
    lines = [
        f"N = {n:,}, d = {d:,}, frame limit {limit}",
        "",
        "| method | bytes a→b | bytes b→a | total | ×neg | frames | round trips | ×neg "
        "| time s | ×neg | exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.method} | {r.bytes_a_to_b:,} | {r.bytes_b_to_a:,} | {r.total:,} "
            f"| {ratio(r.total, anchor.total)} | {r.frames} | {r.round_trips} "
            f"| {ratio(r.round_trips, anchor.round_trips)} | {r.seconds:.2f} "
            f"| {ratio(r.seconds, anchor.seconds)} | {'yes' if r.exact else 'NO'} |"
        )
    print("\n".join(lines) + "\n", flush=True)
    return lines


def build_stores(sets: Sets) -> tuple[MemoryItemStore, MemoryItemStore]:
    return (
        MemoryItemStore.from_arrays(sets.ts_a, sets.hashes_a),
        MemoryItemStore.from_arrays(sets.ts_b, sets.hashes_b),
    )


def compare(n: int, diffs: list[int], frame_limits: list[int], seed: int) -> list[str]:
    ensure_node_modules()
    report: list[str] = []
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sets.bin"
        for d in diffs:
            sets = make_sets(n, d, seed)
            write_sets(sets, path)
            t0 = time.perf_counter()
            stores = build_stores(sets)
            print(f"built two stores of ~{n:,} items in {time.perf_counter() - t0:.2f} s")
            for limit in frame_limits:
                rows = [run_negentropy(path, sets, limit)]
                rows.append(run_ours("rbsr", stores, sets, limit))
                rows.append(run_ours("prolly", stores, sets, limit))
                report += [*print_table(n, d, limit, rows), ""]
                neg, rbsr, prolly = rows
                verdicts.append(
                    f"d={d:,} limit={limit:,}: RBSR bytes {ratio(rbsr.total, neg.total)}× "
                    f"({'ok' if rbsr.total <= neg.total else 'MISSED'}), round trips "
                    f"{rbsr.round_trips} vs {neg.round_trips} "
                    f"({'ok' if rbsr.round_trips <= neg.round_trips else 'MISSED'}); "
                    f"Prolly bytes {ratio(prolly.total, neg.total)}× "
                    f"({'ok' if prolly.total <= 2 * neg.total else 'MISSED'})"
                )
    print("Targets: RBSR bytes <= negentropy with round trips <= negentropy; Prolly <= 2x bytes")
    print("\n".join(verdicts))
    return [*report, "Targets:", *verdicts]


def sweep(n: int, diffs: list[int], seed: int) -> list[str]:
    lines = [
        f"Parameter sweep, N = {n:,}, no frame limit: total bytes / frames",
        "",
        "| method | parameters | " + " | ".join(f"d = {d:,}" for d in diffs) + " |",
        "|---|---|" + "---:|" * len(diffs),
    ]
    configs: list[tuple[Method, str, RbsrParams | None, ProllyParams | None]] = [
        ("rbsr", f"fanout {f}, items ≤ {t}", RbsrParams(f, t), None)
        for f in (8, 16, 32)
        for t in (8, 16, 24, 32, 48)
    ]
    configs += [("prolly", f"fanout {f}", None, ProllyParams(f)) for f in (4, 8, 16, 32, 64)]
    built = []
    for d in diffs:
        sets = make_sets(n, d, seed)
        built.append((sets, build_stores(sets)))
    for method, label, rbsr, prolly in configs:
        cells = []
        for sets, stores in built:
            row = run_ours(method, stores, sets, UNLIMITED, rbsr=rbsr, prolly=prolly)
            cells.append(f"{row.total:,} / {row.frames}" + ("" if row.exact else " NOT EXACT"))
        lines.append(f"| {method} | {label} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="shared items (default 1M)")
    parser.add_argument("--diffs", default="10,1000", help="difference counts d")
    parser.add_argument(
        "--frame-limits",
        default=f"{UNLIMITED},60000",
        help="frame size limits in bytes, same for all methods (60000: nostr-tools default)",
    )
    parser.add_argument("--seed", type=int, default=20_240_601)
    parser.add_argument("--sweep", action="store_true", help="measure our parameters instead")
    parser.add_argument("--markdown", type=Path, help="also write the tables to this file")
    args = parser.parse_args()
    diffs = [int(x) for x in args.diffs.split(",")]
    if args.sweep:
        lines = sweep(args.n, diffs, args.seed)
    else:
        limits = [int(x) for x in args.frame_limits.split(",")]
        lines = compare(args.n, diffs, limits, args.seed)
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
