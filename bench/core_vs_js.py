"""Protocol-core throughput: sdsync's MessageChannel against the reference @waku/sds 0.0.8.

Both sides run the same workload with the js defaults (causal history 200, bloom filter
10k / 0.001, SDS-R on): one sender "a" and one receiver "b" on channel "0", streaming N
content messages with distinct payloads ``message {i}``. Message i is sent (wire bytes
captured), then immediately received by a fresh receiver; send and receive time are
accumulated separately, inside each runtime (``time.perf_counter`` here, ``process.hrtime``
in ``bench/js/core_bench.mjs``), so process start-up and JSON transport are excluded. Every
``--ack-every`` messages the receiver sends a sync message back to the sender, outside the
timed regions, which keeps the sender's outgoing buffer (and its copies of the ~37 KB
wires) bounded. Each message carries a 32-byte retrieval hint, as over Waku.

Beside the totals, each N is run a second time with the sender instrumented, for the time
per send split by stage: ``id`` (the message id's hash), ``history`` (the causal history
quoted), ``bloom`` (the filter's bytes, the new id's positions and its insertion),
``encode``, ``hint`` (the 32-byte hint made and attached), ``log`` (our own message
entered in the local log) and ``bookkeeping`` (the rest: checks, Lamport timestamp,
outgoing buffer, events, and for @waku/sds its task queue). The stages are timed by
wrapping what a send calls (:func:`instrument` here, ``instrument`` in the Node script),
which costs time of its own, so the instrumented total is shown apart from the plain one.
``--sizes`` defaults to 1k, 2k and 10k; ``--with-100k`` adds 100k, where @waku/sds
(which re-sorts its whole local history on every send) usually reaches ``--js-max-seconds``
first and is reported over the messages it completed.

Then Python alone streams ``--big`` messages and compares its receive rate with the one at
``--baseline`` messages (target: within 2x). Timing never fails the run: the exit status
is 0 whenever the bench completes; ``--json FILE`` keeps every number.

Usage::

    .venv/bin/python bench/core_vs_js.py [--sizes 1000,2000,10000] [--with-100k]
        [--big 100000] [--quick] [--json FILE] [--profile 2000] [--no-stages]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import io
import json
import os
import platform
import pstats
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

import sdsync.core.bloom as bloom_module
import sdsync.core.channel as channel_module
from sdsync.core import ChannelConfig, MessageChannel, MessageDelivered

ROOT = Path(__file__).resolve().parent.parent
JS_BENCH = ROOT / "bench" / "js" / "core_bench.mjs"
JS_PACKAGE = ROOT / "tests" / "interop" / "js" / "node_modules" / "@waku" / "sds"
CHANNEL = "0"
T0_MS = 1_700_000_000_000
TARGET_SPEEDUP = 10.0
TARGET_SCALING = 0.5  # receive rate at --big over the rate at --baseline
# Timed stages of a send; "bookkeeping" is the instrumented total less these.
STAGES = ("id", "history", "bloom", "encode", "hint", "log")
T = TypeVar("T")

# Wide enough for the table when stdout is a pipe or a file (rich assumes 80 columns).
console = Console(width=None if sys.stdout.isatty() else 132)


@dataclass(slots=True)
class RunResult:
    """One streamed run of ``completed`` messages (``n`` requested)."""

    n: int
    completed: int
    send_seconds: float
    recv_seconds: float
    wire_bytes: int
    capped: bool = False
    delivered: int | None = None
    correct: bool = True
    note: str = ""
    # From the instrumented run: its send seconds and seconds per stage (STAGES).
    staged_send_seconds: float | None = None
    staged_completed: int = 0
    stages: dict[str, float] = field(default_factory=dict)

    def stage_us(self) -> dict[str, float] | None:
        """Microseconds per send by stage, bookkeeping last; None if not instrumented."""
        if self.staged_send_seconds is None or not self.staged_completed:
            return None
        per = {name: self.stages.get(name, 0.0) for name in STAGES}
        per["bookkeeping"] = max(0.0, self.staged_send_seconds - sum(per.values()))
        per["total"] = self.staged_send_seconds
        return {name: seconds / self.staged_completed * 1e6 for name, seconds in per.items()}

    @property
    def send_rate(self) -> float:
        return self.completed / self.send_seconds if self.send_seconds > 0 else 0.0

    @property
    def recv_rate(self) -> float:
        return self.completed / self.recv_seconds if self.recv_seconds > 0 else 0.0

    @property
    def bytes_per_msg(self) -> float:
        return self.wire_bytes / self.completed if self.completed else 0.0

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            send_msgs_per_s=self.send_rate,
            recv_msgs_per_s=self.recv_rate,
            bytes_per_msg=self.bytes_per_msg,
        )
        return out


# ---------------------------------------------------------------------------- Python


class StageClock:
    """Seconds per stage of the sender's sends. ``active`` only inside a timed send, so
    what the receiver calls through the same module functions is not counted."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.active = False

    def timed(self, stage: str, fn: Callable[..., T]) -> Callable[..., T]:
        clock, seconds = time.perf_counter, self.seconds

        def wrapper(*args: Any, **kwargs: Any) -> T:
            if not self.active:
                return fn(*args, **kwargs)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[stage] += clock() - t0

        return wrapper


class _Wrapped:
    """``target`` with some of its methods replaced (for objects with __slots__)."""

    def __init__(self, target: object, **methods: Callable[..., Any]) -> None:
        self._target = target
        self.__dict__.update(methods)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def instrument(sender: MessageChannel, clock: StageClock) -> Callable[[], None]:
    """Wrap what ``MessageChannel.send`` calls, by stage; returns the undo of the two
    module-level patches. Keyed to send's internals: a renamed call shows up as time
    moved to bookkeeping, never as time lost (bookkeeping is the total less the stages).
    """
    timed = clock.timed
    s: Any = sender  # the bench reaches into the channel's private parts on purpose
    s._default_message_id = timed("id", s._default_message_id)
    s._history = _Wrapped(s._history, quote=timed("history", s._history.quote))
    s._bloom = _Wrapped(s._bloom, to_bytes=timed("bloom", s._bloom.to_bytes))
    s._add_to_bloom = timed("bloom", s._add_to_bloom)
    s._insert_log = timed("log", s._insert_log)
    encode, positions = channel_module.encode, bloom_module._positions
    channel_module.encode = timed("encode", encode)
    bloom_module._positions = timed("bloom", positions)  # type: ignore[assignment]

    def undo() -> None:
        channel_module.encode = encode
        bloom_module._positions = positions

    return undo


def python_run(
    n: int, *, ack_every: int = 100, hints: bool = True, stages: StageClock | None = None
) -> RunResult:
    """Stream ``n`` messages from a fresh "a" to a fresh "b"; check b's log afterwards."""
    config = ChannelConfig()
    sender = MessageChannel(CHANNEL, "a", now_ms=T0_MS, config=config)
    receiver = MessageChannel(CHANNEL, "b", now_ms=T0_MS, config=config)
    undo = instrument(sender, stages) if stages is not None else None
    try:
        return _stream(n, sender, receiver, ack_every=ack_every, hints=hints, stages=stages)
    finally:
        if undo is not None:
            undo()


def python_staged(n: int, *, ack_every: int, hints: bool) -> RunResult:
    """A plain run of ``n`` with the per-stage split of an instrumented one attached."""
    result = python_run(n, ack_every=ack_every, hints=hints)
    stages = StageClock()
    staged = python_run(n, ack_every=ack_every, hints=hints, stages=stages)
    result.staged_send_seconds = staged.send_seconds
    result.staged_completed = staged.completed
    result.stages = stages.seconds
    return result


def _stream(
    n: int,
    sender: MessageChannel,
    receiver: MessageChannel,
    *,
    ack_every: int,
    hints: bool,
    stages: StageClock | None,
) -> RunResult:
    clock = time.perf_counter
    send_s = recv_s = 0.0
    wire_bytes = delivered = 0
    sent_ids: list[str] = []
    gc.collect()
    for i in range(n):
        now = T0_MS + i
        payload = f"message {i}".encode()
        if stages is not None:
            stages.active = True
        t0 = clock()
        out = sender.send(payload, now)
        hint = None
        if hints:
            th = clock() if stages is not None else 0.0
            hint = hashlib.sha256(out.message.message_id.encode()).digest()
            sender.set_retrieval_hint(out.message.message_id, hint)
            if stages is not None:
                stages.seconds["hint"] += clock() - th
        t1 = clock()
        if stages is not None:
            stages.active = False
        events = receiver.receive(out.data, now, retrieval_hint=hint)
        t2 = clock()
        send_s += t1 - t0
        recv_s += t2 - t1
        wire_bytes += len(out.data)
        sent_ids.append(out.message.message_id)
        delivered += sum(1 for e in events if isinstance(e, MessageDelivered))
        if ack_every and (i + 1) % ack_every == 0:
            sync = receiver.send_sync(now)
            if sync is not None:
                sender.receive(sync.data, now)
    log_ids = receiver.log_ids()  # the in-memory window (all of it unless n > 100k)
    correct = (
        receiver.log.total == n
        and log_ids == sent_ids[len(sent_ids) - len(log_ids) :]
        and delivered == n
    )
    return RunResult(n, n, send_s, recv_s, wire_bytes, delivered=delivered, correct=correct)


def python_profile(n: int) -> str:
    """cProfile of a streamed run of ``n`` messages: the top entries by own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    python_run(n)
    profiler.disable()
    buf = io.StringIO()
    stats = pstats.Stats(profiler, stream=buf)
    stats.sort_stats("tottime").print_stats(15)
    return buf.getvalue()


# -------------------------------------------------------------------------------- JS


def js_runs(
    sizes: list[int],
    *,
    warmup: int,
    ack_every: int,
    max_seconds: float,
    hints: bool,
    stages: bool,
) -> tuple[dict[str, Any] | None, str]:
    """Run bench/js/core_bench.mjs; returns its JSON (or None) and a reason if skipped."""
    node = shutil.which("node")
    if node is None:
        return None, "node not found on PATH"
    if not (JS_PACKAGE / "dist" / "index.js").exists():
        return None, "@waku/sds missing: run `cd tests/interop/js && npm ci`"
    cmd = [
        node,
        str(JS_BENCH),
        "--sizes",
        ",".join(map(str, sizes)),
        "--warmup",
        str(warmup),
        "--ack-every",
        str(ack_every),
        "--max-seconds",
        str(max_seconds),
    ]
    if not hints:
        cmd.append("--no-hints")
    if stages:
        cmd.append("--stages")
    env = {k: v for k, v in os.environ.items() if k != "DEBUG"}  # keep `debug` logging off
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=False)
    if proc.returncode != 0:
        return None, f"node bench exited with status {proc.returncode}"
    try:
        return json.loads(proc.stdout), ""
    except json.JSONDecodeError as exc:
        return None, f"node bench printed no JSON ({exc})"


def js_result(raw: dict[str, Any]) -> RunResult:
    n = int(raw["n"])
    completed = int(raw["completed"])
    correct = (
        raw["delivered"] == completed
        and raw["local_history_length"] == completed
        and raw["distinct_ids"] == completed
        and raw["task_errors"] == 0
    )
    note = f"capped at {completed}/{n} messages" if raw["capped"] else ""
    staged = raw.get("stages") or {}
    return RunResult(
        n,
        completed,
        float(raw["send_seconds"]),
        float(raw["recv_seconds"]),
        int(raw["wire_bytes"]),
        capped=bool(raw["capped"]),
        delivered=int(raw["delivered"]),
        correct=correct,
        note=note,
        staged_send_seconds=staged.get("send_seconds"),
        staged_completed=int(staged.get("completed", 0)),
        stages={name: float(staged[name]) for name in STAGES if name in staged},
    )


# ---------------------------------------------------------------------------- report


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_ratio(py: float | None, js: float | None) -> str:
    if py is None or not js:
        return "-"
    return f"{py / js:,.1f}x"


def ratio(py: RunResult | None, js: RunResult | None, attr: str) -> float | None:
    if py is None or js is None:
        return None
    js_value = float(getattr(js, attr))
    return float(getattr(py, attr)) / js_value if js_value else None


def nearest(results: dict[int, RunResult], n: int) -> int | None:
    return min(results, key=lambda k: (abs(k - n), k)) if results else None


def stage_table(
    sizes: list[int], py: dict[int, RunResult], js: dict[int, RunResult], against: str
) -> Table:
    """Microseconds per send by stage, both implementations, from the instrumented runs."""
    table = Table(
        title=f"Time per send by stage, us (instrumented runs; sdsync vs {against})",
        caption="total: the instrumented run's send time per message (the wrappers add"
        " their own); bookkeeping: total less the timed stages; js/py: per-stage ratio",
    )
    for col in ("N", "impl", *STAGES, "bookkeeping", "total"):
        table.add_column(col, justify="right")
    for n in sizes:
        rows = [("py", py[n].stage_us())]
        if n in js:
            rows.append(("js", js[n].stage_us()))
        for impl, per in rows:
            cells = [f"{per[k]:,.1f}" if per else "-" for k in (*STAGES, "bookkeeping", "total")]
            table.add_row(f"{n:,}", impl, *cells)
        py_us, js_us = rows[0][1], rows[-1][1] if len(rows) > 1 else None
        if py_us and js_us:
            ratios = [fmt_ratio(js_us[k], py_us[k]) for k in (*STAGES, "bookkeeping", "total")]
            table.add_row(f"{n:,}", "js/py", *ratios)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1000,2000,10000", help="comma-separated N values")
    parser.add_argument("--with-100k", action="store_true", help="add N=100,000 to --sizes")
    parser.add_argument("--no-stages", action="store_true", help="no per-stage split of a send")
    parser.add_argument("--big", type=int, default=100_000, help="Python-only N (0 to skip)")
    parser.add_argument("--baseline", type=int, default=1000, help="N the --big rate is judged by")
    parser.add_argument("--warmup", type=int, default=200, help="discarded warm-up run size")
    parser.add_argument("--ack-every", type=int, default=100, help="untimed sync back (0: never)")
    parser.add_argument("--js-max-seconds", type=float, default=300.0, help="cap per JS run")
    parser.add_argument("--target-n", type=int, default=2000, help="N for the 10x target")
    parser.add_argument("--no-hints", action="store_true", help="no retrieval hints")
    parser.add_argument("--no-js", action="store_true", help="skip the @waku/sds side")
    parser.add_argument("--quick", action="store_true", help="sizes 200,500, big 2000")
    parser.add_argument("--json", type=Path, help="write all numbers to this file")
    parser.add_argument("--profile", type=int, default=0, help="cProfile a run of N and print")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    big, baseline, warmup = args.big, args.baseline, args.warmup
    if args.quick:
        sizes, big, baseline, warmup = [200, 500], 2000, 200, 50
    if args.with_100k and 100_000 not in sizes:
        sizes.append(100_000)
    hints = not args.no_hints
    staged = not args.no_stages
    started = time.perf_counter()

    console.print(
        f"[bold]sdsync core vs @waku/sds[/]  python {platform.python_version()}, "
        f"sizes {sizes}, big {big}, ack every {args.ack_every}, hints {hints}"
    )

    # JS first (it is the slow side and may be capped), then Python.
    js: dict[int, RunResult] = {}
    js_meta: dict[str, Any] | None = None
    js_skip = "skipped (--no-js)" if args.no_js else ""
    if not args.no_js:
        js_meta, js_skip = js_runs(
            sizes,
            warmup=warmup,
            ack_every=args.ack_every,
            max_seconds=args.js_max_seconds,
            hints=hints,
            stages=staged,
        )
        if js_meta is not None:
            js = {r.n: r for r in map(js_result, js_meta["results"])}
    if js_skip:
        console.print(f"[yellow]JS side not measured: {js_skip}[/]")

    python_run(warmup, ack_every=args.ack_every, hints=hints)
    py: dict[int, RunResult] = {}
    for n in sizes:
        if staged:
            py[n] = python_staged(n, ack_every=args.ack_every, hints=hints)
        else:
            py[n] = python_run(n, ack_every=args.ack_every, hints=hints)
        console.print(
            f"py: N={n} send {py[n].send_rate:,.0f} msg/s, recv {py[n].recv_rate:,.0f} msg/s"
        )

    base_run = py.get(baseline)
    big_run = None
    if big > 0:
        if base_run is None:
            base_run = python_run(baseline, ack_every=args.ack_every, hints=hints)
        big_run = python_run(big, ack_every=args.ack_every, hints=hints)

    against = js_meta["package"] if js_meta else "js not measured"
    table = Table(title=f"MessageChannel throughput, streamed (sdsync vs {against})")
    for col in (
        "N",
        "js send msg/s",
        "py send msg/s",
        "send py/js",
        "js recv msg/s",
        "py recv msg/s",
        "recv py/js",
        "js B/msg",
        "py B/msg",
        "ok",
    ):
        table.add_column(col, justify="right")
    for n in sizes:
        p, j = py[n], js.get(n)
        ok = p.correct and (j is None or j.correct)
        table.add_row(
            f"{n:,}" + (" *" if j is not None and j.capped else ""),
            fmt_rate(j.send_rate if j else None),
            fmt_rate(p.send_rate),
            fmt_ratio(p.send_rate, j.send_rate if j else None),
            fmt_rate(j.recv_rate if j else None),
            fmt_rate(p.recv_rate),
            fmt_ratio(p.recv_rate, j.recv_rate if j else None),
            fmt_rate(j.bytes_per_msg if j else None),
            fmt_rate(p.bytes_per_msg),
            "yes" if ok else "[red]NO[/]",
        )
    console.print(table)
    for j in js.values():
        if j.capped:
            console.print(f"* JS N={j.n}: {j.note} ({args.js_max_seconds:.0f} s wall limit)")

    if staged:
        console.print(stage_table(sizes, py, js, against))

    scaling = None
    if big_run is not None and base_run is not None:
        scaling = big_run.recv_rate / base_run.recv_rate if base_run.recv_rate else None
        console.print(
            f"Python N={big:,}: send {big_run.send_rate:,.0f} msg/s, "
            f"recv {big_run.recv_rate:,.0f} msg/s, {big_run.bytes_per_msg:,.0f} B/msg, "
            f"log correct: {'yes' if big_run.correct else 'NO'}"
        )
        console.print(
            f"Scaling: recv rate at {big:,} / at {baseline:,} = {scaling:.2f} "
            f"({big_run.recv_rate:,.0f} / {base_run.recv_rate:,.0f} msg/s)"
        )

    # Targets.
    targets: dict[str, Any] = {}
    tn = nearest({n: r for n, r in py.items() if n in js}, args.target_n)
    if tn is not None:
        send_x = ratio(py[tn], js[tn], "send_rate")
        recv_x = ratio(py[tn], js[tn], "recv_rate")
        label = f"N={tn:,}" + ("" if tn == args.target_n else f" (nearest to {args.target_n:,})")
        for name, value in (("send", send_x), ("receive", recv_x)):
            hold = value is not None and value >= TARGET_SPEEDUP
            targets[f"{name}_speedup"] = {"n": tn, "ratio": value, "holds": hold}
            console.print(
                f"Target >= {TARGET_SPEEDUP:.0f}x js {name} throughput at {label}: "
                f"{value or 0:.1f}x -> {'[green]holds[/]' if hold else '[red]misses[/]'}"
            )
    else:
        console.print("Target >= 10x js throughput: not evaluated (no JS numbers)")
    if scaling is not None:
        hold = scaling >= TARGET_SCALING
        targets["recv_scaling"] = {"big": big, "baseline": baseline, "ratio": scaling}
        targets["recv_scaling"]["holds"] = hold
        console.print(
            f"Target recv rate at {big:,} within 2x of {baseline:,}: {scaling:.2f} "
            f"-> {'[green]holds[/]' if hold else '[red]misses[/]'}"
        )
    all_correct = all(r.correct for r in [*py.values(), *js.values()]) and (
        big_run is None or big_run.correct
    )
    if not all_correct:
        console.print("[red]CORRECTNESS CHECK FAILED[/] (see the ok column / log check above)")

    if args.profile > 0:
        console.print(f"\ncProfile, streamed run of {args.profile:,} messages, by tottime:")
        console.print(python_profile(args.profile), markup=False, highlight=False)

    total = time.perf_counter() - started
    console.print(f"Total bench time: {total:,.1f} s")
    if args.json is not None:
        doc = {
            "python": platform.python_version(),
            "js_runtime": js_meta and js_meta.get("runtime"),
            "js_package": js_meta and js_meta.get("package"),
            "js_skipped": js_skip or None,
            "config": {
                "causal_history": 200,
                "bloom": [10_000, 0.001],
                "sizes": sizes,
                "big": big,
                "baseline": baseline,
                "warmup": warmup,
                "ack_every": args.ack_every,
                "hints": hints,
                "stages": staged,
                "js_max_seconds": args.js_max_seconds,
            },
            "js": [r.as_json() for r in js.values()],
            "py": [r.as_json() for r in py.values()],
            "py_baseline": base_run.as_json() if base_run and big_run else None,
            "py_big": big_run.as_json() if big_run else None,
            "targets": targets,
            "all_correct": all_correct,
            "total_seconds": total,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"Wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
