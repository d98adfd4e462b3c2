"""The reliability API through `sdsync reliability serve` against the same calls in-process.

Two participants: alice wraps, bob unwraps (each wrap's bytes go straight to bob's
unwrap), payloads of 70 bytes, the server's default profile (js-compatible: an SDS
message is ~18.9 KB, most of it the bloom filter). Every client thread ``t`` works on
channels of its own, ``bench-t-0``, ``bench-t-1``... (a new one every
:data:`PER_CHANNEL` messages), so each channel sees its messages in wrap order. One run
measures, back to back:

* ``in-process``: two :class:`~sdsync.ReliabilityManager` objects in this process, all
  threads calling the same pair (each manager takes one lock); its 1-thread row without
  state is the anchor;
* ``grpc``: two ``sdsync reliability serve`` processes on 127.0.0.1 (port 0), called
  through a Python gRPC client (one ``grpc.Channel`` per server, shared by the threads),
  a unary ``WrapOutgoingMessage`` then a unary ``UnwrapReceivedMessage`` per message;
* ``grpc-batch``: the same with the batch calls: ``WrapOutgoingMessages`` with ``--batch``
  payloads, then ``UnwrapReceivedMessages`` with their bytes (split so that no request
  carries more than :data:`UNWRAP_BYTES` of SDS messages: 64 messages take two calls);

each with 1 and ``--threads`` client threads, and each without and with a state
directory (``state``: ``state_dir`` / ``--state-dir``, SQLite with ``synchronous=NORMAL``).
Every row starts fresh managers or fresh server processes. The in-process rows run twice,
before and after the gRPC rows, and the table shows the faster run of each (the JSON
both): the anchor takes well under a second, and on a shared machine one busy moment
would otherwise decide every ratio.

Events are handled as an application would: in-process by an ``on_event`` callback
(``acknowledge="on_return"``: an event is acknowledged when the callback returns); over
gRPC by one ``Events`` subscriber per server (``EventBatches``, several events to a
stream message, for the batch rows), reading on a thread of its own, with a second
thread acknowledging what was read (``AckEvents``, every :data:`ACK_EVERY_S`), so
the servers' event logs stay short. After the measured part the run waits for every
``MessageReady`` and acknowledges it; ``left`` counts the events the servers still keep
after that (``ListChannels``: last minus acknowledged), which should be 0.

Columns: ``pairs/s`` wrap+unwrap pairs per second, all threads together, from when every
thread finished its warm-up to when the last one finished; ``x anchor`` that over the
1-thread in-process row without state; ``x same`` that over the in-process row with the
same threads and the same state setting (what serving costs, durability aside);
``p50``/``p99`` the latency of one message: from the start of the wrap call that carried
it to the end of the unwrap call that carried it (so every message of a batch has its
batch's time); ``CPU us/pair`` the CPU time (user + system) per measured pair of this
process (the client; in-process, both managers) and of alice's and bob's servers, which
says where the time goes even on a busy machine; ``events`` the events each side's
application handled (alice/bob, warm-up included).

The first :data:`WARM_UP` messages of every thread (rounded up to whole batches) warm up
and are not counted. Syncs and resends are pushed out of the way (:data:`QUIET_MS`).
Every unwrap must give back the payload just wrapped, under the wrap's message id, with
no missing dependency and not as a duplicate; every batch item must succeed; every
channel's events must be numbered 1, 2, 3..., its ``MessageReady`` events must carry its
payloads in wrap order, and nothing may be discarded. Otherwise the run stops with an
error: a fast wrong answer is not a result. Timing never fails the run.

    .venv/bin/python bench/reliability_grpc.py [--messages 4000] [--threads 4]
        [--batch 64] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from sdsync import ReliabilityManager
from sdsync.core import MessageDelivered
from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc
from sdsync.runtime import Delivery, EventsDiscarded, RuntimeConfig

WARM_UP = 100
PAYLOAD = b"x" * 64
#: No resends, and no syncs while measuring: each received message draws the next sync
#: uniformly in [now, now + interval / 2] if sooner, so with a week a row of 4,000
#: messages still saw a sync now and then (~8 %); with a year, about 0.2 %.
QUIET_MS = 365 * 86_400_000
QUIET_FLAGS = ("--sync-interval-ms", str(QUIET_MS), "--resend-interval-ms", str(QUIET_MS))
#: Messages per channel: alice never hears bob's acknowledgements (no syncs, and bob
#: sends nothing), so her channel holds every message she wrapped, and a channel holds
#: 5,000 at most (``max_outgoing_buffer``). A thread moves on to a new channel after these.
PER_CHANNEL = 4_000
#: How often a subscriber acknowledges the events it read.
ACK_EVERY_S = 0.05
#: Bytes of SDS messages in one UnwrapReceivedMessages call, at most: the server takes
#: requests up to 1 MiB + 64 KiB, and a message of the default profile is ~18.9 KB (its
#: bloom filter), so a batch of 64 wraps is unwrapped in two calls.
UNWRAP_BYTES = 1 << 20
#: Liveness bounds only (a server that stopped answering), never a timing verdict.
DEADLINE_S = 120.0


class BenchError(Exception):
    """A wrong answer: the run stops."""


def payload(thread: int, index: int) -> bytes:
    """The ``index``-th payload of thread ``thread`` (unique over the run's channels)."""
    return PAYLOAD + thread.to_bytes(2, "big") + index.to_bytes(4, "big")


def channel_of(thread: int, index: int) -> str:
    """The channel of thread ``thread``'s ``index``-th message: a new one every
    :data:`PER_CHANNEL` messages."""
    return f"bench-{thread}-{index // PER_CHANNEL}"


def channels(threads: int, batch: int, messages: int) -> list[str]:
    """Every channel a row uses."""
    per_thread = total_sent(threads, batch, messages) // threads
    return [channel_of(t, i) for t in range(threads) for i in range(0, per_thread, PER_CHANNEL)]


@dataclass
class Row:
    way: str
    state: bool
    threads: int
    batch: int
    messages: int  # measured pairs, all threads
    seconds: float
    pairs_per_s: float
    p50_us: float
    p99_us: float
    alice_events: int
    bob_events: int
    left_events: int  # still kept by the servers once everything was acknowledged
    alice_kinds: dict[str, int]
    bob_kinds: dict[str, int]
    #: CPU µs per measured pair: this process (client and in-process managers), then
    #: alice's and bob's servers.
    cpu_us_per_pair: list[float]
    #: In-process rows run twice, before and after the gRPC rows: pairs/s of each run.
    runs: list[float] = field(default_factory=list)
    x_anchor: float = 0.0
    x_same: float = 0.0


#: One thread's step: wrap these payloads on the channel, unwrap the bytes, check.
Pairs = Callable[[str, list[bytes]], None]


# ------------------------------------------------------------------------ checks


def check_unwrap(
    channel: str,
    sent: bytes,
    wrapped_id: str,
    got: bytes | None,
    got_id: str,
    missing: list[str],
    duplicate: bool,
) -> None:
    if got != sent or got_id != wrapped_id or missing or duplicate:
        raise BenchError(
            f"{channel}: {sent[-6:].hex()} (id {wrapped_id[:12]}) unwrapped as"
            f" {None if got is None else got[-6:].hex()} (id {got_id[:12]}),"
            f" missing {missing}, duplicate {duplicate}"
        )


class EventCheck:
    """What one participant's application hears: counts events, checks their numbers and
    that each channel's MessageReady events carry its payloads in wrap order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.events = 0
        self.last_seq: dict[str, int] = {}
        self.ready: dict[str, int] = {}
        self.kinds: dict[str, int] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def seen(self, channel: str, seq: int, kind: str, ready: bytes | None, discarded: bool) -> None:
        with self._lock:
            self.events += 1
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            expected = self.last_seq.get(channel, 0) + 1
            if seq != expected:
                self._fail(f"{channel}: event {seq} where {expected} was next")
            self.last_seq[channel] = seq
            if discarded:
                self._fail(f"{channel}: events discarded (event {seq})")
            if ready is not None:
                k = self.ready.get(channel, 0)
                thread, part = map(int, channel.removeprefix("bench-").split("-"))
                if ready != payload(thread, part * PER_CHANNEL + k):
                    self._fail(f"{channel}: MessageReady #{k} carries {ready[-6:].hex()}")
                self.ready[channel] = k + 1

    def _fail(self, message: str) -> None:
        if len(self.errors) < 10:
            self.errors.append(f"{self.name}: {message}")

    def ready_count(self) -> int:
        with self._lock:
            return sum(self.ready.values())

    def wait_ready(self, expected: int) -> None:
        """Until ``expected`` MessageReady events arrived (liveness bound only)."""
        deadline = time.monotonic() + DEADLINE_S
        while self.ready_count() < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.ready_count() != expected:
            raise BenchError(f"{self.name}: {self.ready_count()} MessageReady, not {expected}")
        if self.errors:
            raise BenchError("; ".join(self.errors))


def on_event(check: EventCheck) -> Callable[[str, Delivery], None]:
    """An in-process application's ``on_event``."""

    def handle(channel: str, delivery: Delivery) -> None:
        event = delivery.event
        ready = event.content if isinstance(event, MessageDelivered) else None
        discarded = isinstance(event, EventsDiscarded)
        check.seen(channel, delivery.seq or 0, type(event).__name__, ready, discarded)

    return handle


class Subscriber:
    """An ``Events`` stream (``EventBatches`` when ``batched``) read on one thread,
    acknowledged from another."""

    def __init__(self, stub: pb_grpc.ReliabilityStub, check: EventCheck, batched: bool) -> None:
        self._stub = stub
        self.check = check
        self._batches = stub.EventBatches(pb.EventsRequest()) if batched else None
        self._single = None if batched else stub.Events(pb.EventsRequest())
        self._read_to: dict[str, int] = {}
        self._acked: dict[str, int] = {}
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._acker = threading.Thread(target=self._ack_loop, daemon=True)
        self._reader.start()
        if not self._subscribed.wait(DEADLINE_S):
            self._cancel()
            raise BenchError(f"{check.name}: no Subscribed event")
        self._acker.start()

    def _read(self) -> None:
        try:
            for event in self._events():
                kind = event.WhichOneof("event") or ""
                if kind == "subscribed":
                    self._subscribed.set()
                    continue
                ready = event.message_ready.payload if kind == "message_ready" else None
                discarded = kind == "events_discarded"
                self.check.seen(event.channel_id, event.seq, kind, ready, discarded)
                with self._lock:
                    self._read_to[event.channel_id] = event.seq
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.check.errors.append(f"{self.check.name}: events stream ended: {exc}")

    def _events(self) -> Iterator[pb.Event]:
        if self._single is not None:
            yield from self._single
        for batch in self._batches or ():
            yield from batch.events

    def _cancel(self) -> None:
        for stream in (self._single, self._batches):
            if stream is not None:
                stream.cancel()

    def _ack_loop(self) -> None:
        while not self._done.wait(ACK_EVERY_S):
            try:
                self.ack()
            except grpc.RpcError as exc:
                self.check.errors.append(f"{self.check.name}: AckEvents failed: {exc}")
                return

    def ack(self) -> None:
        with self._lock:
            todo = {c: s for c, s in self._read_to.items() if self._acked.get(c) != s}
        if todo:
            acks = [pb.EventPosition(channel_id=c, seq=s) for c, s in todo.items()]
            self._stub.AckEvents(pb.AckEventsRequest(acks=acks))
            self._acked.update(todo)

    def stop(self) -> None:
        """Acknowledge what was read, then end the stream."""
        self._done.set()
        self._acker.join(DEADLINE_S)
        with suppress(grpc.RpcError):  # the server is gone: an error on its way already
            self.ack()
        self._cancel()
        self._reader.join(DEADLINE_S)


# ------------------------------------------------------------------- measuring


def measure(
    pairs: Pairs, threads: int, batch: int, messages: int, cpu: Callable[[], list[float]]
) -> tuple[float, list[int], list[float]]:
    """Run ``threads`` threads of ``messages // threads`` measured pairs each, after their
    warm-up; the seconds all took together, every message's latency (ns) and the CPU
    seconds ``cpu`` counted meanwhile (per process)."""
    per_thread = max(1, messages // threads)
    warm = -(-WARM_UP // batch) * batch
    latencies: list[list[int]] = [[] for _ in range(threads)]
    errors: list[Exception] = []
    start = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        try:
            i = 0
            while i < warm + per_thread:
                if i == warm:
                    start.wait(DEADLINE_S)
                end = warm + per_thread if i >= warm else warm
                n = min(batch, end - i, PER_CHANNEL - i % PER_CHANNEL)
                items = [payload(t, i + k) for k in range(n)]
                t0 = time.perf_counter_ns()
                pairs(channel_of(t, i), items)
                took = time.perf_counter_ns() - t0
                if i >= warm:
                    latencies[t].extend([took] * n)
                i += n
        except Exception as exc:  # reported by the main thread
            errors.append(exc)
            start.abort()

    workers = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    with suppress(threading.BrokenBarrierError):  # a worker failed: its error follows
        start.wait(DEADLINE_S)
    started = time.perf_counter()
    cpu_started = cpu()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - started
    used = [b - a for a, b in zip(cpu_started, cpu(), strict=True)]
    if errors:
        raise BenchError(str(errors[0])) from errors[0]
    return seconds, [x for per in latencies for x in per], used


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far (NaN without /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1_000


def total_sent(threads: int, batch: int, messages: int) -> int:
    """Every message a row wraps, warm-up included."""
    return threads * (-(-WARM_UP // batch) * batch + max(1, messages // threads))


def row(
    way: str,
    state: bool,
    threads: int,
    batch: int,
    seconds: float,
    latencies: list[int],
    checks: tuple[EventCheck, EventCheck],
    left: int,
    cpu: list[float],
) -> Row:
    return Row(
        way,
        state,
        threads,
        batch,
        len(latencies),
        seconds,
        len(latencies) / seconds,
        percentile(latencies, 0.50),
        percentile(latencies, 0.99),
        checks[0].events,
        checks[1].events,
        left,
        dict(checks[0].kinds),
        dict(checks[1].kinds),
        [c * 1e6 / len(latencies) for c in cpu],
    )


def in_process(threads: int, messages: int, state_dir: Path | None) -> Row:
    runtime = RuntimeConfig(sync_interval_ms=QUIET_MS, resend_interval_ms=QUIET_MS)
    managers = []
    checks = (EventCheck("alice"), EventCheck("bob"))
    for name, check in zip(("alice", "bob"), checks, strict=True):
        manager = ReliabilityManager(
            name, runtime=runtime, state_dir=None if state_dir is None else state_dir / name
        )
        manager.on_event = on_event(check)
        managers.append(manager)
    alice, bob = managers
    try:
        for channel in channels(threads, 1, messages):
            bob.open_channel(channel)

        def pairs(channel: str, items: list[bytes]) -> None:
            for sent in items:
                wrapped = alice.wrap(sent, channel)
                got = bob.unwrap_received_message(wrapped.data)
                check_unwrap(
                    channel,
                    sent,
                    wrapped.message_id,
                    got.payload,
                    got.message_id,
                    got.missing_dependencies,
                    got.duplicate,
                )

        seconds, latencies, cpu = measure(
            pairs, threads, 1, messages, lambda: [time.process_time()]
        )
        checks[1].wait_ready(total_sent(threads, 1, messages))
        left = sum(
            m.event_positions(c)[0] - m.event_positions(c)[1]
            for m in managers
            for c in m.channels()
        )
    finally:
        for m in managers:
            m.close()
    state = state_dir is not None
    return row("in-process", state, threads, 1, seconds, latencies, checks, left, cpu)


@contextmanager
def servers(logs: Path, state_dir: Path | None) -> Iterator[list[tuple[str, int]]]:
    """alice's and bob's ``reliability serve`` processes on 127.0.0.1; their addresses
    and process ids."""
    env = {k: v for k, v in os.environ.items() if k != "SDSYNC_RELIABILITY_TOKEN"}
    processes = []
    try:
        for name in ("alice", "bob"):
            command = [sys.executable, "-m", "sdsync.cli", "reliability", "serve"]
            command += ["--listen", "127.0.0.1:0", "--participant", name, *QUIET_FLAGS]
            if state_dir is not None:
                command += ["--state-dir", str(state_dir / name)]
            with (logs / f"{name}.log").open("ab") as stderr:
                processes.append(
                    subprocess.Popen(
                        command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
                    )
                )
        addresses = []
        for process in processes:
            assert process.stdout is not None
            first = process.stdout.readline().strip()
            if not first.startswith("listening on "):
                raise BenchError(f"a server did not start: {first!r}; see {logs}")
            addresses.append((first.removeprefix("listening on "), process.pid))
        yield addresses
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(60)


def unary(alice: pb_grpc.ReliabilityStub, bob: pb_grpc.ReliabilityStub) -> Pairs:
    def pairs(channel: str, items: list[bytes]) -> None:
        for sent in items:
            request = pb.WrapOutgoingMessageRequest(channel_id=channel, payload=sent)
            wrapped = alice.WrapOutgoingMessage(request)
            got = bob.UnwrapReceivedMessage(pb.UnwrapReceivedMessageRequest(data=wrapped.data))
            check_unwrap(
                channel,
                sent,
                wrapped.message_id,
                got.payload if got.HasField("payload") else None,
                got.message_id,
                list(got.missing_dependencies),
                got.duplicate,
            )

    return pairs


def by_size(datas: list[bytes]) -> Iterator[list[bytes]]:
    """``datas`` in runs of at most :data:`UNWRAP_BYTES` bytes (a run holds one at least)."""
    run: list[bytes] = []
    size = 0
    for data in datas:
        if run and size + len(data) > UNWRAP_BYTES:
            yield run
            run, size = [], 0
        run.append(data)
        size += len(data)
    if run:
        yield run


def batched(alice: pb_grpc.ReliabilityStub, bob: pb_grpc.ReliabilityStub) -> Pairs:
    def pairs(channel: str, items: list[bytes]) -> None:
        wraps = [pb.WrapOutgoingMessageRequest(channel_id=channel, payload=p) for p in items]
        wrapped = alice.WrapOutgoingMessages(pb.WrapOutgoingMessagesRequest(messages=wraps))
        if len(wrapped.results) != len(items):
            raise BenchError(f"{channel}: {len(wrapped.results)} wrap results for {len(items)}")
        for w in wrapped.results:
            if w.HasField("refused"):
                raise BenchError(f"{channel}: wrap refused: {w.refused.message}")
        results: list[pb.UnwrapResult] = []
        for chunk in by_size([r.wrapped.data for r in wrapped.results]):
            unwraps = [pb.UnwrapReceivedMessageRequest(data=d) for d in chunk]
            got = bob.UnwrapReceivedMessages(pb.UnwrapReceivedMessagesRequest(messages=unwraps))
            results.extend(got.results)
        if len(results) != len(items):
            raise BenchError(f"{channel}: {len(results)} unwrap results for {len(items)}")
        for sent, w, r in zip(items, wrapped.results, results, strict=True):
            if r.HasField("refused"):
                raise BenchError(f"{channel}: unwrap refused: {r.refused.message}")
            u = r.unwrapped
            check_unwrap(
                channel,
                sent,
                w.wrapped.message_id,
                u.payload if u.HasField("payload") else None,
                u.message_id,
                list(u.missing_dependencies),
                u.duplicate,
            )

    return pairs


def over_grpc(way: str, threads: int, batch: int, messages: int, root: Path, state: bool) -> Row:
    checks = (EventCheck("alice"), EventCheck("bob"))
    with ExitStack() as stack:
        addresses = stack.enter_context(servers(root, root if state else None))
        pids = [pid for _, pid in addresses]
        stubs = []
        subscribers = []
        for (address, _), check in zip(addresses, checks, strict=True):
            # A WrapOutgoingMessages answer holds every item's SDS message (~18.9 KB each):
            # beyond ~220 items it exceeds gRPC's default 4 MiB for a received message.
            options = [("grpc.max_receive_message_length", -1)]
            connection = stack.enter_context(grpc.insecure_channel(address, options=options))
            stub = pb_grpc.ReliabilityStub(connection)
            subscribers.append(Subscriber(stub, check, batched=way == "grpc-batch"))
            stack.callback(subscribers[-1].stop)
            stubs.append(stub)
        alice, bob = stubs
        for channel in channels(threads, batch, messages):
            bob.OpenChannel(pb.OpenChannelRequest(channel_id=channel))
        pairs = batched(alice, bob) if way == "grpc-batch" else unary(alice, bob)
        seconds, latencies, cpu = measure(
            pairs,
            threads,
            batch,
            messages,
            lambda: [time.process_time(), *(process_cpu(pid) for pid in pids)],
        )
        checks[1].wait_ready(total_sent(threads, batch, messages))
        for subscriber in subscribers:
            subscriber.ack()
        left = 0
        for stub in stubs:
            for info in stub.ListChannels(pb.ListChannelsRequest()).channels:
                left += info.last_seq - info.acknowledged_seq
    for check in checks:
        if check.errors:
            raise BenchError("; ".join(check.errors))
    return row(way, state, threads, batch, seconds, latencies, checks, left, cpu)


# ---------------------------------------------------------------------- report


def report(rows: list[Row]) -> None:
    anchor = rows[0]
    same = {(r.threads, r.state): r for r in rows if r.way == "in-process"}
    for r in rows:
        r.x_anchor = r.pairs_per_s / anchor.pairs_per_s
        r.x_same = r.pairs_per_s / same[(r.threads, r.state)].pairs_per_s
    print(
        f"{'way':<10} {'state':<5} {'threads':>7} {'batch':>5} {'pairs/s':>7} "
        f"{'x anchor':>8} {'x same':>6} {'p50':>9} {'p99':>9} "
        f"{'CPU us/pair':>16} {'events':>13} {'left':>4}"
    )
    for r in rows:
        cpu = "/".join(f"{c:.0f}" for c in r.cpu_us_per_pair)
        print(
            f"{r.way:<10} {'yes' if r.state else 'no':<5} {r.threads:>7} {r.batch:>5} "
            f"{r.pairs_per_s:>7,.0f} {r.x_anchor:>8.3f} {r.x_same:>6.3f} "
            f"{r.p50_us / 1000:>7.2f}ms {r.p99_us / 1000:>7.2f}ms "
            f"{cpu:>16} {f'{r.alice_events}/{r.bob_events}':>13} {r.left_events:>4}"
        )
    print(
        "in-process rows: the faster of two runs, before and after the gRPC rows."
        "\nx anchor: over in-process, 1 thread, no state; x same: over in-process with the"
        " same threads and state.\np50/p99: per message, from the start of the wrap call"
        " that carried it to the end of the unwrap call that carried it.\nCPU us/pair:"
        " this process (client; in-process: both managers)/alice's server/bob's server."
        "\nevents: handled by alice's/bob's application (all acknowledged); left: still"
        " kept unacknowledged at the end."
    )


def in_process_rows(counts: list[int], messages: int, root: Path) -> list[Row]:
    """The in-process rows: 1 and more threads, without and with state."""
    rows = []
    for state in (False, True):
        for threads in counts:
            where = root / f"{state}-{threads}"
            where.mkdir(parents=True)
            rows.append(in_process(threads, messages, where if state else None))
    return rows


def faster(a: Row, b: Row) -> Row:
    """Of two runs of the same in-process row, the faster, remembering both."""
    best = a if a.pairs_per_s >= b.pairs_per_s else b
    best.runs = [a.pairs_per_s, b.pairs_per_s]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4_000, help="measured pairs per row")
    parser.add_argument("--threads", type=int, default=4, help="client threads of the 2nd rows")
    parser.add_argument("--batch", type=int, default=64, help="items per batch call")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.messages < 1 or args.threads < 1 or not 1 <= args.batch <= 4_096:
        parser.error("--messages and --threads must be >= 1, --batch 1..4096")
    counts = sorted({1, args.threads})
    load_before = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory(prefix="sdsync-bench-") as tmp:
            root = Path(tmp)
            before = in_process_rows(counts, args.messages, root / "before")
            rows: list[Row] = []
            for state in (False, True):
                for way, batch in (("grpc", 1), ("grpc-batch", args.batch)):
                    for threads in counts:
                        where = root / f"{way}-{state}-{threads}"
                        where.mkdir()
                        rows.append(over_grpc(way, threads, batch, args.messages, where, state))
            after = in_process_rows(counts, args.messages, root / "after")
    except BenchError as exc:
        raise SystemExit(f"wrong answer: {exc}") from None
    print(
        f"{args.messages:,} measured pairs per row, payloads of {len(payload(0, 0))} bytes,"
        f" alice wraps, bob unwraps; {os.cpu_count()} CPUs, load average"
        f" {load_before:.1f} before and {os.getloadavg()[0]:.1f} after the run"
    )
    rows = [faster(a, b) for a, b in zip(before, after, strict=True)] + rows
    report(rows)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
