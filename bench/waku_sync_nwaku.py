"""Waku Sync, one pair of store nodes on the same data: nwaku↔nwaku (the anchor),
sdsync↔nwaku and sdsync↔sdsync, on 127.0.0.1 only.

Two archives share N messages and each holds d/2 of its own. nwaku's archives are filled
once by relay publish before they have peers (fresh timestamps: nwaku archives no relay
message older than 20 s), ours by the ingestion API with the same messages, so the hashes
are equal; every pairing starts from copies of those archives. Side A is started, then
side B dialling it; the clock starts when A lists B as connected and stops when both
have archived what they lacked (nwaku: ``total_transfer_messages_exchanged{direction=
"receive"}``; ours: ``waku_sync.archived`` of ``/admin/v1/info``); both archives are then
read back and checked to hold the union.

Bytes and round trips: nwaku's own counters (``total_bytes_exchanged``,
``reconciliation_roundtrips``) on side A, which is nwaku in (a) and (b); ours from
``waku_sync.recent`` (reconciliation only: our node does not count transfer bytes). Our
rows name the method the rounds report (``method``): XOR ranges with nwaku, RBSR between
two sdsync nodes (``/sdsync/store-sync/rbsr/1.0.0``).
Everything up to convergence counts: every round either side started (both run rounds
every ``--interval`` s), so the convergence time includes up to one interval of waiting.
A last table runs our RBSR and RIBLT in memory on sets of the same N and d
(``bench/reconcile_vs_negentropy.py``'s code path).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from sdsync.testing.nwaku import Nwaku, NwakuOptions, free_port, nwaku_binary
from sdsync.waku.sync.service import RECENT_ROUNDS
from sdsync.wire.waku import WakuMessage

TOPIC = "/waku/2/rs/1/7"
CONTENT_TOPIC = "/sds/1/sync/bench"
TOKEN = "bench"
PATIENCE_S = 180.0
METHODS = {"waku": "XOR ranges", "rbsr": "RBSR"}  # a round's ``method`` in waku_sync.recent


@dataclass(frozen=True)
class Msg:
    payload: bytes
    timestamp: int

    @property
    def hash(self) -> str:
        return WakuMessage(self.payload, CONTENT_TOPIC, timestamp=self.timestamp).hash(TOPIC).hex()


@dataclass
class Row:
    pair: str
    recon_out: int
    recon_in: int
    transfer_out: int | None
    transfer_in: int | None
    sessions: int
    round_trips: float
    seconds: float
    exact: bool

    @property
    def total(self) -> int:
        return self.recon_out + self.recon_in + (self.transfer_out or 0) + (self.transfer_in or 0)


# -- nwaku ---------------------------------------------------------------------------------


def nwaku_options(interval: int, jitter: int, static: tuple[str, ...] = ()) -> NwakuOptions:
    metrics = [
        "--metrics-server=true",  # after the harness's --metrics-server=false: the last wins
        "--metrics-server-address=127.0.0.1",
        f"--metrics-server-port={free_port()}",
        "--log-level=INFO",
    ]
    return NwakuOptions(
        store_sync=True,
        store_sync_interval_s=interval,
        store_sync_relay_jitter_s=jitter,
        static_nodes=static,
        extra=metrics,
    )


def nwaku_metrics(node: Nwaku) -> dict[str, float]:
    port = next(a for a in node.argv if a.startswith("--metrics-server-port=")).split("=")[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("total_", "reconciliation_")):
            name, value = line.rsplit(" ", 1)
            found[name.replace("_total{", "{")] = float(value)  # nim-metrics adds _total
    return found


def nwaku_row(pair: str, m: dict[str, float], seconds: float, exact: bool) -> Row:
    def get(name: str) -> int:
        return int(m.get(name, 0.0))

    sessions = get("reconciliation_roundtrips_count")
    return Row(
        pair,
        get('total_bytes_exchanged{protocol="reconciliation",direction="sent"}'),
        get('total_bytes_exchanged{protocol="reconciliation",direction="receive"}'),
        get('total_bytes_exchanged{protocol="transfer",direction="sent"}'),
        get('total_bytes_exchanged{protocol="transfer",direction="receive"}'),
        sessions,
        m.get("reconciliation_roundtrips_sum", 0.0) / max(sessions, 1),
        seconds,
        exact,
    )


def nwaku_received(node: Nwaku) -> int:
    return int(nwaku_metrics(node).get('total_transfer_messages_exchanged{direction="receive"}', 0))


def publish(messages: list[Msg], a_only: int, b_only: int, nodes: tuple[Nwaku, Nwaku]) -> list[Msg]:
    """Publish the first N messages on both nodes, then a_only on the first, b_only on the
    second; each with the timestamp of its publication (returned)."""
    n = len(messages) - a_only - b_only
    out: list[Msg | None] = [None] * len(messages)

    def one(i: int) -> None:
        ts = time.time_ns()
        body = {
            "payload": base64.b64encode(messages[i].payload).decode(),
            "contentTopic": CONTENT_TOPIC,
            "timestamp": ts,
        }
        targets = nodes if i < n else nodes[:1] if i < n + a_only else nodes[1:]
        for node in targets:
            node.relay_publish(TOPIC, body)
        out[i] = Msg(messages[i].payload, ts)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(len(messages))))
    return [m for m in out if m is not None]


# -- sdsync --------------------------------------------------------------------------------


@dataclass
class Ours:
    process: subprocess.Popen[str]
    url: str
    relay: str
    log: list[str]

    def admin(self) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/admin/v1/info", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return dict(json.loads(answer.read())["waku_sync"])

    def hashes(self) -> set[str]:
        found: set[str] = set()
        cursor = ""
        while True:
            params = f"pubsubTopic={urllib.parse.quote(TOPIC, safe='')}&pageSize=1000"
            params += "&includeData=false" + (f"&cursor={cursor}" if cursor else "")
            with urllib.request.urlopen(f"{self.url}/store/v3/messages?{params}", timeout=30) as a:
                page = json.loads(a.read())
            found |= {m["messageHash"].removeprefix("0x") for m in page["messages"]}
            cursor = page.get("paginationCursor") or ""
            if not cursor:
                return found

    def ingest(self, messages: list[Msg]) -> None:
        for start in range(0, len(messages), 2000):
            entries = [
                {
                    "messageHash": "0x" + m.hash,
                    "pubsubTopic": TOPIC,
                    "message": {
                        "payload": base64.b64encode(m.payload).decode(),
                        "contentTopic": CONTENT_TOPIC,
                        "timestamp": m.timestamp,
                    },
                }
                for m in messages[start : start + 2000]
            ]
            request = urllib.request.Request(
                f"{self.url}/store/v3/messages",
                data=json.dumps({"messages": entries}).encode(),
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
            )
            with urllib.request.urlopen(request, timeout=120) as answer:
                assert json.loads(answer.read())["stored"] == len(entries)


@contextmanager
def ours(data_dir: Path, interval: int, jitter: int, peer: str | None = None) -> Iterator[Ours]:
    argv = [sys.executable, "-m", "sdsync.cli", "store", "serve", "--data-dir", str(data_dir)]
    argv += ["--listen", "127.0.0.1:0", "--retention", "none", "--relay-shard", "7", "-v"]
    argv += ["--token", TOKEN, "--store-sync-interval", str(interval)]
    argv += ["--store-sync-relay-jitter", str(jitter)]
    argv += ["--relay-peer", peer] if peer else []
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(process.stderr or ()), daemon=True).start()
    try:
        assert process.stdout is not None
        listening, relay = process.stdout.readline(), process.stdout.readline()
        match = re.match(r"sdsync store: relay on (.+?), archiving", relay)
        assert listening.startswith("sdsync store: listening on ") and match, listening + relay
        yield Ours(process, listening.split()[4], match[1].split(", ")[0], log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def our_row(pair: str, info: dict[str, Any], seconds: float, exact: bool) -> Row:
    """Our node's rounds (``waku_sync.recent``, the last 10 it ran or answered), labelled
    with the method they ran (``waku``: nwaku's XOR ranges; ``rbsr``: between sdsync
    nodes). Reconciliation bytes only: our node does not count transfer bytes."""
    rounds = [r for r in info["recent"] if r.get("outcome") == "ok" and "round_trips" in r]
    if len(info["recent"]) >= RECENT_ROUNDS:
        print(f"warning: {pair}: only the last {RECENT_ROUNDS} rounds are counted", flush=True)
    methods = "/".join(sorted({METHODS.get(r.get("method", "waku"), "?") for r in rounds}))
    return Row(
        pair.format(method=methods or "?"),
        sum(r["bytes_sent"] for r in rounds),
        sum(r["bytes_received"] for r in rounds),
        None,
        None,
        len(rounds),
        sum(r["round_trips"] for r in rounds) / max(len(rounds), 1),
        seconds,
        exact,
    )


# -- the pairings ---------------------------------------------------------------------------


def wait(probe: Callable[[], bool], what: str, timeout_s: float = PATIENCE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


def copy_dir(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    for log in target.glob("nwaku.log"):
        log.unlink()
    return target


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.binary = nwaku_binary()
        self.runs = 0

    def fresh(self, name: str) -> Path:
        self.runs += 1
        return self.tmp / f"run{self.runs}-{name}"

    def prepare(self, n: int, d: int) -> None:
        a_only, b_only = d // 2, d - d // 2
        self.n, self.a_only, self.b_only = n, a_only, b_only
        tag = f"{n}-{d}"
        draft = [Msg(f"m {tag} {i} ".encode().ljust(64, b"."), 0) for i in range(n + d)]
        a0, b0 = self.tmp / f"nwaku-a-{tag}", self.tmp / f"nwaku-b-{tag}"
        nodes = (
            Nwaku(self.binary, a0, nwaku_options(3600, 1)),
            Nwaku(self.binary, b0, nwaku_options(3600, 1)),
        )
        try:
            for node in nodes:
                node.wait_up()
            t0 = time.perf_counter()
            msgs = publish(draft, a_only, b_only, nodes)
            took = time.perf_counter() - t0
            print(f"published {n + d + n:,} messages on two nwaku in {took:.1f} s", flush=True)
            for node, count in zip(nodes, (n + a_only, n + b_only), strict=True):
                node.wait_until(lambda node=node, c=count: len(store_hashes(node)) == c, "archived")
        finally:
            for node in nodes:
                node.close()
        common, side_a, side_b = msgs[:n], msgs[n : n + a_only], msgs[n + a_only :]
        self.nwaku_dirs = (a0, b0)
        self.union = {m.hash for m in msgs}
        self.our_dirs = (self.tmp / f"ours-a-{tag}", self.tmp / f"ours-b-{tag}")
        for data_dir, part in zip(self.our_dirs, (side_a, side_b), strict=True):
            with ours(data_dir, 0, 1) as node:
                node.ingest(common + part)
        print(f"ingested into two sdsync archives, {len(self.union):,} messages in all")

    def nwaku_a(self, static: tuple[str, ...] = ()) -> Nwaku:
        node = Nwaku(
            self.binary,
            copy_dir(self.nwaku_dirs[0], self.fresh("nwaku-a")),
            nwaku_options(self.args.interval, 1, static),
        )
        node.wait_up()
        return node

    def nwaku_nwaku(self) -> Row:
        a = self.nwaku_a()
        b = Nwaku(
            self.binary,
            copy_dir(self.nwaku_dirs[1], self.fresh("nwaku-b")),
            nwaku_options(self.args.interval, 1, (a.address,)),
        )
        try:
            b.wait_up()
            a.wait_until(a.connected_peers, "a peer", 60)
            t0 = time.perf_counter()
            wait(
                lambda: nwaku_received(a) >= self.b_only and nwaku_received(b) >= self.a_only,
                "nwaku↔nwaku converged",
            )
            seconds = time.perf_counter() - t0
            metrics = nwaku_metrics(a)
            exact = store_hashes(a) == self.union and store_hashes(b) == self.union
            return nwaku_row("nwaku↔nwaku", metrics, seconds, exact)
        finally:
            b.close()
            a.close()

    def ours_nwaku(self) -> tuple[Row, Row]:
        a = self.nwaku_a()
        data = self.fresh("ours-b")
        shutil.copytree(self.our_dirs[1], data)
        try:
            with ours(data, self.args.interval, 1, a.address) as b:
                a.wait_until(a.connected_peers, "a peer", 60)
                t0 = time.perf_counter()
                wait(
                    lambda: (
                        nwaku_received(a) >= self.b_only and b.admin()["archived"] >= self.a_only
                    ),
                    "sdsync↔nwaku converged",
                )
                seconds = time.perf_counter() - t0
                metrics, info = nwaku_metrics(a), b.admin()
                exact = store_hashes(a) == self.union and b.hashes() == self.union
                rounds = [line.strip() for line in b.log if "Waku Sync " in line]
                if self.args.verbose:
                    print("\n".join(rounds))
            return (
                nwaku_row("sdsync↔nwaku (nwaku's counters)", metrics, seconds, exact),
                our_row("sdsync↔nwaku (our counters, {method})", info, seconds, exact),
            )
        finally:
            a.close()

    def ours_ours(self) -> Row:
        data_a, data_b = self.fresh("ours-a"), self.fresh("ours-b")
        shutil.copytree(self.our_dirs[0], data_a)
        shutil.copytree(self.our_dirs[1], data_b)
        with (
            ours(data_a, self.args.interval, 1) as a,
            ours(data_b, self.args.interval, 1, a.relay) as b,
        ):
            t0 = time.perf_counter()  # dialled at start: no connection probe of ours
            wait(
                lambda: (
                    a.admin()["archived"] >= self.b_only and b.admin()["archived"] >= self.a_only
                ),
                "sdsync↔sdsync converged",
            )
            seconds = time.perf_counter() - t0
            info = a.admin()
            exact = a.hashes() == self.union and b.hashes() == self.union
        return our_row("sdsync↔sdsync, {method} (our counters: recon only)", info, seconds, exact)


def store_hashes(node: Nwaku) -> set[str]:
    return set(node.store_hashes(pubsub_topic=TOPIC, pageSize=100))


# -- in memory -------------------------------------------------------------------------------


def in_memory(n: int, d: int) -> list[str]:
    import reconcile_vs_negentropy as rvn

    sets = rvn.make_sets(n, d, seed=7)
    stores = rvn.build_stores(sets)
    rows = [
        rvn.fastest(lambda: rvn.run_ours("rbsr", stores, sets, rvn.UNLIMITED)),
        rvn.fastest(lambda: rvn.run_riblt(stores, sets, rvn.UNLIMITED)),
    ]
    return [
        f"| ours in memory: {r.method} | {r.bytes_a_to_b:,} | {r.bytes_b_to_a:,} | - | - "
        f"| {r.total:,} | - | 1 | {r.round_trips} | {r.seconds:.3f} | - | "
        f"{'yes' if r.exact else 'NO'} |"
        for r in rows
    ]


# -- the table --------------------------------------------------------------------------------


def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}" if y else "-"


def table(n: int, d: int, interval: int, rows: list[Row], memory: list[str]) -> list[str]:
    anchor = rows[0]
    lines = [
        f"N = {n:,}, d = {d:,} ({d // 2:,} only on A, {d - d // 2:,} only on B), rounds every "
        f"{interval} s; bytes as side A counts them (A sent / A received)",
        "",
        "| pair | recon out | recon in | transfer out | transfer in | total | ×nwaku "
        "| sessions | round trips / session | converged s | ×nwaku | union |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        t_out = "-" if r.transfer_out is None else f"{r.transfer_out:,}"
        t_in = "-" if r.transfer_in is None else f"{r.transfer_in:,}"
        comparable = r.transfer_out is not None
        lines.append(
            f"| {r.pair} | {r.recon_out:,} | {r.recon_in:,} | {t_out} | {t_in} | {r.total:,} "
            f"| {ratio(r.total, anchor.total) if comparable else '-'} | {r.sessions} "
            f"| {r.round_trips:.1f} | {r.seconds:.2f} | {ratio(r.seconds, anchor.seconds)} "
            f"| {'yes' if r.exact else 'NO'} |"
        )
    lines += memory
    print("\n".join(lines) + "\n", flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="messages both sides hold")
    parser.add_argument("--d", default="1000,20", help="differences, comma-separated")
    parser.add_argument("--interval", type=int, default=3, help="seconds between rounds")
    parser.add_argument("--no-ours-ours", action="store_true", help="skip sdsync↔sdsync")
    parser.add_argument("--no-memory", action="store_true", help="skip the in-memory rows")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("-v", "--verbose", action="store_true", help="print our round logs")
    args = parser.parse_args()
    report: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="waku-sync-bench-"))
    try:
        bench = Bench(args, tmp)
        for d in (int(x) for x in args.d.split(",")):
            bench.prepare(args.n, d)
            rows = [bench.nwaku_nwaku(), *bench.ours_nwaku()]
            if not args.no_ours_ours:
                rows.append(bench.ours_ours())
            memory = [] if args.no_memory else in_memory(args.n, d)
            report += [*table(args.n, d, args.interval, rows, memory), ""]
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(report))


if __name__ == "__main__":
    main()
