"""Protocol-core memory on a long stream: sdsync's MessageChannel beside @waku/sds 0.0.8.

Two participants on channel "0" with the js defaults (causal history 200, bloom filter
10,000 / 0.001, possible-acks threshold 2, SDS-R on). ``alice`` streams N content messages
``message {i}`` to ``bob`` on a fake clock that advances ``--step-ms`` per message. ``bob``
receives each one (unless ``--loss`` drops it; the drops come from a seeded rng, the same
ones on both sides) and after every ``--sync-every`` received messages sends a sync
message, which alice receives. At that point the chores a runtime would do also run: bob
sweeps his incoming buffer, alice sweeps her outgoing buffer and hands any SDS-R
rebroadcasts to bob. Sync messages and rebroadcasts are never dropped.

Each N runs in a fresh process, so one run's heap never inflates the next one's figures:
a child of this script for Python, a pair of ``tests/interop/js/driver.mjs`` peers (one
Node process each for alice and bob, driven over JSON lines) for js. Reported per run:

* peak RSS: ``ru_maxrss`` of the Python child (alice and bob share it); ``VmHWM`` of the
  alice and bob Node processes, read from /proc (the driver has no memory op);
* optionally (``--tracemalloc``) the Python heap traced by tracemalloc and the lines that
  hold most of it; about 4-6x slower, and its own tables inflate RSS, so compare RSS only
  between runs without it;
* alice's outgoing buffer (total, and how many are "possibly acknowledged"), the wire bytes
  it still holds (Python), both logs' lengths, bob's incoming buffer;
* messages per second over the streaming loop (sampling excluded).

A run stops early, and its row says why, when a peer raises an sdsync error (anything
subclassing ``SdsError``, e.g. a full outgoing buffer) or the js driver replies with an
error, when the RSS of any of the run's processes passes ``--max-rss-mb`` (default: half
the machine's memory; js-waku's bob grows fastest), or when a js
run passes ``--js-max-seconds``. The target from the issue: peak RSS at every N within 2x
of the figure at ``--baseline`` (10k) messages. It never fails the run: the exit status is
0 whenever the bench completes; ``--json FILE`` (``-`` for stdout) keeps every number.

Usage::

    .venv/bin/python bench/core_memory.py [--sizes 10000,100000,300000] [--js-sizes 10000]
        [--loss 0.01] [--tracemalloc] [--quick] [--no-js] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

import sdsync
from sdsync.core import ChannelConfig, MessageChannel
from sdsync.errors import SdsError

ROOT = Path(__file__).resolve().parent.parent
JS_DIR = ROOT / "tests" / "interop" / "js"
JS_DRIVER = JS_DIR / "driver.mjs"
CHANNEL = "0"
T0_MS = 1_700_000_000_000
TARGET_GROWTH = 2.0  # peak RSS at any N over the figure at --baseline
TOP_ALLOCATIONS = 8  # allocation sites listed per Python run with --tracemalloc
CHECK_EVERY = 500  # messages between RSS-limit, time-limit and progress checks
MB = 1024 * 1024

# Wide enough for the table when stdout is a pipe or a file (rich assumes 80 columns).
console = Console(width=None if sys.stdout.isatty() else 132)


class StreamStopError(Exception):
    """Ends a run early; the reason goes into its row instead of a traceback."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind  # "error", "rss limit", "time limit"
        self.reason = reason


@dataclass(slots=True)
class StreamOptions:
    """The workload; identical for Python and js, and passed to each child as JSON."""

    n: int
    sync_every: int = 1000
    step_ms: int = 10
    loss: float = 0.0
    seed: int = 1
    lost_timeout_ms: int | None = None
    tracemalloc: bool = False
    max_rss_mb: float = 0.0  # 0: no limit
    max_seconds: float = 0.0  # 0: no limit
    progress_s: float = 10.0


@dataclass(slots=True)
class Sample:
    """State after ``sent`` messages (taken right after a sync, when there is one)."""

    sent: int
    seconds: float
    alice_rss_mb: float  # peak so far; the whole process for Python
    bob_rss_mb: float | None  # js only: bob's own Node process
    traced_mb: float | None
    traced_peak_mb: float | None
    alice_outgoing: int
    alice_possibly_acked: int
    wire_mb_held: float | None  # wire bytes of alice's outgoing messages (Python only)
    alice_log: int
    bob_log: int
    bob_incoming: int


@dataclass(slots=True)
class RunResult:
    impl: str  # "py" or "js"
    n: int
    completed: int = 0
    bob_received: int = 0
    dropped: int = 0
    syncs: int = 0
    seconds: float = 0.0  # streaming loop only
    wall_seconds: float = 0.0
    start_rss_mb: float = 0.0  # after start-up, before the first message
    stop_kind: str = ""
    stop_reason: str = ""
    samples: list[Sample] = field(default_factory=list)
    # With --tracemalloc: where the live Python heap was allocated at the end, by line.
    top_allocations: list[str] = field(default_factory=list)

    @property
    def final(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    @property
    def rate(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    @property
    def peak_rss_mb(self) -> float | None:
        return self.final.alice_rss_mb if self.final else None

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(msgs_per_s=self.rate, peak_rss_mb=self.peak_rss_mb)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunResult:
        fields = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        fields["samples"] = [Sample(**s) for s in raw.get("samples", [])]
        return cls(**fields)


class Pair(Protocol):
    """Alice and bob of one implementation, behind the few steps the stream needs."""

    def send(self, i: int, now_ms: int) -> bytes: ...

    def deliver(self, data: bytes, now_ms: int) -> None: ...

    def sync_round(self, now_ms: int) -> None: ...

    def sample(self, sent: int, seconds: float) -> Sample: ...

    def largest_rss_mb(self) -> float: ...


# ---------------------------------------------------------------------- memory


def peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_status_mb(pid: int | str, key: str) -> float:
    """A ``kB`` line of /proc/<pid>/status (VmRSS: now, VmHWM: peak) in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/{pid}/status")


def machine_memory_mb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MB


# ---------------------------------------------------------------------- stream


def stream(pair: Pair, opts: StreamOptions, label: str, start_rss_mb: float) -> RunResult:
    """The workload, the same for both implementations; stops early on StreamStopError."""
    result = RunResult(label, opts.n, start_rss_mb=start_rss_mb)
    rng = random.Random(opts.seed)
    sample_every = max(1, opts.n // 10)
    sampling = 0.0  # time spent sampling, left out of the rate
    started = last_progress = time.perf_counter()
    try:
        for i in range(opts.n):
            now = T0_MS + i * opts.step_ms
            data = pair.send(i, now)
            result.completed = i + 1
            if opts.loss and rng.random() < opts.loss:
                result.dropped += 1
            else:
                pair.deliver(data, now)
                result.bob_received += 1
                if result.bob_received % opts.sync_every == 0:
                    pair.sync_round(now)
                    result.syncs += 1
            sent = i + 1
            if sent % sample_every == 0 or sent == opts.n:
                t0 = time.perf_counter()
                result.samples.append(pair.sample(sent, t0 - started - sampling))
                sampling += time.perf_counter() - t0
            if sent % CHECK_EVERY == 0:
                elapsed = time.perf_counter() - started
                check_limits(pair, opts, elapsed)
                if time.perf_counter() - last_progress >= opts.progress_s:
                    last_progress = time.perf_counter()
                    progress(label, opts.n, sent, elapsed - sampling, pair.largest_rss_mb())
    except StreamStopError as stop:
        result.stop_kind, result.stop_reason = stop.kind, stop.reason
        t0 = time.perf_counter()
        try:
            result.samples.append(pair.sample(result.completed, t0 - started - sampling))
        except StreamStopError as late:  # a js peer that failed may not answer any more
            result.stop_reason += f"; no final sample ({late.reason})"
        sampling += time.perf_counter() - t0
    result.wall_seconds = time.perf_counter() - started
    result.seconds = result.wall_seconds - sampling
    return result


def check_limits(pair: Pair, opts: StreamOptions, elapsed: float) -> None:
    rss = pair.largest_rss_mb()
    if opts.max_rss_mb and rss > opts.max_rss_mb:
        raise StreamStopError(
            "rss limit", f"RSS {rss:,.0f} MB > --max-rss-mb {opts.max_rss_mb:,.0f}"
        )
    if opts.max_seconds and elapsed > opts.max_seconds:
        raise StreamStopError("time limit", f"{elapsed:,.0f} s > {opts.max_seconds:,.0f} s limit")


def progress(label: str, n: int, sent: int, seconds: float, rss_mb: float) -> None:
    rate = sent / seconds if seconds > 0 else 0.0
    eta = (n - sent) / rate if rate else 0.0
    print(
        f"{label} N={n:,}: {sent:,} sent ({100 * sent / n:.0f} %), {rate:,.0f} msg/s, "
        f"RSS {rss_mb:,.0f} MB, ~{eta:,.0f} s left at this rate",
        file=sys.stderr,
        flush=True,
    )


# ---------------------------------------------------------------------- Python


class PyPair:
    """Two sdsync MessageChannels in this process."""

    def __init__(self, opts: StreamOptions) -> None:
        # ChannelConfig's defaults are the js ones; only the lost timeout is a knob here.
        config = ChannelConfig(lost_timeout_ms=opts.lost_timeout_ms)
        self.alice = MessageChannel(CHANNEL, "alice", now_ms=T0_MS, config=config)
        self.bob = MessageChannel(CHANNEL, "bob", now_ms=T0_MS, config=config)
        self.traced = opts.tracemalloc

    @staticmethod
    @contextmanager
    def blame(who: str) -> Iterator[None]:
        """Turn an sdsync error (e.g. a full outgoing buffer) into a stop with a reason."""
        try:
            yield
        except SdsError as exc:
            raise StreamStopError("error", f"{who}: {type(exc).__name__}: {exc}") from exc

    def send(self, i: int, now_ms: int) -> bytes:
        with self.blame("alice send"):
            return self.alice.send(f"message {i}".encode(), now_ms).data

    def deliver(self, data: bytes, now_ms: int) -> None:
        with self.blame("bob receive"):
            self.bob.receive(data, now_ms)

    def sync_round(self, now_ms: int) -> None:
        alice, bob = self.alice, self.bob
        with self.blame("bob sweep_incoming / send_sync"):
            # The lost timeout (if any) only acts when the incoming buffer is swept.
            bob.sweep_incoming(now_ms)
            sync = bob.send_sync(now_ms)
        with self.blame("alice receive sync / sweeps"):
            if sync is not None:
                alice.receive(sync.data, now_ms)
            alice.sweep_outgoing()
            repair = alice.sweep_repair(now_ms)
        with self.blame("bob receive repair"):
            for data in repair.data:
                bob.receive(data, now_ms)

    def sample(self, sent: int, seconds: float) -> Sample:
        sweep = self.alice.sweep_outgoing()
        # stored_outgoing is how the durable layer reads the bytes a resend must repeat;
        # wherever the channel keeps them, with no durable store attached they are in RAM.
        stored = map(self.alice.stored_outgoing, self.alice.outgoing_ids())
        wire = sum(len(s.data) for s in stored if s is not None)
        traced = tracemalloc.get_traced_memory() if self.traced else None
        return Sample(
            sent=sent,
            seconds=seconds,
            alice_rss_mb=peak_rss_mb(),
            bob_rss_mb=None,
            traced_mb=traced[0] / MB if traced else None,
            traced_peak_mb=traced[1] / MB if traced else None,
            alice_outgoing=self.alice.buffer_sizes()[1],
            alice_possibly_acked=len(sweep.possibly_acknowledged),
            wire_mb_held=wire / MB,
            alice_log=self.alice.log.total,
            bob_log=self.bob.log.total,
            bob_incoming=self.bob.buffer_sizes()[0],
        )

    def largest_rss_mb(self) -> float:
        # Current (not peak) RSS of this process, for the limit check.
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / MB


def py_child(opts: StreamOptions) -> RunResult:
    """One Python run, inside the child process."""
    if opts.tracemalloc:
        tracemalloc.start()
    pair = PyPair(opts)
    result = stream(pair, opts, "py", peak_rss_mb())
    if opts.tracemalloc:
        result.top_allocations = top_allocations(TOP_ALLOCATIONS)
    return result


def top_allocations(limit: int) -> list[str]:
    """The lines holding the most live memory: what a growing figure is made of."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)]
    )
    stats = snapshot.statistics("lineno")[:limit]
    return [
        f"{stat.size / MB:8.1f} MB {stat.count:>10,} blocks  "
        f"{stat.traceback[0].filename.removeprefix(str(ROOT) + '/')}:{stat.traceback[0].lineno}"
        for stat in stats
    ]


def py_run(opts: StreamOptions) -> RunResult:
    """Run one N in a fresh interpreter; its progress lines pass through on stderr."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(asdict(opts))]
    started = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode == 0:
        try:
            return RunResult.from_json(json.loads(proc.stdout))
        except (json.JSONDecodeError, TypeError) as exc:
            reason = f"child printed no result ({exc})"
    elif proc.returncode < 0:  # e.g. SIGKILL from the kernel's OOM killer
        reason = f"child killed by signal {-proc.returncode} (out of memory?)"
    else:
        reason = f"child exited with status {proc.returncode} (traceback above)"
    wall = time.perf_counter() - started
    return RunResult("py", opts.n, wall_seconds=wall, stop_kind="crash", stop_reason=reason)


# -------------------------------------------------------------------------- JS


class JsPeer:
    """One driver.mjs process: one @waku/sds MessageChannel behind JSON lines."""

    def __init__(self, participant: str, seed: int, lost_timeout_ms: int | None) -> None:
        # No options beyond these: the driver's defaults are the js defaults.
        argv = ["node", str(JS_DRIVER), "--participant", participant, "--seed", str(seed)]
        if lost_timeout_ms is not None:
            argv += ["--lost-timeout-ms", str(lost_timeout_ms)]
        env = {k: v for k, v in os.environ.items() if k != "DEBUG"}  # keep `debug` quiet
        self.name = participant
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
        )

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise StreamStopError("error", f"js {self.name} exited (status {self.proc.poll()})")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            error = reply.get("error", {})
            raise StreamStopError("error", f"js {self.name} {op}: {error.get('message', reply)}")
        return reply

    def rss_mb(self, key: str = "VmRSS") -> float:
        return proc_status_mb(self.proc.pid, key)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class JsPair:
    """Alice and bob as two driver processes; the clock op stands in for ``now_ms``."""

    def __init__(self, opts: StreamOptions) -> None:
        self.alice = JsPeer("alice", opts.seed, opts.lost_timeout_ms)
        self.bob = JsPeer("bob", opts.seed, opts.lost_timeout_ms)

    def send(self, i: int, now_ms: int) -> bytes:
        self.alice.call("clock", now_ms=now_ms)
        reply = self.alice.call("send", payload_hex=f"message {i}".encode().hex())
        return bytes.fromhex(reply["wire_hex"])

    def deliver(self, data: bytes, now_ms: int) -> None:
        self.bob.call("clock", now_ms=now_ms)
        self.bob.call("receive", wire_hex=data.hex())

    def sync_round(self, now_ms: int) -> None:
        alice, bob = self.alice, self.bob
        bob.call("sweep_incoming")
        wire = bob.call("sync")["wire_hex"]
        if wire is not None:
            alice.call("clock", now_ms=now_ms)
            alice.call("receive", wire_hex=wire)
        alice.call("sweep_outgoing")
        for repair in alice.call("repair_sweep")["wire_hex_list"]:
            bob.call("receive", wire_hex=repair)

    def sample(self, sent: int, seconds: float) -> Sample:
        # Read the peaks before `state`, whose large reply would itself allocate.
        alice_peak, bob_peak = self.alice.rss_mb("VmHWM"), self.bob.rss_mb("VmHWM")
        sweep = self.alice.call("sweep_outgoing")
        alice_state, bob_state = self.alice.call("state"), self.bob.call("state")
        return Sample(
            sent=sent,
            seconds=seconds,
            alice_rss_mb=alice_peak,
            bob_rss_mb=bob_peak,
            traced_mb=None,
            traced_peak_mb=None,
            alice_outgoing=len(alice_state["outgoing"]),
            alice_possibly_acked=len(sweep["possibly_acknowledged"]),
            wire_mb_held=None,
            alice_log=len(alice_state["log"]),
            bob_log=len(bob_state["log"]),
            bob_incoming=len(bob_state["incoming"]),
        )

    def largest_rss_mb(self) -> float:
        return max(self.alice.rss_mb(), self.bob.rss_mb())

    def close(self) -> None:
        self.alice.close()
        self.bob.close()


def sdsync_source() -> str:
    """Which sdsync the children import, and its git state when it is this checkout's."""
    src = Path(sdsync.__file__).resolve().parent
    if not src.is_relative_to(ROOT):
        return str(src)
    rev = git_output("rev-parse", "--short", "HEAD") or "?"
    dirty = " + uncommitted changes" if git_output("status", "--porcelain", "--", str(src)) else ""
    return f"{src.relative_to(ROOT)} at {rev}{dirty}"


def git_output(*args: str) -> str:
    cmd = ["git", "-C", str(ROOT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()


def js_skip_reason() -> str:
    if shutil.which("node") is None:
        return "node not found on PATH"
    if not (JS_DIR / "node_modules" / "@waku" / "sds").is_dir():
        return "@waku/sds missing: run `cd tests/interop/js && npm ci`"
    return ""


def js_run(opts: StreamOptions) -> RunResult:
    """One N through a fresh pair of Node processes (driven from this process)."""
    pair = JsPair(opts)
    try:
        pair.alice.call("clock", now_ms=T0_MS)  # starts the channel: the start-up figure
        return stream(pair, opts, "js", pair.alice.rss_mb("VmHWM"))
    finally:
        pair.close()


def js_package() -> str:
    try:
        meta = json.loads((JS_DIR / "node_modules" / "@waku" / "sds" / "package.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "@waku/sds"
    return f"@waku/sds@{meta.get('version', '?')}"


# ---------------------------------------------------------------------- report


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def baseline_of(runs: list[RunResult], wanted: int) -> RunResult | None:
    """The run at ``wanted`` messages, else the smallest complete one."""
    complete = [r for r in runs if not r.stop_kind and r.peak_rss_mb]
    exact = [r for r in complete if r.n == wanted]
    if exact:
        return exact[0]
    return min(complete, key=lambda r: r.n) if complete else None


def growth(run: RunResult, base: RunResult | None) -> float | None:
    if base is None or not base.peak_rss_mb or run.peak_rss_mb is None:
        return None
    return run.peak_rss_mb / base.peak_rss_mb


def print_estimates(first: RunResult, sizes: list[int], opts: StreamOptions) -> None:
    """After the first run: roughly how long (and, for Python, how big) the rest will be."""
    if not first.completed or first.seconds <= 0:
        return
    for n in sizes:
        scale = n / first.completed
        if first.impl == "js":
            # js-waku re-sorts its whole history on every message: about N^2 in total.
            secs = first.wall_seconds * scale**2
            console.print(f"  js estimate N={n:,}: ~{secs / 60:,.0f} min (time ~ N^2)")
            continue
        secs = first.seconds * scale
        final = first.final
        rss = ""
        if final is not None:
            linear = first.start_rss_mb + (final.alice_rss_mb - first.start_rss_mb) * scale
            limit = f", limit {opts.max_rss_mb:,.0f} MB" if opts.max_rss_mb else ""
            rss = f"; RSS ~{linear:,.0f} MB if it keeps growing linearly{limit}"
        console.print(f"  py estimate N={n:,}: ~{secs:,.0f} s at the N={first.n:,} rate{rss}")


def result_table(runs: list[RunResult], baseline: int, package: str) -> Table:
    bases = {i: baseline_of([r for r in runs if r.impl == i], baseline) for i in ("py", "js")}
    against = ", ".join(f"{i} N={b.n:,}" for i, b in bases.items() if b is not None) or "-"
    table = Table(
        title=f"Memory on a long stream, alice -> bob (sdsync vs {package}); sizes in MB, "
        f"ratio: alice RSS over the run at {against}"
    )
    traced = any(r.final and r.final.traced_mb is not None for r in runs)
    # Two-line headers keep the numbers whole in 132 columns.
    columns = ["impl", "N", "sent", "alice\nout", "poss.\nack", "wire\nMB", "alice\nRSS"]
    columns += ["bob\nRSS", "start\nRSS", "ratio", *(["traced\nMB"] if traced else [])]
    columns += ["alice\nlog", "bob\nlog", "bob\nin", "msg/s"]
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True)
    for run in runs:
        s = run.final
        ratio = growth(run, bases[run.impl])
        bob_rss = s.bob_rss_mb if s else None
        table.add_row(
            run.impl,
            f"{run.n:,}",
            f"{run.completed:,}" + (" *" if run.stop_kind else ""),
            fmt(s.alice_outgoing if s else None),
            fmt(s.alice_possibly_acked if s else None),
            fmt(s.wire_mb_held if s else None),
            fmt(s.alice_rss_mb if s else None),
            "shared" if run.impl == "py" and bob_rss is None else fmt(bob_rss),
            fmt(run.start_rss_mb),
            fmt(ratio, ".2f") + ("x" if ratio is not None else ""),
            *([fmt(s.traced_mb if s else None)] if traced else []),
            fmt(s.alice_log if s else None),
            fmt(s.bob_log if s else None),
            fmt(s.bob_incoming if s else None),
            fmt(run.rate),
        )
    return table


def print_notes(runs: list[RunResult]) -> None:
    for run in runs:
        if run.top_allocations:
            console.print(f"{run.impl} N={run.n:,}, largest live allocations at the end:")
            for line in run.top_allocations:
                console.print("  " + line, markup=False, highlight=False)
    for run in runs:
        if run.stop_kind:
            console.print(
                f"* {run.impl} N={run.n:,} stopped after {run.completed:,} messages "
                f"({run.stop_kind}): {run.stop_reason}",
                markup=False,
                highlight=False,
            )
    console.print(
        "alice RSS: peak RSS of the Python process holding both channels (bob's is "
        "shared); for js, peak RSS (VmHWM) of alice's and bob's Node processes. start: "
        "alice RSS before the first message. wire MB: bytes of alice's outgoing messages; "
        "traced: the Python heap by tracemalloc. Every sample (10 per run): --json. "
        "* stopped early."
    )


def evaluate_target(runs: list[RunResult], baseline: int) -> dict[str, Any]:
    """The issue's target for Python: peak RSS at every N within 2x of the 10k figure."""
    py = [r for r in runs if r.impl == "py"]
    base = baseline_of(py, baseline)
    stopped = [r for r in py if r.stop_kind]
    ratios = {r.n: growth(r, base) for r in py if not r.stop_kind}
    worst = max((v for v in ratios.values() if v is not None), default=None)
    holds = base is not None and not stopped and worst is not None and worst <= TARGET_GROWTH
    verdict: dict[str, Any] = {
        "baseline_n": base.n if base else None,
        "ratios": ratios,
        "worst": worst,
        "stopped": [r.n for r in stopped],
        "holds": holds,
    }
    if base is None:
        console.print("Target: not evaluated (no complete Python run to compare with)")
        return verdict
    why = f"worst ratio {fmt(worst, '.2f')}x to N={base.n:,} ({base.peak_rss_mb:,.0f} MB)"
    if stopped:
        why += "; runs stopped early: " + ", ".join(f"N={r.n:,}" for r in stopped)
    mark = "[green]holds[/]" if holds else "[red]misses[/]"
    console.print(
        f"Target py peak RSS within {TARGET_GROWTH:.0f}x of N={base.n:,}: {why} -> {mark}"
    )
    return verdict


# ------------------------------------------------------------------------ main


def parse_sizes(text: str) -> list[int]:
    return [int(s.replace("_", "")) for s in text.split(",") if s.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10000,100000,300000", help="Python N values")
    parser.add_argument("--js-sizes", default="10000", help="js N values ('' for none)")
    parser.add_argument("--no-js", action="store_true", help="skip the @waku/sds side")
    parser.add_argument("--baseline", type=int, default=10_000, help="N the ratios refer to")
    parser.add_argument("--sync-every", type=int, default=1000, help="bob syncs per N received")
    parser.add_argument("--step-ms", type=int, default=10, help="fake clock step per message")
    parser.add_argument("--loss", type=float, default=0.0, help="fraction alice->bob dropped")
    parser.add_argument("--seed", type=int, default=1, help="seed of the loss rng (and js)")
    parser.add_argument("--lost-timeout-ms", type=int, default=None, help="both sides")
    parser.add_argument("--tracemalloc", action="store_true", help="trace the Python heap")
    parser.add_argument(
        "--max-rss-mb",
        type=float,
        default=round(machine_memory_mb() / 2),
        help="stop a run past this RSS (default half the machine's memory; 0: never)",
    )
    parser.add_argument("--js-max-seconds", type=float, default=1800.0, help="cap per js run")
    parser.add_argument("--progress", type=float, default=10.0, help="seconds between updates")
    parser.add_argument("--quick", action="store_true", help="sizes 1000,3000, js 1000")
    parser.add_argument("--json", help="write all numbers to this file ('-': stdout)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one Python run, options as JSON
    return parser


def run_all(
    impl: str, sizes: list[int], template: StreamOptions, run: Callable[[StreamOptions], RunResult]
) -> list[RunResult]:
    results: list[RunResult] = []
    for index, n in enumerate(sizes):
        opts = StreamOptions(**{**asdict(template), "n": n})
        console.print(f"{impl}: N={n:,} ...")
        result = run(opts)
        results.append(result)
        note = f" (stopped: {result.stop_reason})" if result.stop_kind else ""
        console.print(
            f"{impl}: N={n:,} {result.completed:,} sent in {result.wall_seconds:,.1f} s, "
            f"{result.rate:,.0f} msg/s, peak RSS {fmt(result.peak_rss_mb)} MB{note}",
            markup=False,
            highlight=False,
        )
        if index == 0 and len(sizes) > 1:
            print_estimates(result, sizes[1:], template)
    return results


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.json == "-":
        console.file = sys.stderr  # stdout carries the JSON document alone
    if args.child is not None:
        result = py_child(StreamOptions(**json.loads(args.child)))
        print(json.dumps(result.as_json()))
        return 0
    sizes, js_sizes = parse_sizes(args.sizes), parse_sizes(args.js_sizes)
    if args.quick:
        sizes, js_sizes = [1000, 3000], [1000]
    if args.no_js:
        js_sizes = []
    template = StreamOptions(
        n=0,
        sync_every=args.sync_every,
        step_ms=args.step_ms,
        loss=args.loss,
        seed=args.seed,
        lost_timeout_ms=args.lost_timeout_ms,
        tracemalloc=args.tracemalloc,
        max_rss_mb=args.max_rss_mb,
        progress_s=args.progress,
    )
    started = time.perf_counter()
    source = sdsync_source()  # the core may be changing under us: say which one ran
    console.print(
        f"[bold]sdsync core memory vs @waku/sds[/]  python {platform.python_version()}, "
        f"sizes {sizes}, js sizes {js_sizes}, sync every {args.sync_every}, "
        f"step {args.step_ms} ms, loss {args.loss}, tracemalloc {args.tracemalloc}, "
        f"RSS limit {args.max_rss_mb:,.0f} MB; sdsync from {source}",
        highlight=False,
    )

    runs = run_all("py", sizes, template, py_run)
    js_skip = "skipped (--no-js or empty --js-sizes)" if not js_sizes else js_skip_reason()
    if js_skip:
        console.print(f"[yellow]JS side not measured: {js_skip}[/]")
    else:
        js_template = StreamOptions(**{**asdict(template), "max_seconds": args.js_max_seconds})
        runs += run_all("js", js_sizes, js_template, js_run)

    package = js_package()
    console.print(result_table(runs, args.baseline, package))
    print_notes(runs)
    target = evaluate_target(runs, args.baseline)
    total = time.perf_counter() - started
    console.print(f"Total bench time: {total:,.1f} s")
    if args.json is not None:
        write_json(args, runs, target, {"sdsync": source, "js_package": package}, js_skip, total)
    return 0


def write_json(
    args: argparse.Namespace,
    runs: list[RunResult],
    target: dict[str, Any],
    sources: dict[str, str],
    js_skip: str,
    total: float,
) -> None:
    node = shutil.which("node")
    node_version = (
        subprocess.run(
            [node, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if node
        else None
    )
    doc = {
        "python": platform.python_version(),
        "js_runtime": node_version,
        **sources,
        "js_skipped": js_skip or None,
        "config": {
            "causal_history": 200,
            "bloom": [10_000, 0.001],
            "possible_acks_threshold": 2,
            "sync_every": args.sync_every,
            "step_ms": args.step_ms,
            "loss": args.loss,
            "seed": args.seed,
            "lost_timeout_ms": args.lost_timeout_ms,
            "tracemalloc": args.tracemalloc,
            "max_rss_mb": args.max_rss_mb,
            "js_max_seconds": args.js_max_seconds,
            "baseline": args.baseline,
        },
        "runs": [r.as_json() for r in runs],
        "target": target,
        "total_seconds": total,
    }
    text = json.dumps(doc, indent=2) + "\n"
    if args.json == "-":
        sys.stdout.write(text)
    else:
        Path(args.json).write_text(text)
        console.print(f"Wrote {args.json}")


if __name__ == "__main__":
    sys.exit(main())
