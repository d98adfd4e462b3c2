"""Ground truth, metrics, the event table and the invariant checks of one simulation.

The recorder sees every publish, transmission, arrival and engine event. It keeps what the
participants cannot know — who really holds what, and when — and judges the run:

* every content message is in every participant's log, unless it was reported
  irretrievably lost (then the summary counts it and says so);
* all logs of a channel are identical and in (Lamport timestamp, message id) order;
* no participant gets a message delivered twice;
* causal order: a message is delivered only after everything in its causal history was
  delivered (or reported lost) at that participant;
* false acknowledgements: a bloom filter "acknowledged" a message its sender never had.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sdsync.core import (
    Event,
    MessageAcknowledged,
    MessageDelivered,
    MessageDropped,
    MessageLost,
    MessagePossiblyAcknowledged,
)
from sdsync.sim.config import SimConfig
from sdsync.wire import Message

if TYPE_CHECKING:
    from sdsync.runtime import Step, Transmit
    from sdsync.sim.engine import Simulation

EVENT_COLUMNS = ("time_ms", "participant", "channel", "message_id", "kind", "bytes")


@dataclass(slots=True)
class _Truth:
    sender: int
    sent_ms: int
    history: tuple[str, ...]
    delivered: int = 0
    last_delivery_ms: int = 0


@dataclass
class Verdict:
    identical_logs: bool = True
    causal_order_ok: bool = True
    ordered_logs: bool = True
    duplicates: int = 0
    missing_pairs: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.identical_logs
            and self.causal_order_ok
            and self.ordered_logs
            and self.duplicates == 0
            and self.missing_pairs == 0
        )


class Recorder:
    def __init__(self, config: SimConfig, record_events: bool) -> None:
        self.config = config
        self.record_events = record_events
        self.started = time.perf_counter()
        self.columns: dict[str, list[Any]] = {name: [] for name in EVENT_COLUMNS}
        self.sent_per_channel = [0] * config.channels
        self.truth: dict[tuple[int, str], _Truth] = {}
        n = config.participants
        self.have: list[list[set[str]]] = [
            [set() for _ in range(config.channels)] for _ in range(n)
        ]
        self.got: list[list[set[str]]] = [[set() for _ in range(config.channels)] for _ in range(n)]
        self.lost: list[list[set[str]]] = [
            [set() for _ in range(config.channels)] for _ in range(n)
        ]
        self.counts: dict[str, int] = defaultdict(int)
        self.receive_events = 0
        self.copies = 0
        self.bytes_on_wire = 0
        self.store_queries = 0
        self.false_acks = 0
        self.duplicates = 0
        self.causal_violations = 0
        self.verdict = Verdict()
        self.logs: list[list[list[tuple[int, str]]]] = []
        self.wall_seconds = 0.0
        self.end_ms = 0

    def _row(
        self, now: int, participant: int, channel: int, mid: str, kind: str, size: int
    ) -> None:
        self.counts[kind] += 1
        if self.record_events:
            cols = self.columns
            cols["time_ms"].append(now)
            cols["participant"].append(participant)
            cols["channel"].append(channel)
            cols["message_id"].append(mid)
            cols["kind"].append(kind)
            cols["bytes"].append(size)

    # -------------------------------------------------------------- observing

    def published(self, participant: int, channel: int, step: Step, now: int) -> None:
        for action in step.actions:
            message_id = action.message_id  # type: ignore[union-attr]
            self.sent_per_channel[channel] += 1
            self.have[participant][channel].add(message_id)
            self.got[participant][channel].add(message_id)

    def transmitted(self, participant: int, channel: int, action: Transmit, now: int) -> None:
        if action.kind == "content":
            message = _decoded_history(action.data)
            self.truth[(channel, action.message_id)] = _Truth(participant, now, message)
        kind = "send" if action.kind == "content" else action.kind
        self._row(now, participant, channel, action.message_id, kind, len(action.data))

    def received(
        self,
        participant: int,
        channel: int,
        message: Message,
        size: int,
        now: int,
        *,
        store: bool = False,
    ) -> None:
        if message.content and message.lamport_timestamp is not None:
            self.got[participant][channel].add(message.message_id)
        kind = "store_receive" if store else "receive"
        self._row(now, participant, channel, message.message_id, kind, size)

    def events(self, participant: int, channel: int, events: list[Event], now: int) -> None:
        for event in events:
            if isinstance(event, MessageDelivered):
                self._delivered(participant, channel, event.message_id, now)
            elif isinstance(event, MessageAcknowledged | MessagePossiblyAcknowledged):
                by_bloom = not getattr(event, "by_causal_history", False)
                acker = int(event.acker_id[1:])
                if by_bloom and event.message_id not in self.got[acker][channel]:
                    self.false_acks += 1
                kind = "ack" if isinstance(event, MessageAcknowledged) else "possibly_ack"
                self._row(now, participant, channel, event.message_id, kind, 0)
            elif isinstance(event, MessageLost):
                self.lost[participant][channel].add(event.message_id)
                self._row(now, participant, channel, event.message_id, "lost", 0)
            elif isinstance(event, MessageDropped):
                self._row(now, participant, channel, event.message_id, "drop", 0)

    def _delivered(self, participant: int, channel: int, message_id: str, now: int) -> None:
        have = self.have[participant][channel]
        if message_id in have:
            self.duplicates += 1
        truth = self.truth.get((channel, message_id))
        if truth is not None:
            lost = self.lost[participant][channel]
            if any(dep not in have and dep not in lost for dep in truth.history):
                self.causal_violations += 1
            truth.delivered += 1
            truth.last_delivery_ms = now
        have.add(message_id)
        self._row(now, participant, channel, message_id, "deliver", 0)

    def churned(self, participant: int, online: bool, now: int) -> None:
        self._row(now, participant, -1, "", "online" if online else "offline", 0)

    # ------------------------------------------------------------------ judge

    def finish(self, sim: Simulation) -> None:
        self.wall_seconds = time.perf_counter() - self.started
        self.end_ms = sim.now
        verdict = Verdict(duplicates=self.duplicates)
        verdict.causal_order_ok = self.causal_violations == 0
        if self.causal_violations:
            verdict.problems.append(f"{self.causal_violations} deliveries before a dependency")
        if self.duplicates:
            verdict.problems.append(f"{self.duplicates} duplicate deliveries")
        self.logs = [
            [
                [(e.lamport_timestamp, e.message_id) for e in driver.channel.log]
                for driver in p.drivers
            ]
            for p in sim.participants
        ]
        for c in range(self.config.channels):
            expected = {mid for (ch, mid) in self.truth if ch == c}
            reference = self.logs[0][c]
            for index, logs in enumerate(self.logs):
                log = logs[c]
                if log != sorted(log):
                    verdict.ordered_logs = False
                    verdict.problems.append(f"p{index} channel {c}: log out of order")
                if log != reference:
                    verdict.identical_logs = False
                lost = self.lost[index][c]
                verdict.missing_pairs += len(expected - {mid for _, mid in log} - lost)
        if not verdict.identical_logs:
            verdict.problems.append("logs differ between participants")
        if verdict.missing_pairs:
            verdict.problems.append(f"{verdict.missing_pairs} (message, participant) pairs missing")
        self.verdict = verdict

    def summary(self) -> dict[str, Any]:
        n = self.config.participants
        messages = len(self.truth)
        pairs = messages * (n - 1)
        delivered = sum(t.delivered for t in self.truth.values())
        ttc = sorted(
            t.last_delivery_ms - t.sent_ms for t in self.truth.values() if t.delivered >= n - 1
        )
        irretrievably_lost = sum(len(s) for per_p in self.lost for s in per_p)
        verdict = self.verdict
        return {
            "seed": self.config.seed,
            "participants": n,
            "stores": self.config.stores,
            "channels": self.config.channels,
            "messages_sent": messages,
            "receive_events": self.receive_events,
            "delivery_rate": delivered / pairs if pairs else 1.0,
            "identical_logs": verdict.identical_logs,
            "causal_order_ok": verdict.causal_order_ok,
            "ordered_logs": verdict.ordered_logs,
            "duplicates": verdict.duplicates,
            "irretrievably_lost": irretrievably_lost,
            "missing_pairs": verdict.missing_pairs,
            "time_to_consistency_ms": _percentiles(ttc),
            "unconverged_messages": messages - len(ttc),
            "bytes_on_wire": self.bytes_on_wire,
            "bytes_per_content_message": self.bytes_on_wire / messages if messages else 0.0,
            "copies_sent": self.copies,
            "false_acks": self.false_acks,
            "store_queries": self.store_queries,
            "transmissions": {k: self.counts[k] for k in ("send", "resend", "sync", "repair")},
            "virtual_ms": self.end_ms,
            "wall_seconds": round(self.wall_seconds, 3),
            "receive_events_per_second": round(self.receive_events / self.wall_seconds)
            if self.wall_seconds
            else 0,
            "invariants_hold": verdict.ok,
            "problems": verdict.problems,
        }


def _percentiles(values: list[int]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    if len(values) == 1:
        v = float(values[0])
        return {"p50": v, "p90": v, "p99": v, "max": v}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p90": cuts[89], "p99": cuts[98], "max": float(values[-1])}


def _decoded_history(data: bytes) -> tuple[str, ...]:
    from sdsync.wire import decode

    return tuple(e.message_id for e in decode(data).causal_history)
