"""Fuzz the SDS decoder and MessageChannel.receive with a seeded random mutation loop.

The same properties as ``tests/wire/test_fuzz.py`` (a) and (b), for as many cases as you
like and without hypothesis' per-example overhead:

* ``sdsync.wire.decode`` on arbitrary bytes, on mutated real and generated encodings, on
  protobuf written field by field (wrong wire types, overlong varints, wrong and huge
  lengths, nested groups, invalid UTF-8) and on deeply nested unknown groups: only
  ``RemoteProtocolError`` may escape, and the verdict and the decoded message must match
  the plain ``SdsMessage`` schema parsed by the stock protobuf runtime (the one known
  divergence, one more level of nesting inside a history entry, is tolerated);
* ``MessageChannel.receive`` on all of the above: only ``RemoteProtocolError`` may escape,
  a rejected input leaves the channel's observable state unchanged, and an accepted one
  leaves the log strictly ordered by (Lamport timestamp, id);
* the reconciliation decoders (``tests/reconcile/test_reconcile_fuzz.py``'s properties, from
  ``sdsync.testing.reconcile_fuzz``): RBSR and Prolly frames generated from scratch or mutated
  from real conversations, fed to the session that was about to receive the real frame
  (only ``RemoteProtocolError``; a rejected frame changes nothing; work per frame, counted
  by the store, within the documented bound; one case in 16 also continues the
  conversation to its end), and Store Sync message batches (``decode_batch`` against a
  decoder written from the batch format).

The reconciliation targets share ``--reconcile-examples`` cases (default: ten times
``--examples``, so ``make fuzz`` runs a million of them).

Every case is derived from ``--seed`` and its index, so a failure is reproducible with
``--seed S --only TARGET --start I --examples 1`` (``--reconcile-examples 1`` for the
reconciliation targets). The exit status is 1 if any other exception escaped or any
property failed.

Usage::

    .venv/bin/python bench/fuzz_decoders.py --examples 100000 [--seed 0] [--only decode/...]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sdsync.core.bloom import BloomParams
from sdsync.core.channel import MessageChannel
from sdsync.core.config import ChannelConfig, RepairConfig
from sdsync.errors import RemoteProtocolError
from sdsync.testing import reconcile_fuzz as fuzz
from sdsync.testing import sync_fuzz as batch_fuzz
from sdsync.testing.oracle import (
    ENTRY_FIELDS,
    INVALID_UTF8,
    SDS_FIELDS,
    key,
    reference_decode,
    varint,
)
from sdsync.wire import (
    HistoryEntry,
    Message,
    MessageKind,
    decode,
    encode,
)

CHANNEL = "fuzz-channel"
NOW = 1_700_000_000_000
SMALL = ChannelConfig(
    causal_history_size=3,
    bloom=BloomParams(capacity=64, error_rate=0.001),
    repair=RepairConfig(t_min_ms=1_000, t_max_ms=5_000),
)

# ------------------------------------------------------------------------ generators


WIRE_TYPES = {1: 2, 2: 2, 3: 2, 10: 0, 11: 2, 12: 2, 13: 2, 20: 2}
ALPHABET = "abcdef0123456789-_é\u4e2d\U0001f600"


def text(rng: random.Random, max_len: int = 12) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(max_len + 1)))


def random_entry(rng: random.Random) -> HistoryEntry:
    hint = rng.randbytes(rng.randrange(40)) if rng.random() < 0.5 else None
    return HistoryEntry(text(rng) or "x", hint, text(rng) if rng.random() < 0.5 else None)


def random_message(rng: random.Random) -> Message:
    kind = rng.choice(list(MessageKind))
    lamport = (
        None
        if kind is MessageKind.EPHEMERAL
        else rng.choice([0, 1, NOW, rng.randrange(2**63), 2**63 - 1])
    )
    if kind is MessageKind.SYNC:
        content = rng.choice([None, b""])
    else:
        content = rng.randbytes(1 + rng.randrange(40))
    return Message(
        sender_id=text(rng),
        message_id=text(rng) or "m",
        channel_id=rng.choice([CHANNEL, text(rng)]),
        lamport_timestamp=lamport,
        causal_history=tuple(random_entry(rng) for _ in range(rng.randrange(8))),
        bloom_filter=rng.choice([None, b"", rng.randbytes(rng.randrange(1, 200))]),
        content=content,
        repair_request=tuple(random_entry(rng) for _ in range(rng.choice([0, 0, 1, 3]))),
    )


def real_corpus() -> list[bytes]:
    """Encodings produced by real channels: content, sync with SDS-R requests, ephemeral."""
    a = MessageChannel(CHANNEL, "alice", now_ms=NOW, config=SMALL)
    b = MessageChannel(CHANNEL, "bob", now_ms=NOW, config=SMALL)
    c = MessageChannel(CHANNEL, "carol", now_ms=NOW, config=SMALL)
    first = a.send(b"first", NOW + 1)
    b.receive(first.data, NOW + 2)
    second = b.send(b"second", NOW + 3)
    c.receive(second.data, NOW + 4)
    sync = c.send_sync(NOW + 10_000)
    assert sync is not None
    b.receive(sync.data, NOW + 10_001)
    third = b.send(b"third " * 8, NOW + 10_002)
    default = MessageChannel(CHANNEL, "dave", now_ms=NOW)
    return [
        first.data,
        second.data,
        sync.data,
        third.data,
        a.send_ephemeral(b"ephemeral").data,
        default.send(b"default-size bloom", NOW + 1).data,
    ]


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            out += rng.randbytes(rng.randint(1, 8))
            continue
        # Half the mutations hit the header: flipping bloom bits only makes other blooms.
        at = rng.randrange(len(out) if rng.random() < 0.5 else min(len(out), 48))
        op = rng.randrange(6)
        if op == 0:
            out[at] ^= 1 << rng.randrange(8)
        elif op == 1:
            out[at] = rng.choice([0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op == 2:
            del out[at:]
        elif op == 3:
            out[at:at] = rng.randbytes(rng.randint(1, 12))
        elif op == 4:
            del out[at : at + rng.randint(1, 8)]
        else:
            out[at:at] = out[at : at + rng.randint(1, 16)]
    return bytes(out)


def raw_field(rng: random.Random, fields: tuple[int, ...], depth: int) -> bytes:
    number = rng.choice(fields) if rng.random() < 0.8 else rng.randrange(1 << 29)
    if number in WIRE_TYPES and rng.random() < 0.7:
        wire_type = WIRE_TYPES[number]  # mostly well-typed, so that some cases parse
    else:
        wire_type = rng.choice((0, 2, 2, 2, 0, 1, 5, 3, 4, 6, 7))
    head = key(number, wire_type)
    if wire_type == 0:
        value = rng.choice([rng.randrange(2**64), rng.randrange(2**64, 2**80), 0, 2**63])
        body = varint(value)
        if rng.random() < 0.1:  # overlong encoding
            body = body[:-1] + bytes([body[-1] | 0x80]) + b"\x80" * rng.randrange(10) + b"\0"
        return head + body
    if wire_type == 1:
        return head + rng.randbytes(8)
    if wire_type == 5:
        return head + rng.randbytes(4)
    if wire_type == 2:
        if depth < 2 and number in (11, 13) and rng.random() < 0.7:
            payload = raw_message(rng, ENTRY_FIELDS, depth + 1)
        else:
            choice = rng.randrange(4)
            if choice == 0:
                payload = rng.randbytes(rng.randrange(40))
            elif choice == 1:
                payload = text(rng).encode()
            elif choice == 2:
                payload = rng.choice(INVALID_UTF8)
            else:
                payload = rng.randbytes(1) * rng.randint(64, 300)
        roll = rng.random()
        if roll < 0.85:
            length = len(payload)
        elif roll < 0.9:
            length = rng.randrange(len(payload) + 9)
        else:
            length = rng.choice([2**31, 2**32 + 1, 2**63, 2**64 - 1])
        return head + varint(length) + payload
    if wire_type == 3:
        inner = raw_message(rng, fields, depth + 1) if depth < 3 else b""
        end = rng.randrange(3)
        if end == 0:
            return head + inner + key(number, 4)
        if end == 1:
            return head + inner + key(number + 1, 4)
        return head + inner
    return head + rng.randbytes(rng.randrange(5))


def raw_message(rng: random.Random, fields: tuple[int, ...] = SDS_FIELDS, depth: int = 0) -> bytes:
    count = rng.randrange(9 if depth == 0 else 4)
    data = b"".join(raw_field(rng, fields, depth) for _ in range(count))
    if depth == 0 and rng.random() < 0.5:  # a valid skeleton: an id and a timestamp
        skeleton = key(2, 2) + varint(2) + b"id" + key(10, 0) + varint(rng.randrange(2**40))
        data = skeleton + data if rng.random() < 0.5 else data + skeleton
    if depth == 0 and data and rng.random() < 0.15:
        data = data[: rng.randrange(len(data))]
    return data


def deep_groups(rng: random.Random, corpus: list[bytes]) -> bytes:
    depth = rng.choice([rng.randint(1, 150), 63, 64, 65, 99, 100, 101])
    number = rng.choice([1, 4, 11, 99])
    groups = key(number, 3) * depth + key(number, 4) * depth
    valid = rng.choice(corpus)
    where = rng.randrange(3)
    if where == 0:
        entry = key(1, 2) + varint(1) + b"h" + groups
        return valid + key(11, 2) + varint(len(entry)) + entry
    return groups + valid if where == 1 else valid + groups


def arbitrary(rng: random.Random) -> bytes:
    size = rng.choice([rng.randrange(16), rng.randrange(128), rng.randrange(1024)])
    if rng.random() < 0.3:  # protobuf-ish bytes: small tags and lengths
        return bytes(
            rng.choice(b"\x00\x01\x02\x08\x0a\x12\x1a\x50\x5a\x62\x6a\xa2\x01\xff")
            for _ in range(size)
        )
    return rng.randbytes(size)


# ---------------------------------------------------------------------------- targets


@dataclass
class Tally:
    cases: int = 0
    accepted: int = 0
    rejected: int = 0  # RemoteProtocolError
    failures: int = 0  # any other exception, or a property violated
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)

    def fail(self, index: int, data: bytes, why: str) -> None:
        self.failures += 1
        if len(self.examples) < 5:
            shown = data.hex() if len(data) <= 256 else data[:256].hex() + "..."
            self.examples.append(f"case {index} ({len(data)} bytes): {why}\n    input: {shown}")


def check_decode(data: bytes, tally: Tally, index: int) -> None:
    try:
        got: Message | None = decode(data)
    except RemoteProtocolError:
        got = None
    except Exception:  # the property: nothing else may escape
        tally.fail(index, data, "decode raised " + traceback.format_exc(limit=3))
        return
    if got is None:
        tally.rejected += 1
    else:
        tally.accepted += 1
    try:
        ref = reference_decode(data)
    except Exception:
        tally.fail(index, data, "reference decoder raised " + traceback.format_exc(limit=3))
        return
    if got != ref:
        tally.fail(index, data, f"decode gave {got!r}, the plain schema {ref!r}")
    elif got is not None:
        try:
            again = decode(encode(got))
        except Exception:
            tally.fail(index, data, "re-encoding failed " + traceback.format_exc(limit=3))
            return
        if again != got:
            tally.fail(index, data, "decode(encode(m)) != m")


def snapshot(chan: MessageChannel) -> tuple[Any, ...]:
    return (
        chan.lamport_timestamp,
        chan.log_ids(),
        chan.incoming_ids(),
        chan.outgoing_ids(),
        chan.bloom_bytes(),
        chan.missing_ids(),
        chan.next_repair_request_due(),
        chan.next_repair_response_due(),
    )


def make_scene() -> MessageChannel:
    """A channel with entries in its log, outgoing buffer and incoming buffer."""
    chan = MessageChannel(CHANNEL, "me", now_ms=NOW, config=SMALL)
    alice = MessageChannel(CHANNEL, "alice", now_ms=NOW, config=SMALL)
    bob = MessageChannel(CHANNEL, "bob", now_ms=NOW, config=SMALL)
    a1 = alice.send(b"alice one", NOW + 1)
    chan.receive(a1.data, NOW + 2)
    chan.send(b"mine one", NOW + 3)
    chan.send(b"mine two", NOW + 4)
    bob.send(b"bob one", NOW + 5)
    bob.receive(a1.data, NOW + 6)
    chan.receive(bob.send(b"bob two", NOW + 7).data, NOW + 8)
    return chan


class ReceiveTarget:
    """Feeds every input to a channel; a fresh channel every 200 cases."""

    def __init__(self) -> None:
        self.chan = make_scene()
        self.fed = 0

    def check(self, data: bytes, tally: Tally, index: int) -> None:
        if self.fed >= 200:
            self.chan, self.fed = make_scene(), 0
        self.fed += 1
        chan = self.chan
        before = snapshot(chan)
        try:
            chan.receive(data, NOW + 100 + self.fed)
        except RemoteProtocolError:
            tally.rejected += 1
            if snapshot(chan) != before:
                tally.fail(index, data, "a rejected input changed the channel")
            return
        except Exception:
            tally.fail(index, data, "receive raised " + traceback.format_exc(limit=3))
            self.chan, self.fed = make_scene(), 0
            return
        tally.accepted += 1
        keys = [(e.lamport_timestamp, e.message_id) for e in chan.log]
        if not all(a < b for a, b in itertools.pairwise(keys)):
            tally.fail(index, data, "log out of (lamport, id) order after an accepted input")


def generators(corpus: list[bytes]) -> dict[str, Callable[[random.Random], bytes]]:
    return {
        "arbitrary": arbitrary,
        "mutated": lambda rng: mutate(
            rng, rng.choice(corpus) if rng.random() < 0.5 else encode(random_message(rng))
        ),
        "protobuf": raw_message,
        "nested": lambda rng: deep_groups(rng, corpus),
    }


# ------------------------------------------------------------- reconciliation decoders

FOLLOW_EVERY = 16
"""One frame case in this many continues the conversation to its end."""


class Reconcile:
    """The reconciliation targets: conversations, batches, and how to make each case."""

    def __init__(self) -> None:
        self.conversations = fuzz.conversations()
        self.harness = fuzz.Harness(self.conversations)
        self.donors = [t.frame for c in self.conversations for t in c.turns]
        self.by_method = {
            method: [i for i, c in enumerate(self.conversations) if c.scene.method == method]
            for method in ("rbsr", "prolly")
        }
        self.batches = batch_fuzz.batch_corpus()

    def check(self, target: str, rng: random.Random, tally: Tally, index: int) -> None:
        kind, name = target.split("/")
        if kind == "batch":
            corpus = self.batches
            if name == "scratch":
                data = batch_fuzz.random_batch(rng, corpus)
            else:
                base = rng.choice(corpus.batches)
                data = fuzz.mutate("batch", base, fuzz.random_mutations(rng, corpus.entries))
            out = batch_fuzz.check_batch(data, corpus.expected)
        else:
            conv = rng.choice(self.by_method[kind])
            c = self.conversations[conv]
            turn = rng.randrange(len(c.turns))
            if name == "mutated":
                ops = fuzz.random_mutations(rng, self.donors)
                data = fuzz.mutate(kind, c.turns[turn].frame, ops, first=turn == 0)
            elif kind == "rbsr":
                data = fuzz.random_rbsr_frame(rng, first=turn == 0)
            else:
                data = fuzz.random_prolly_frame(rng)
            follow = index % FOLLOW_EVERY == 0
            out = self.harness.check(conv, turn, data, follow=follow)
        if out.accepted:
            tally.accepted += 1
        else:
            tally.rejected += 1
        if out.failures:
            tally.fail(index, data, "; ".join(out.failures[:3]))


RECONCILE_TARGETS = (
    "rbsr/scratch",
    "rbsr/mutated",
    "prolly/scratch",
    "prolly/mutated",
    "batch/scratch",
    "batch/mutated",
)


def run_reconcile(
    total: int, seed: int, only: str | None, start: int, tallies: dict[str, Tally]
) -> None:
    targets = [t for t in RECONCILE_TARGETS if only is None or t == only]
    if not targets or total <= 0:
        return
    reconcile = Reconcile()
    per_target = -(-total // len(targets))
    for target in targets:
        tally = tallies[target] = Tally()
        began = time.perf_counter()
        for index in range(start, start + per_target):
            rng = random.Random(f"{seed}/{target}/{index}")
            tally.cases += 1
            reconcile.check(target, rng, tally, index)
        tally.seconds = time.perf_counter() - began


def run(examples: int, seed: int, only: str | None, start: int) -> dict[str, Tally]:
    corpus = real_corpus()
    corpus_rng = random.Random(f"{seed}/corpus")
    corpus += [encode(random_message(corpus_rng)) for _ in range(200)]
    gens = generators(corpus)
    tallies: dict[str, Tally] = {}
    receive = ReceiveTarget()
    for target in [f"decode/{name}" for name in gens] + [f"receive/{name}" for name in gens]:
        if only is not None and target != only:
            continue
        kind, name = target.split("/")
        tally = tallies[target] = Tally()
        gen = gens[name]
        began = time.perf_counter()
        for index in range(start, start + examples):
            rng = random.Random(f"{seed}/{name}/{index}")
            data = gen(rng)
            tally.cases += 1
            if kind == "decode":
                check_decode(data, tally, index)
            else:
                receive.check(data, tally, index)
        tally.seconds = time.perf_counter() - began
    return tallies


def report(tallies: dict[str, Tally], examples: int, seed: int, elapsed: float) -> int:
    print(f"sdsync decoder fuzz: {examples} cases per SDS target, seed {seed}")
    header = f"{'target':<20}{'cases':>10}{'accepted':>10}{'rejected':>10}{'failed':>8}"
    print(header + f"{'seconds':>9}{'cases/s':>10}")
    print("-" * (len(header) + 19))
    for target, t in tallies.items():
        rate = t.cases / t.seconds if t.seconds else 0.0
        print(
            f"{target:<20}{t.cases:>10}{t.accepted:>10}{t.rejected:>10}{t.failures:>8}"
            f"{t.seconds:>9.1f}{rate:>10.0f}"
        )
    total = sum(t.cases for t in tallies.values())
    rejected = sum(t.rejected for t in tallies.values())
    failures = sum(t.failures for t in tallies.values())
    print("-" * (len(header) + 19))
    print(
        f"{'total':<20}{total:>10}{sum(t.accepted for t in tallies.values()):>10}"
        f"{rejected:>10}{failures:>8}{elapsed:>9.1f}"
    )
    print(f"{total} cases ran, {rejected} raised RemoteProtocolError, {failures} failed")
    ran = [t for name, t in tallies.items() if name in RECONCILE_TARGETS]
    if ran:
        cases, seconds = sum(t.cases for t in ran), sum(t.seconds for t in ran)
        rate = cases / seconds if seconds else 0.0
        print(f"reconciliation decoders: {cases} cases in {seconds:.1f} s, {rate:.0f} cases/s")
    for target, t in tallies.items():
        for line in t.examples:
            print(f"FAIL {target} {line}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="cases per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="run one target, e.g. decode/mutated")
    parser.add_argument("--start", type=int, default=0, help="first case index")
    parser.add_argument(
        "--reconcile-examples",
        type=int,
        help="cases over all reconciliation targets (default: 10 x --examples)",
    )
    args = parser.parse_args(argv)
    # Hostile bloom filters are logged as warnings; a flood of them is expected here.
    logging.getLogger("sdsync").setLevel(logging.ERROR)
    began = time.perf_counter()
    tallies = run(args.examples, args.seed, args.only, args.start)
    reconcile = 10 * args.examples if args.reconcile_examples is None else args.reconcile_examples
    run_reconcile(reconcile, args.seed, args.only, args.start, tallies)
    if not tallies:
        parser.error(f"no target named {args.only!r}")
    return report(tallies, args.examples, args.seed, time.perf_counter() - began)


if __name__ == "__main__":
    sys.exit(main())
