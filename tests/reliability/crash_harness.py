"""Three ``sdsync reliability serve`` participants over a lossy relay, one of them killed
with SIGKILL at a chosen step per seed: does every application get everything exactly once?

Theory of operation
-------------------
A :class:`Cluster` runs three server processes (participants ``p0``, ``p1``, ``p2``), each
with a ``--state-dir`` and short timers, and a supervisor thread that restarts a server
from its state directory as soon as its process is gone (killed by the harness, or by
itself at an ``SDSYNC_CRASH_AT`` point). Seeds run one after another on the same three
processes, each on a channel of its own (closed at the end of the seed, so a restart no
longer reopens it): starting processes is what costs, not channels. :func:`run_seeds`
runs two such clusters side by side, since the servers mostly wait for their timers.

Per seed, each participant's application is an :class:`App`, which does what the
reliability API asks of an application, and no more:

* it wraps its own messages (explicit ids, so that a wrap whose answer was lost is simply
  asked again: the same id and payload give the same bytes), some one by one and some in
  ``WrapOutgoingMessages`` batches, and hands the bytes to the :class:`Relay`;
* it unwraps what the relay brings (the other two's wrapped messages, and the bytes of
  their ``Transmit`` events), one by one, in batches, or in bursts of up to 200 on 4
  threads; a call cut by a crash is offered again after the restart;
* it follows ``Events`` from its last processed seq (the ``resume`` point), checks that
  the seqs of the channel come 1, 2, 3, ... without a gap or a repeat, records every event
  by seq, carries ``Transmit`` bytes to the relay, acknowledges now and then
  (``AckEvents``), and sometimes reconnects on purpose.

The :class:`Relay` loses 30 % of what it carries (a decision per copy, seeded by what is
carried, to whom and how many times before, so it does not hang on thread timing) and
delivers some copies twice.

Each seed picks a victim at random and one of :data:`KILL_POINTS`, in turn (an armed
point is set by restarting the victim with the variable first: one kill more):

* ``commit-unwrap`` — the victim's application holds back its unwraps while the others
  wrap 50 to 80 messages each and resends pile up (up to 200 items, or :data:`HOLD_S`);
  the victim is restarted with ``SDSYNC_CRASH_AT=commit:N`` and unwraps it all in a burst
  on 4 threads: it kills itself after the Nth committed step, before any answer or event
  about it (mid-unwrap; a timer's step may come first, rarely even before the server
  says where it listens, which counts as the hit it is);
* ``after-unwrap-answer`` — killed from outside right after the Kth unwrap answer;
* ``mid-burst`` — held back as for ``commit-unwrap``, then killed from outside once the
  first K answers of the burst came, while the other threads' calls are in flight;
* ``event`` — ``SDSYNC_CRASH_AT=event:N``: right after the Nth event went to a stream;
* ``answer`` — ``SDSYNC_CRASH_AT=answer:N``: a call did its work, its answer not sent;
* ``commit`` — ``SDSYNC_CRASH_AT=commit:N``: any step (wrap, unwrap, timer) committed and
  not yet heard of.

Then the seed runs until every application has every other participant's messages
(``MessageReady``) and every own message is acknowledged (``MessageSent``) or given up
(``SendFailed``); a final pass reads each server's remaining events up to its last seq.
What is checked, per application: every other participant's message ready exactly once
(one seq per message id), with the payload and sender it was wrapped with; nothing ready
that nobody wrapped, nor our own; each own message sent or failed exactly once; no seq
skipped (except where ``EventsDiscarded`` says, which is counted) or repeated after a
resume point; an unwrap answer's payload given at most once per message and always the
right one; every wrap answered before a crash answered again with the same bytes after it
(``repeated_wrap``); nothing left unacknowledged or waiting on the servers at the end.

Waits are liveness bounds, never assertions about time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import random
import signal
import threading
import time
import traceback
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from reliabilityprocess import CRASH_VARIABLE, PATIENCE_S, ServerProcess

from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc
from sdsync.wire import decode

T = TypeVar("T")

NAMES = ("p0", "p1", "p2")
KILL_POINTS = ("commit-unwrap", "after-unwrap-answer", "mid-burst", "event", "answer", "commit")
ARMED = {"commit-unwrap": "commit", "event": "event", "answer": "answer", "commit": "commit"}
LOSS = 0.3
DUPLICATE = 0.05
BURST = 200
MESSAGES = (8, 16)  # a participant's messages per seed, at least and at most
BURST_MESSAGES = (50, 80)  # the others', when the victim unwraps in a burst
HOLD_S = 1.0  # how long a burst waits for resends to fill it, at most
BURST_THREADS = 4
# Short timers so that resends, syncs and repairs make up for the losses within seconds;
# a small bloom filter so that the seeds do not spend their time moving filter bytes (the
# filter is not what a crash attacks).
SERVER_ARGS = (
    *("--resend-interval-ms", "100", "--sync-interval-ms", "250"),
    *("--repair-t-min-ms", "50", "--repair-t-max-ms", "250"),
    *("--bloom-capacity", "1000", "--bloom-error-rate", "0.01"),
)
CALL_TIMEOUT_S = 30.0  # a call that takes this long hangs: the run fails


class HarnessError(AssertionError):
    """The harness could not go on (a server that does not come back, a call that hangs)."""


# ------------------------------------------------------------------------------ servers


class Node:
    """One participant's server across its lives; restarted by the cluster's supervisor."""

    def __init__(self, name: str, logs: Path, state: Path) -> None:
        self.name = name
        self.server = ServerProcess(
            logs, "--participant", name, "--state-dir", str(state), *SERVER_ARGS
        )
        self.generation = 0
        self.armed: str | None = None  # the SDSYNC_CRASH_AT of the running process
        self.deaths = 0
        self.hits: list[str] = []  # armed crash points that fired
        self.unexpected: list[str] = []
        self.broken: str | None = None  # why it could not be restarted
        self._next_env: dict[str, str] | None = None
        self._pending_kills = 0
        self._changed = threading.Condition()

    def current(self) -> tuple[int, pb_grpc.ReliabilityStub]:
        with self._changed:
            return self.generation, self.server.stub

    def kill(self) -> None:
        """SIGKILL from outside, now; the supervisor restarts it."""
        with self._changed:
            if self.server.alive():  # else it is dead already, and restarting
                self._pending_kills += 1
                os.kill(self.server.process.pid, signal.SIGKILL)

    def rearm(self, crash_at: str) -> None:
        """Kill and restart with ``SDSYNC_CRASH_AT=crash_at``; returns once it serves."""
        with self._changed:
            self._next_env = {CRASH_VARIABLE: crash_at}
            generation = self.generation
        self.kill()
        self.wait_generation(generation)

    def wait_generation(self, generation: int) -> None:
        """Until a life after ``generation`` serves."""
        with self._changed:
            served = self._changed.wait_for(
                lambda: self.generation > generation or self.broken is not None, PATIENCE_S
            )
            if self.broken is not None:
                raise HarnessError(f"{self.name} did not come back: {self.broken}")
            if not served:
                raise HarnessError(f"{self.name} was not restarted within {PATIENCE_S} s")

    def check(self) -> None:
        """Restart the server if its process is gone (the supervisor's step)."""
        if self.broken is not None or self.server.alive():
            return
        old = self.server
        old.reap()
        with self._changed:
            env, self._next_env = self._next_env, None
            if self.armed is not None and self._pending_kills == 0:
                self.hits.append(self.armed)
            elif self._pending_kills == 0:
                code = old.process.returncode
                self.unexpected.append(f"{self.name} died by itself (exit {code})")
            self._pending_kills = max(0, self._pending_kills - 1)
            self.deaths += 1
        try:
            new = old.restart(env=env)
        except AssertionError as exc:
            if env is None:
                self._give_up(str(exc))
                return
            # Armed, it died before it said where it listens: its first step (a timer's)
            # reached the crash point at once. A hit all the same; now start it unarmed.
            with self._changed:
                self.hits.append(env[CRASH_VARIABLE])
                self.deaths += 1
            env = None
            try:
                new = old.restart()
            except AssertionError as again:
                self._give_up(str(again))
                return
        with self._changed:
            self.server = new
            self.armed = None if env is None else env[CRASH_VARIABLE]
            self.generation += 1
            self._changed.notify_all()

    def _give_up(self, why: str) -> None:
        with self._changed:
            self.broken = why
            self._changed.notify_all()

    def call(self, what: Callable[[pb_grpc.ReliabilityStub], T]) -> tuple[T, int]:
        """``what`` on the current server, again on the next life if a crash cut it; the
        answer and how many times it was cut."""
        cut = 0
        while True:
            generation, stub = self.current()
            try:
                return what(stub), cut
            except (grpc.RpcError, ValueError) as exc:
                if not self.crashed(generation, exc):
                    raise
                cut += 1

    def rpc(self, method: str, request: Message) -> tuple[Any, int]:
        """The unary call ``method`` with ``request``, as :meth:`call` makes it."""

        def invoke(stub: pb_grpc.ReliabilityStub) -> Any:
            return getattr(stub, method)(request, timeout=CALL_TIMEOUT_S)

        return self.call(invoke)

    def crashed(self, generation: int, exc: Exception) -> bool:
        """Whether ``exc`` (from a call to life ``generation``) is that life's end: then
        returns once the next life serves. ValueError: the call found the channel of a
        life already reaped."""
        if isinstance(exc, grpc.RpcError):
            code = exc.code() if isinstance(exc, grpc.Call) else None
            # CANCELLED: the call was in flight when the dead life's channel was closed.
            if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                return False
        started = time.monotonic()
        while time.monotonic() < started + PATIENCE_S:
            with self._changed:
                if self.generation > generation:
                    return True
                if self.broken is not None:
                    raise HarnessError(f"{self.name} did not come back: {self.broken}")
                if self.server.alive() and time.monotonic() > started + 5:
                    return False  # the same life still serves: that was no crash
                self._changed.wait(0.05)
        return False

    def stderr_problems(self) -> list[str]:
        text = self.server.stderr()
        return [f"{self.name}: a traceback in its log"] if "Traceback" in text else []

    def log_tail(self, lines: int = 40) -> str:
        tail = "\n".join(self.server.stderr().splitlines()[-lines:])
        return f"--- the end of {self.name}'s log ---\n{tail}"


class Cluster:
    """Three nodes and the supervisor that restarts them."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.nodes: list[Node] = []
        try:
            for name in NAMES:
                self.nodes.append(Node(name, root / f"{name}.log", root / name))
        except BaseException:
            self.close()
            raise
        self._stopping = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        self._supervisor.start()

    def _supervise(self) -> None:
        while not self._stopping.wait(0.01):
            for node in self.nodes:
                node.check()

    def close(self) -> None:
        if hasattr(self, "_stopping"):
            self._stopping.set()
            self._supervisor.join(PATIENCE_S)
        for node in self.nodes:
            if node.server.alive():
                node.server.stop()


# -------------------------------------------------------------------------------- relay


class Relay:
    """Carries bytes from one participant to the two others; loses some, doubles some."""

    def __init__(self, seed: int, apps: Sequence[App]) -> None:
        self.seed = seed
        self.apps = apps
        self.carried = 0
        self.dropped = 0
        self.doubled = 0
        self._times: Counter[tuple[int, bytes]] = Counter()
        self._lock = threading.Lock()

    def carry(self, source: int, data: bytes) -> None:
        digest = hashlib.sha256(data).digest()
        for target, app in enumerate(self.apps):
            if target == source:
                continue
            with self._lock:
                nth = self._times[target, digest]
                self._times[target, digest] += 1
                fate = random.Random(f"{self.seed}/{target}/{digest.hex()}/{nth}").random()
                self.carried += 1
                if fate < LOSS:
                    self.dropped += 1
                    continue
                copies = 2 if fate > 1 - DUPLICATE else 1
                self.doubled += copies - 1
            app.inbox.put([data] * copies)


class Inbox:
    """What the relay brought one application and it has not unwrapped yet."""

    def __init__(self) -> None:
        self._items: deque[bytes] = deque()
        self._changed = threading.Condition()

    def put(self, items: Sequence[bytes]) -> None:
        with self._changed:
            self._items.extend(items)
            self._changed.notify_all()

    def take(self, limit: int, wait_s: float) -> list[bytes]:
        with self._changed:
            self._changed.wait_for(lambda: bool(self._items), wait_s)
            return [self._items.popleft() for _ in range(min(limit, len(self._items)))]

    def __len__(self) -> int:
        with self._changed:
            return len(self._items)


# ---------------------------------------------------------------------------- the seeds


@dataclass
class Plan:
    """Who is killed where, for one seed."""

    victim: int
    point: str
    number: int  # N of SDSYNC_CRASH_AT, or the Kth answer after which to kill

    @property
    def crash_at(self) -> str | None:
        armed = ARMED.get(self.point)
        return None if armed is None else f"{armed}:{self.number}"


def plan_for(seed: int) -> Plan:
    """The seed's victim (at random) and kill point (each in turn, so that every point is
    hit as often as the others)."""
    rng = random.Random(f"{seed}/plan")
    victim = rng.randrange(len(NAMES))
    point = KILL_POINTS[seed % len(KILL_POINTS)]
    # Small enough that the point is always reached during the seed's traffic (each
    # participant wraps at least MESSAGES[0] messages; the burst holds a hundred or so).
    bound = {"commit-unwrap": 40, "answer": 6}.get(point, MESSAGES[0] * 2)
    return Plan(victim, point, rng.randint(1, bound))


@dataclass
class SeedRow:
    """One seed's line of the table."""

    seed: int
    victim: str
    kill_point: str
    crash_at: str
    hit: bool  # the planned kill happened where planned
    kills: int = 0  # deaths of the victim during the seed (an armed restart is one more)
    calls_cut: int = 0  # calls that a crash cut and the application made again
    unwraps_cut: int = 0  # of those, unwraps (single or batch)
    burst: int = 0  # unwraps in the victim's held-back burst (mid-burst, commit-unwrap)
    wraps_retried: int = 0
    wraps_repeated: int = 0  # of those, answered repeated_wrap (the first was committed)
    rewraps_checked: int = 0  # wraps answered before the crash, asked again: same bytes
    messages: int = 0
    events_checked: int = 0
    ready: int = 0
    sent: int = 0
    send_failed: int = 0
    discarded: int = 0
    lost: int = 0
    duplicated: int = 0
    relay_dropped: int = 0
    seconds: float = 0.0
    killed_at_s: float = 0.0  # when the planned kill's restart served, from the start
    failures: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    """What one application saw (under its lock)."""

    events: dict[int, pb.Event] = field(default_factory=dict)
    ready: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    sent: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    failed: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    discarded: list[tuple[int, int]] = field(default_factory=list)
    fresh: Counter[str] = field(default_factory=Counter)  # unwrap answers with a payload
    wrapped: dict[str, bytes] = field(default_factory=dict)
    cut: int = 0
    unwraps_cut: int = 0
    burst: int = 0  # the size of the held-back burst, if any
    wraps_retried: int = 0
    wraps_repeated: int = 0
    rewraps: int = 0


class App:
    """One participant's application for one seed."""

    def __init__(
        self,
        index: int,
        node: Node,
        seed: int,
        channel: str,
        own: dict[str, bytes],
        senders: dict[str, str],
        payloads: dict[str, bytes],
        failures: list[str],
    ) -> None:
        self.index = index
        self.node = node
        self.name = node.name
        self.seed = seed
        self.channel = channel
        self.own = own
        self.senders = senders  # every message id of the seed -> its sender
        self.payloads = payloads  # every message id of the seed -> its payload
        self.failures = failures
        self.inbox = Inbox()
        self.relay: Relay | None = None
        self.out = Outcome()
        self.last = 0  # the last seq processed
        self.wrapping_done = threading.Event()
        self.hold_unwraps = threading.Event()  # set: unwraps wait for release()
        self._release = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.RLock()
        self._stream: Any = None
        self._threads: list[threading.Thread] = []
        self._pool = ThreadPoolExecutor(BURST_THREADS, thread_name_prefix=f"burst-{self.name}")
        # The kill this application carries out, if it is the victim's.
        self.kill_after_answers: int | None = None
        self.kill_in_burst: int | None = None
        self.arm_before_burst: str | None = None
        self.killed = threading.Event()
        self._answers = 0

    def fail(self, message: str) -> None:
        with self._lock:
            self.failures.append(f"seed {self.seed} {self.name}: {message}")

    # ------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        for target in (self._follow, self._wrap_all, self._consume):
            thread = threading.Thread(target=self._guarded(target), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _guarded(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except Exception as exc:
                if not self._stopping.is_set():
                    self.fail(f"{body.__name__} stopped: {type(exc).__name__}: {exc}")

        return run

    def release(self) -> None:
        self._release.set()

    def stop(self) -> None:
        self._stopping.set()
        self._release.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        for thread in self._threads:
            thread.join(PATIENCE_S)
            if thread.is_alive():
                self.fail("a thread did not stop")
        self._pool.shutdown(wait=True)

    # ---------------------------------------------------------------------- events

    def _follow(self) -> None:
        rng = random.Random(f"{self.seed}/{self.name}/follow")
        while not self._stopping.is_set():
            generation, stub = self.node.current()
            resume = [pb.EventPosition(channel_id=self.channel, seq=self.last)]
            request = pb.EventsRequest(channel_ids=[self.channel], resume=resume)
            reconnect_after = rng.randint(10, 80)  # reconnect on purpose, now and then
            ack_every = rng.randint(3, 25)
            seen = 0
            try:
                stream = stub.Events(request)
                self._stream = stream
                if self._stopping.is_set():
                    stream.cancel()
                    return
                for event in stream:
                    if event.HasField("subscribed"):
                        continue
                    self.process(event)
                    seen += 1
                    if seen % ack_every == 0:
                        self._ack(stub)
                    if seen >= reconnect_after:
                        stream.cancel()
                        break
            except grpc.RpcError as exc:
                if self._stopping.is_set():
                    return
                if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.CANCELLED:
                    continue  # ours
                if not self.node.crashed(generation, exc):
                    raise
            except ValueError as exc:  # a reaped life's channel
                if self._stopping.is_set() or not self.node.crashed(generation, exc):
                    raise

    def _ack(self, stub: pb_grpc.ReliabilityStub) -> None:
        """Acknowledge what was processed; a crash may cut it (the resume point acks)."""
        position = pb.EventPosition(channel_id=self.channel, seq=self.last)
        with contextlib.suppress(grpc.RpcError, ValueError):
            stub.AckEvents(pb.AckEventsRequest(acks=[position]), timeout=CALL_TIMEOUT_S)

    def process(self, event: pb.Event) -> None:
        """Check and record one event of the channel, in the order of its stream."""
        with self._lock:
            kind = event.WhichOneof("event")
            if event.channel_id != self.channel:
                self.fail(f"event for channel {event.channel_id!r}: {event}")
                return
            if event.seq <= self.last:
                self.fail(f"{kind} seq {event.seq} again after resuming from {self.last}")
                return
            expected = self.last + 1
            if kind == "events_discarded":
                gone = event.events_discarded
                self.out.discarded.append((gone.first_seq, gone.last_seq))
                if (gone.first_seq, gone.last_seq) != (expected, event.seq):
                    self.fail(f"discarded {gone.first_seq}..{gone.last_seq} after {self.last}")
            elif event.seq != expected:
                self.fail(f"events {expected}..{event.seq - 1} never reported (lost)")
            self.out.events[event.seq] = event
            self.last = event.seq
            if kind == "message_ready":
                self._ready(event.seq, event.message_ready)
            elif kind == "message_sent":
                self._settled(self.out.sent, event.seq, event.message_sent.message_id)
            elif kind == "send_failed":
                self._settled(self.out.failed, event.seq, event.send_failed.message_id)
        if kind == "transmit" and self.relay is not None:
            self.relay.carry(self.index, event.transmit.data)

    def _ready(self, seq: int, ready: pb.MessageReady) -> None:
        mid = ready.message_id
        self.out.ready[mid].append(seq)
        if mid not in self.payloads:
            self.fail(f"ready {mid!r} (seq {seq}), which nobody wrapped")
        elif mid in self.own:
            self.fail(f"our own {mid} ready (seq {seq})")
        elif ready.payload != self.payloads[mid]:
            self.fail(f"ready {mid} (seq {seq}) with another payload")
        elif ready.sender_id != self.senders[mid]:
            self.fail(f"ready {mid} (seq {seq}) from {ready.sender_id}")

    def _settled(self, table: defaultdict[str, list[int]], seq: int, mid: str) -> None:
        table[mid].append(seq)
        if mid not in self.own:
            self.fail(f"{mid} (seq {seq}) settled but is not ours")

    # ---------------------------------------------------------------------- wraps

    def _wrap_all(self) -> None:
        rng = random.Random(f"{self.seed}/{self.name}/wrap")
        pending = list(self.own.items())
        while pending and not self._stopping.is_set():
            size = 1 if rng.random() < 0.5 else rng.randint(2, 6)
            group, pending = pending[:size], pending[size:]
            if len(group) == 1:
                mid, payload = group[0]
                request = _wrap_request(self.channel, mid, payload)
                answer, cut = self.node.rpc("WrapOutgoingMessage", request)
                self._wrapped(group, [answer], cut)
            else:
                batch = pb.WrapOutgoingMessagesRequest(
                    messages=[_wrap_request(self.channel, m, p) for m, p in group]
                )
                answers, cut = self.node.rpc("WrapOutgoingMessages", batch)
                results = []
                for result in answers.results:
                    if not result.HasField("wrapped"):
                        self.fail(f"a wrap refused: {result.refused}")
                        return
                    results.append(result.wrapped)
                self._wrapped(group, results, cut)
            time.sleep(rng.uniform(0, 0.03))
        self.wrapping_done.set()

    def _wrapped(
        self,
        group: list[tuple[str, bytes]],
        answers: Sequence[pb.WrapOutgoingMessageResponse],
        cut: int,
    ) -> None:
        if len(answers) != len(group):
            self.fail(f"{len(answers)} wrap answers for {len(group)} wraps")
            return
        for (mid, payload), answer in zip(group, answers, strict=True):
            message = decode(answer.data)
            if (answer.message_id, message.message_id) != (mid, mid):
                self.fail(f"wrapped {mid} as {answer.message_id}/{message.message_id}")
            if (message.content, message.sender_id) != (payload, self.name):
                self.fail(f"wrapped {mid}: other content or sender in its bytes")
            if message.channel_id != self.channel:
                self.fail(f"wrapped {mid} on channel {message.channel_id}")
            with self._lock:
                if cut:
                    self.out.wraps_retried += 1
                    self.out.wraps_repeated += answer.repeated_wrap
                elif answer.repeated_wrap:
                    self.fail(f"the first wrap of {mid} answered repeated_wrap")
                self.out.wrapped[mid] = answer.data
                self.out.cut += cut
            assert self.relay is not None
            self.relay.carry(self.index, answer.data)

    def check_rewraps(self) -> None:
        """Every wrap answered so far, asked again: the same bytes, repeated_wrap."""
        with self._lock:
            done = list(self.out.wrapped.items())
        for start in range(0, len(done), 50):
            chunk = done[start : start + 50]
            batch = pb.WrapOutgoingMessagesRequest(
                messages=[_wrap_request(self.channel, m, self.own[m]) for m, _ in chunk]
            )
            answers, cut = self.node.rpc("WrapOutgoingMessages", batch)
            for (mid, data), result in zip(chunk, answers.results, strict=True):
                again = result.wrapped
                if not (result.HasField("wrapped") and again.repeated_wrap and again.data == data):
                    self.fail(f"wrap of {mid} asked again after the crash: {result}")
            with self._lock:
                self.out.rewraps += len(chunk)
                self.out.cut += cut

    # --------------------------------------------------------------------- unwraps

    def _consume(self) -> None:
        rng = random.Random(f"{self.seed}/{self.name}/unwrap")
        if self.hold_unwraps.is_set():
            self._release.wait()
            if self.arm_before_burst is not None and not self._stopping.is_set():
                self.node.rearm(self.arm_before_burst)
            items = self.inbox.take(BURST, 0)
            if self.kill_in_burst is not None:  # within the first half of the burst
                self.kill_in_burst = 1 + self.kill_in_burst % max(1, len(items) // 2)
            self.out.burst = len(items)
            if items:
                self._burst(items, rng)
        while not self._stopping.is_set():
            items = self.inbox.take(BURST, 0.05)
            if not items:
                continue
            if self.kill_after_answers is None and len(items) >= 8 and rng.random() < 0.5:
                self._burst(items, rng)
            else:
                self._unwrap_run(items, rng, singles=self.kill_after_answers is not None)

    def _burst(self, items: list[bytes], rng: random.Random) -> None:
        """``items`` unwrapped on 4 threads at once, each in calls of its own sizes."""
        slices = [items[i::BURST_THREADS] for i in range(BURST_THREADS)]
        seeds = [rng.randrange(1 << 30) for _ in slices]
        futures = [
            self._pool.submit(self._guarded(functools.partial(self._unwrap_part, part, seed)))
            for part, seed in zip(slices, seeds, strict=True)
        ]
        for future in futures:
            future.result()

    def _unwrap_part(self, items: list[bytes], seed: int) -> None:
        self._unwrap_run(items, random.Random(seed))

    def _unwrap_run(self, items: list[bytes], rng: random.Random, *, singles: bool = False) -> None:
        while items and not self._stopping.is_set():
            size = 1 if singles or rng.random() < 0.4 else rng.randint(2, 25)
            chunk, items = items[:size], items[size:]
            if len(chunk) == 1:
                request = pb.UnwrapReceivedMessageRequest(data=chunk[0])
                answer, cut = self.node.rpc("UnwrapReceivedMessage", request)
                self._unwrapped(chunk, [answer], cut)
            else:
                batch = pb.UnwrapReceivedMessagesRequest(
                    messages=[pb.UnwrapReceivedMessageRequest(data=d) for d in chunk]
                )
                answers, cut = self.node.rpc("UnwrapReceivedMessages", batch)
                results = []
                for result in answers.results:
                    if not result.HasField("unwrapped"):
                        self.fail(f"an unwrap refused: {result.refused}")
                        return
                    results.append(result.unwrapped)
                self._unwrapped(chunk, results, cut)

    def _unwrapped(
        self, chunk: list[bytes], answers: Sequence[pb.UnwrapReceivedMessageResponse], cut: int
    ) -> None:
        if len(answers) != len(chunk):
            self.fail(f"{len(answers)} unwrap answers for {len(chunk)} unwraps")
            return
        kill = False
        with self._lock:
            self.out.cut += cut
            self.out.unwraps_cut += cut
            for answer in answers:
                mid = answer.message_id
                if not answer.channel_open or answer.channel_id != self.channel:
                    self.fail(f"unwrap of {mid}: channel {answer.channel_id} not open")
                if answer.HasField("payload"):
                    self.out.fresh[mid] += 1
                    if answer.duplicate:
                        self.fail(f"unwrap of {mid}: a payload for a duplicate")
                    if self.out.fresh[mid] > 1:
                        self.fail(f"unwrap of {mid}: its payload answered again")
                    if answer.payload != self.payloads.get(mid) or mid in self.own:
                        self.fail(f"unwrap of {mid}: a payload nobody else wrapped under it")
            self._answers += len(answers)
            if not self.killed.is_set():
                if self.kill_after_answers is not None:
                    kill = self._answers >= self.kill_after_answers
                elif self.kill_in_burst is not None and self._release.is_set():
                    kill = self._answers >= self.kill_in_burst
                if kill:
                    self.killed.set()
        if kill:
            self.node.kill()

    # ----------------------------------------------------------------------- done

    def converged(self, others: Sequence[str]) -> bool:
        with self._lock:
            return (
                len(self.out.wrapped) == len(self.own)
                and all(mid in self.out.ready for mid in others)
                and all(m in self.out.sent or m in self.out.failed for m in self.own)
            )

    def drain(self) -> int:
        """Process every remaining event up to the server's last seq, then acknowledge;
        the number processed (the application's threads are stopped)."""
        stub = self.node.current()[1]
        infos = self.node.rpc("ListChannels", pb.ListChannelsRequest())[0].channels
        (info,) = [c for c in infos if c.channel_id == self.channel]
        done = 0
        if info.last_seq > self.last:
            resume = [pb.EventPosition(channel_id=self.channel, seq=self.last)]
            stream = stub.Events(
                pb.EventsRequest(channel_ids=[self.channel], resume=resume),
                timeout=CALL_TIMEOUT_S,
            )
            for event in stream:
                if event.HasField("subscribed"):
                    continue
                self.process(event)
                done += 1
                if event.seq >= info.last_seq:
                    stream.cancel()
                    break
        if self.last < info.last_seq:
            self.fail(f"events {self.last + 1}..{info.last_seq} never reported")
        self._ack(stub)
        return done


def _wrap_request(channel: str, mid: str, payload: bytes) -> pb.WrapOutgoingMessageRequest:
    return pb.WrapOutgoingMessageRequest(channel_id=channel, payload=payload, message_id=mid)


def run_seed(cluster: Cluster, seed: int, failures: list[str]) -> SeedRow:
    """One seed on the cluster's channel ``s<seed>``: traffic, one planned kill, checks;
    what went wrong goes to ``failures`` as it happens."""
    started = time.monotonic()
    rng = random.Random(f"{seed}/messages")
    channel = f"s{seed}"
    plan = plan_for(seed)
    own: list[dict[str, bytes]] = []
    for i, name in enumerate(NAMES):
        # Before a burst, the others send enough to fill one.
        many = plan.point in ("commit-unwrap", "mid-burst") and i != plan.victim
        count = rng.randint(*(BURST_MESSAGES if many else MESSAGES))
        own.append(
            {
                f"s{seed}-{name}-{k}": f"{seed}:{name}:{k}:".encode()
                + rng.randbytes(rng.randint(0, 400))
                for k in range(count)
            }
        )
    payloads = {mid: payload for mine in own for mid, payload in mine.items()}
    senders = {mid: name for name, mine in zip(NAMES, own, strict=True) for mid in mine}
    messages = len(payloads)
    apps = [
        App(i, node, seed, channel, own[i], senders, payloads, failures)
        for i, node in enumerate(cluster.nodes)
    ]
    relay = Relay(seed, apps)
    for app in apps:
        app.relay = relay
        app.node.rpc("OpenChannel", pb.OpenChannelRequest(channel_id=channel))
        group = pb.SetParticipantCountRequest(channel_id=channel, participants=len(NAMES))
        app.node.rpc("SetParticipantCount", group)
    victim = apps[plan.victim]
    node = victim.node
    deaths_before = node.deaths
    hits_before = len(node.hits)
    if plan.point in ("commit-unwrap", "mid-burst"):
        victim.hold_unwraps.set()
        if plan.point == "commit-unwrap":
            victim.arm_before_burst = plan.crash_at
        else:
            victim.kill_in_burst = plan.number
    elif plan.point == "after-unwrap-answer":
        victim.kill_after_answers = plan.number
    elif plan.crash_at is not None:
        node.rearm(plan.crash_at)
    for app in apps:
        app.start()

    others = [[m for j, mine in enumerate(own) if j != i for m in mine] for i in range(len(apps))]
    deadline = started + PATIENCE_S * 2
    fallback = False
    rewrapped = False
    killed_at = 0.0
    held_since: float | None = None
    try:
        while True:
            if held_since is None and all(
                a.wrapping_done.is_set() for a in apps if a is not victim
            ):
                held_since = time.monotonic()
            if (
                victim.hold_unwraps.is_set()
                and held_since is not None
                and (len(victim.inbox) >= BURST or time.monotonic() > held_since + HOLD_S)
            ):
                victim.release()  # the burst: what the others sent, and resends of it
            converged = all(a.converged(o) for a, o in zip(apps, others, strict=True))
            planned_done = _planned_kill_done(plan, node, deaths_before, hits_before, victim)
            if planned_done and not rewrapped:
                killed_at = time.monotonic() - started
                victim.check_rewraps()  # what was answered before the crash, asked again
                rewrapped = True
            if converged and planned_done and rewrapped:
                break
            if converged and not planned_done and not fallback and node.armed is not None:
                # The armed point was not reached (never expected): kill it from outside.
                fallback = True
                failures.append(f"seed {seed}: {plan.crash_at} never reached; killed instead")
                node.kill()
            if failures and any("stopped" in f for f in failures):
                break
            if time.monotonic() > deadline:
                failures.append(f"seed {seed}: no convergence; {_progress(apps, others)}")
                break
            time.sleep(0.05)
    finally:
        for app in apps:
            app.stop()
    if not any("no convergence" in f or "stopped" in f for f in failures):
        for app in apps:
            app.drain()
            _final_checks(app)
    events_checked = sum(len(a.out.events) for a in apps)
    for app in apps:
        app.node.rpc("CloseChannel", pb.CloseChannelRequest(channel_id=channel))
    for each in cluster.nodes:
        failures.extend(f"seed {seed}: {u}" for u in each.unexpected)
        each.unexpected.clear()

    lost = sum(len(set(o) - set(a.out.ready)) for a, o in zip(apps, others, strict=True))
    lost += sum(1 for f in failures if "never reported" in f)
    duplicated = sum(
        sum(len(s) - 1 for s in table.values())
        for a in apps
        for table in (a.out.ready, a.out.sent, a.out.failed)
    )
    duplicated += sum(max(0, n - 1) for a in apps for n in a.out.fresh.values())
    duplicated += sum(1 for f in failures if "again after resuming" in f)
    return SeedRow(
        seed=seed,
        victim=victim.name,
        kill_point=plan.point,
        crash_at=plan.crash_at or f"outside after answer {plan.number}",
        hit=_planned_kill_done(plan, node, deaths_before, hits_before, victim) and not fallback,
        kills=node.deaths - deaths_before,
        calls_cut=sum(a.out.cut for a in apps),
        unwraps_cut=sum(a.out.unwraps_cut for a in apps),
        burst=victim.out.burst,
        wraps_retried=sum(a.out.wraps_retried for a in apps),
        wraps_repeated=sum(a.out.wraps_repeated for a in apps),
        rewraps_checked=sum(a.out.rewraps for a in apps),
        messages=messages,
        events_checked=events_checked,
        ready=sum(len(a.out.ready) for a in apps),
        sent=sum(len(a.out.sent) for a in apps),
        send_failed=sum(len(a.out.failed) for a in apps),
        discarded=sum(len(a.out.discarded) for a in apps),
        lost=lost,
        duplicated=duplicated,
        relay_dropped=relay.dropped,
        seconds=round(time.monotonic() - started, 2),
        killed_at_s=round(killed_at, 2),
        failures=failures,
    )


def _planned_kill_done(plan: Plan, node: Node, deaths: int, hits: int, victim: App) -> bool:
    """The planned kill happened and its restart serves."""
    if plan.crash_at is not None:
        return len(node.hits) > hits and node.armed is None
    return victim.killed.is_set() and node.deaths > deaths and node.server.alive()


def _final_checks(app: App) -> None:
    out = app.out
    for table, what in ((out.ready, "ready"), (out.sent, "sent"), (out.failed, "failed")):
        for mid, seqs in table.items():
            if len(seqs) > 1:
                app.fail(f"{mid} {what} under seqs {seqs}")
    for mid in app.own:
        if mid in out.sent and mid in out.failed:
            app.fail(f"{mid} both sent and failed")
    listed = pb.ListUnacknowledgedRequest(channel_id=app.channel)
    left = app.node.rpc("ListUnacknowledged", listed)[0].messages
    if left:
        app.fail(f"still unacknowledged on the server: {[m.message_id for m in left]}")
    waiting = app.node.rpc("ListWaiting", pb.ListWaitingRequest(channel_id=app.channel))[0].messages
    if waiting:
        app.fail(f"still waiting on the server: {[m.message_id for m in waiting]}")


def _progress(apps: Sequence[App], others: Sequence[list[str]]) -> str:
    parts = []
    for app, expected in zip(apps, others, strict=True):
        with app._lock:
            missing = [m for m in expected if m not in app.out.ready]
            unsettled = [m for m in app.own if m not in app.out.sent and m not in app.out.failed]
            parts.append(
                f"{app.name}: wrapped {len(app.out.wrapped)}/{len(app.own)}, missing"
                f" {missing[:5]} ({len(missing)}), unsettled {unsettled[:5]}"
                f" ({len(unsettled)}), last seq {app.last}, inbox {len(app.inbox)}"
            )
    return "; ".join(parts)


def run_lane(root: Path, seeds: Sequence[int]) -> list[SeedRow]:
    """The seeds one after another on one cluster of three servers."""
    cluster = Cluster(root)
    rows = []
    try:
        for seed in seeds:
            failures: list[str] = []
            try:
                rows.append(run_seed(cluster, seed, failures))
            except Exception:
                rows.append(_broken_row(seed, [*failures, traceback.format_exc()]))
    finally:
        cluster.close()
    problems = [p for node in cluster.nodes for p in node.stderr_problems()]
    if problems and rows:
        rows[-1].failures.extend(problems)
    failed = [row for row in rows if row.failures]
    if failed:  # what the servers said, for the report
        failed[-1].failures.extend(node.log_tail() for node in cluster.nodes)
    return rows


def _broken_row(seed: int, failures: list[str]) -> SeedRow:
    """The row of a seed the harness could not finish."""
    plan = plan_for(seed)
    return SeedRow(seed, NAMES[plan.victim], plan.point, "", False, failures=failures)


def run_seeds(root: Path, seeds: Sequence[int], lanes: int = 2) -> list[SeedRow]:
    """The seeds on ``lanes`` clusters side by side (the servers mostly wait on their
    timers, so two clusters take little more time than one), one after another on each."""
    parts = [list(seeds[i::lanes]) for i in range(lanes)]
    with ThreadPoolExecutor(lanes, thread_name_prefix="lane") as pool:
        futures = [pool.submit(run_lane, root / f"lane{i}", p) for i, p in enumerate(parts) if p]
        rows = [row for future in futures for row in future.result()]
    return sorted(rows, key=lambda row: row.seed)


# ------------------------------------------------------------------------------- report

COLUMNS = (
    ("seed", "seed"),
    ("victim", "victim"),
    ("kill_point", "kill point"),
    ("crash_at", "crash at"),
    ("hit", "hit"),
    ("kills", "kills"),
    ("calls_cut", "cut"),
    ("unwraps_cut", "unwraps cut"),
    ("burst", "burst"),
    ("wraps_retried", "wrap retries"),
    ("rewraps_checked", "rewraps"),
    ("messages", "msgs"),
    ("events_checked", "events"),
    ("ready", "ready"),
    ("sent", "sent"),
    ("send_failed", "failed"),
    ("discarded", "discarded"),
    ("lost", "lost"),
    ("duplicated", "dup"),
    ("killed_at_s", "kill s"),
    ("seconds", "s"),
)


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    points = Counter(r["kill_point"] for r in rows if r["hit"])
    return {
        "seeds": len(rows),
        "kill_points_hit": dict(sorted(points.items())),
        "kills": sum(r["kills"] for r in rows),
        "calls_cut": sum(r["calls_cut"] for r in rows),
        "wraps_retried": sum(r["wraps_retried"] for r in rows),
        "rewraps_checked": sum(r["rewraps_checked"] for r in rows),
        "messages": sum(r["messages"] for r in rows),
        "events_checked": sum(r["events_checked"] for r in rows),
        "send_failed": sum(r["send_failed"] for r in rows),
        "discarded": sum(r["discarded"] for r in rows),
        "lost": sum(r["lost"] for r in rows),
        "duplicated": sum(r["duplicated"] for r in rows),
        "failures": sum(len(r["failures"]) for r in rows),
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows and their summary as text."""
    cells = [[title for _, title in COLUMNS]]
    cells += [[str(row[key]) for key, _ in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    total = summary(rows)
    lines.append(
        f"{total['seeds']} seeds, kill points hit {total['kill_points_hit']}, kills"
        f" {total['kills']}, calls cut {total['calls_cut']}, events checked"
        f" {total['events_checked']}, lost {total['lost']}, duplicated {total['duplicated']},"
        f" send failed {total['send_failed']}, discarded {total['discarded']}"
    )
    return "\n".join(lines)


def as_dicts(rows: Sequence[SeedRow]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]


def by_kill_point(rows: Sequence[dict[str, Any]]) -> str:
    """The run's table: one line per kill point, and the total."""
    head = ("kill point", "seeds", "hit", "kills", "calls cut", "events checked", "lost", "dup")
    groups: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["kill_point"]].append(row)
    cells = [list(head)]
    for point, group in [*sorted(groups.items()), ("total", list(rows))]:
        cells.append(
            [
                point,
                str(len(group)),
                str(sum(r["hit"] for r in group)),
                str(sum(r["kills"] for r in group)),
                str(sum(r["calls_cut"] for r in group)),
                str(sum(r["events_checked"] for r in group)),
                str(sum(r["lost"] for r in group)),
                str(sum(r["duplicated"] for r in group)),
            ]
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells
    )
