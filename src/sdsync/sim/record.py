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

Besides the verdict the summary weighs what the run cost and what it needed: relay bytes
per transmission kind (and the share of them the bloom filters take), store bytes, how
fast messages reached everyone, and the messages only a store could hand over
(:class:`Recorder`).
"""

from __future__ import annotations

import bisect
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
    MessageEvicted,
    MessageLost,
    MessagePossiblyAcknowledged,
    SendFailed,
)
from sdsync.sim.config import SimConfig, participant_name
from sdsync.wire import Message, decode

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sdsync.core import MessageChannel
    from sdsync.runtime import Transmit

EVENT_COLUMNS = ("time_ms", "participant", "channel", "message_id", "kind", "bytes", "detail")
# How many individual lost / missing (participant, message) pairs the summary spells out.
EXAMPLES = 20


@dataclass(slots=True)
class _Truth:
    sender: int
    sent_ms: int
    history: tuple[str, ...]
    hint: bytes
    size: int
    delivered: int = 0
    last_delivery_ms: int = 0


@dataclass
class Verdict:
    identical_logs: bool = True
    causal_order_ok: bool = True
    ordered_logs: bool = True
    duplicates: int = 0
    missing_pairs: int = 0
    # Missing pairs whose id reached the participant in a causal history (content or
    # sync): it was told about the message and still did not get it.
    told_missing_pairs: int = 0
    problems: list[str] = field(default_factory=list)
    # Up to EXAMPLES missing pairs, each with the likeliest reason, so a failure is readable.
    missing_examples: list[dict[str, Any]] = field(default_factory=list)
    offline_at_end: list[int] = field(default_factory=list)

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
    """Ground truth and counters of one run; :meth:`summary` is its ``summary.json``.

    ``unlearnable_messages`` counts the distinct content messages that at least one
    participant could not have learnt of without a store. A message is unlearnable at a
    participant when a store catch-up (a window query, not a query by hint) brought it
    there although its id had never reached that participant — not received, not named by
    any causal history it processed (as far as its channel knows: a known missing
    dependency, or one it reported lost) — or when it is missing there at the end of the
    run and was never named to it (a missing pair that is not a told-missing pair; a
    participant offline at the end counts too). With short causal histories and loss, a
    message missed together with every message naming it is such a case: only a time
    range finds it. A message a catch-up brought stays *unnamed* only until the relay
    hands that participant a copy of it or a message naming it (a participant holding it
    still reads every causal history it receives): judged at the end of the run, what the
    relay would have told anyway does not count, however early the catch-up came.
    """

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
        # Relay bytes per transmission kind (they add up to bytes_on_wire), and the bytes
        # of the bloom-filter field inside them.
        self.bytes_by_kind: dict[str, int] = {"content": 0, "resend": 0, "sync": 0, "repair": 0}
        self.bloom_bytes = 0
        self.store_queries = 0
        # Store exchanges (by-hint queries and catch-up pages): round trips and the bytes
        # of their requests and responses; catch-ups answered and the news they brought.
        self.store_round_trips = 0
        self.store_query_bytes = 0
        self.catch_ups = 0
        self.caught_up_messages = 0
        # Envelopes a catch-up fetched (its listing's hashes the participant had not seen).
        self.catch_up_fetched = 0
        # (channel, message id) of the unlearnable messages (module docstring), and per
        # participant and channel the ids a catch-up brought that the relay has not named.
        self.unlearnable: set[tuple[int, str]] = set()
        self.unnamed: list[list[set[str]]] = [
            [set() for _ in range(config.channels)] for _ in range(n)
        ]
        self.bloom_ignored: dict[str, int] = {"wrong size": 0, "saturated": 0}
        self.net_drops: dict[str, int] = defaultdict(int)
        self.abandoned: set[tuple[int, str]] = set()
        # (participant, channel, message id) evicted from an incoming buffer: received, but
        # as if it had not been until it comes again.
        self.evicted: set[tuple[int, int, str]] = set()
        self.false_acks = 0
        self.duplicates = 0
        self.causal_violations = 0
        self.verdict = Verdict()
        self.logs: list[list[list[tuple[int, str]]]] = []
        self.wall_seconds = 0.0
        self.end_ms = 0

    def _row(
        self,
        now: int,
        participant: int,
        channel: int,
        mid: str,
        kind: str,
        size: int,
        detail: str | None = None,
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
            cols["detail"].append(detail)

    # -------------------------------------------------------------- observing

    def published(self, participant: int, channel: int, message_id: str) -> None:
        self.sent_per_channel[channel] += 1
        self.have[participant][channel].add(message_id)
        self.got[participant][channel].add(message_id)

    def transmitted(
        self, participant: int, channel: int, action: Transmit, hint: bytes, now: int
    ) -> None:
        if action.kind == "content":
            history = _decoded_history(action.data)
            self.truth[(channel, action.message_id)] = _Truth(
                participant, now, history, hint, len(action.data)
            )
        kind = "send" if action.kind == "content" else action.kind
        self._row(now, participant, channel, action.message_id, kind, len(action.data))

    def on_wire(self, kind: str, size: int, bloom: int, copies: int) -> None:
        """One broadcast of ``kind`` put on the wire as ``copies`` copies of ``size`` bytes,
        ``bloom`` of them its bloom-filter field."""
        self.copies += copies
        wire = size * copies
        self.bytes_on_wire += wire
        self.bytes_by_kind[kind] = self.bytes_by_kind.get(kind, 0) + wire
        self.bloom_bytes += bloom * copies

    def never_named(
        self, participant: int, channel: int, message_id: str, chan: MessageChannel
    ) -> bool:
        """Whether ``message_id`` never reached ``participant`` so far: not received, not a
        known missing dependency of its channel ``chan``, not reported lost there."""
        return (
            message_id not in self.got[participant][channel]
            and message_id not in self.lost[participant][channel]
            and chan.missing_dependency(message_id) is None
        )

    def caught_up(self, participant: int, channel: int, message_id: str, *, unnamed: bool) -> None:
        """A catch-up brought new content; ``unnamed``: its id had never reached the
        participant (:meth:`never_named`, asked before the channel took it)."""
        self.caught_up_messages += 1
        if unnamed and (channel, message_id) in self.truth:
            self.unnamed[participant][channel].add(message_id)

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
        unnamed = self.unnamed[participant][channel]
        if unnamed and not store:  # the relay names them after all: learnable
            unnamed.discard(message.message_id)
            unnamed.difference_update(e.message_id for e in message.causal_history)
        kind = "store_receive" if store else "receive"
        self._row(now, participant, channel, message.message_id, kind, size)

    def dropped_copy(
        self, participant: int, channel: int, message_id: str, reason: str, now: int
    ) -> None:
        """The network lost a copy on its way to ``participant`` (loss, burst, partition,
        or the participant was offline when it arrived)."""
        self.net_drops[reason] += 1
        self._row(now, participant, channel, message_id, "net_drop", 0, reason)

    def events(self, participant: int, channel: int, events: list[Event], now: int) -> None:
        # By exact type (event classes are never subclassed): most events of a receive are
        # none of these, and a chain of isinstance() tests costs more than the rest.
        for event in events:
            if type(event) is MessageDelivered:
                self._delivered(participant, channel, event.message_id, now)
            elif type(event) is MessageAcknowledged or type(event) is MessagePossiblyAcknowledged:
                self._acknowledged(participant, channel, event, now)
            elif type(event) is MessageLost:
                self.lost[participant][channel].add(event.message_id)
                self._row(now, participant, channel, event.message_id, "lost", 0, "lost_timeout")
            elif type(event) is MessageDropped:
                self._row(
                    now, participant, channel, event.message_id, "drop", 0, event.reason.value
                )
            elif type(event) is MessageEvicted:
                self._evicted(participant, channel, event, now)
            elif type(event) is SendFailed:
                # The sender's driver gave up after max_attempts resends.
                self.abandoned.add((channel, event.message_id))
                self._row(now, participant, channel, event.message_id, "abandoned", 0)

    def _acknowledged(
        self,
        participant: int,
        channel: int,
        event: MessageAcknowledged | MessagePossiblyAcknowledged,
        now: int,
    ) -> None:
        by_bloom = not getattr(event, "by_causal_history", False)
        acker = int(event.acker_id[1:])
        false = by_bloom and event.message_id not in self.got[acker][channel]
        if false:
            self.false_acks += 1
        kind = "ack" if isinstance(event, MessageAcknowledged) else "possibly_ack"
        # "how:who[:false]", e.g. "bloom:p00003": the pipeline can study acks per path and
        # spot the false ones (the acker never had the message).
        how = "bloom" if by_bloom else "causal_history"
        detail = f"{how}:{event.acker_id}:false" if false else f"{how}:{event.acker_id}"
        self._row(now, participant, channel, event.message_id, kind, 0, detail)

    def _evicted(self, participant: int, channel: int, event: MessageEvicted, now: int) -> None:
        mid = event.message_id
        self.got[participant][channel].discard(mid)
        self.evicted.add((participant, channel, mid))
        self._row(now, participant, channel, mid, "evict", 0, event.reason.value)

    def _delivered(self, participant: int, channel: int, message_id: str, now: int) -> None:
        have = self.have[participant][channel]
        if message_id in have:
            self.duplicates += 1
        truth = self.truth.get((channel, message_id))
        if truth is not None:
            lost = self.lost[participant][channel]
            # Reported lost, then it turned up after all: not irretrievably lost.
            if lost:
                lost.discard(message_id)
            # issuperset runs in C: the generator below only runs when something is amiss,
            # which matters at a million deliveries with 200-entry histories.
            if not have.issuperset(truth.history) and any(
                dep not in have and dep not in lost for dep in truth.history
            ):
                self.causal_violations += 1
            truth.delivered += 1
            truth.last_delivery_ms = now
        have.add(message_id)
        self._row(now, participant, channel, message_id, "deliver", 0)

    def churned(self, participant: int, online: bool, now: int) -> None:
        self._row(now, participant, -1, "", "online" if online else "offline", 0)

    # ------------------------------------------------------------------ judge

    def finish(
        self, end_ms: int, online: Sequence[bool], channels: Sequence[Sequence[MessageChannel]]
    ) -> None:
        """Judge the run as it ended at ``end_ms``: ``online[p]`` says whether participant
        ``p`` is online, ``channels[p][c]`` is its engine for channel ``c`` (its log is
        checked; what it waits for and was told of explains a missing message)."""
        self.wall_seconds = time.perf_counter() - self.started
        self.end_ms = end_ms
        verdict = Verdict(duplicates=self.duplicates)
        verdict.offline_at_end = [index for index, is_on in enumerate(online) if not is_on]
        if verdict.offline_at_end:
            names = ", ".join(participant_name(i) for i in verdict.offline_at_end[:EXAMPLES])
            verdict.problems.append(
                f"{len(verdict.offline_at_end)} participant(s) still offline at the end "
                f"(churn past the deadline): {names}"
            )
        verdict.causal_order_ok = self.causal_violations == 0
        if self.causal_violations:
            verdict.problems.append(f"{self.causal_violations} deliveries before a dependency")
        if self.duplicates:
            verdict.problems.append(f"{self.duplicates} duplicate deliveries")
        self.logs = []
        for per_p in channels:
            logs = [[(e.lamport_timestamp, e.message_id) for e in chan.log] for chan in per_p]
            if self.logs:
                # Logs nearly always agree: one copy of each equal log (only read from here
                # on) keeps the check from doubling a big run's memory at its end.
                first = self.logs[0]
                logs = [ref if log == ref else log for log, ref in zip(logs, first, strict=True)]
            self.logs.append(logs)
        for c in range(self.config.channels):
            expected = {mid for (ch, mid) in self.truth if ch == c}
            reference = self.logs[0][c]
            for index, logs in enumerate(self.logs):
                log = logs[c]
                if log != sorted(log):
                    verdict.ordered_logs = False
                    verdict.problems.append(
                        f"{participant_name(index)} channel {c}: log out of order"
                    )
                if log != reference:
                    verdict.identical_logs = False
                lost = self.lost[index][c]
                missing = expected - {mid for _, mid in log} - lost
                verdict.missing_pairs += len(missing)
                chan = channels[index][c]
                told = missing.intersection(chan.missing_ids())
                verdict.told_missing_pairs += len(told)
                self.unlearnable.update((c, mid) for mid in missing - told)
                self.unlearnable.update((c, mid) for mid in self.unnamed[index][c])
                for mid in sorted(missing)[: EXAMPLES - len(verdict.missing_examples)]:
                    verdict.missing_examples.append(
                        {
                            "participant": participant_name(index),
                            "channel": c,
                            "message_id": mid,
                            "sender": participant_name(self.truth[(c, mid)].sender),
                            "reason": self._why_missing(online[index], chan, index, c, mid),
                        }
                    )
        for per_p in channels:
            for chan in per_p:
                for kind, count in chan.stats.bloom_ignored.items():
                    self.bloom_ignored[kind] = self.bloom_ignored.get(kind, 0) + count
        if not verdict.identical_logs:
            verdict.problems.append("logs differ between participants")
        if verdict.missing_pairs:
            verdict.problems.append(f"{verdict.missing_pairs} (message, participant) pairs missing")
        self.verdict = verdict

    def _why_missing(
        self, online: bool, chan: MessageChannel, participant: int, channel: int, mid: str
    ) -> str:
        """The likeliest explanation of a missing (participant, message) pair."""
        if not online:
            return "participant offline at the end of the run"
        if mid in self.got[participant][channel]:
            if mid in chan.incoming_ids():
                return "received, still waiting for dependencies"
            return "received but never delivered (engine fault)"
        if (participant, channel, mid) in self.evicted:
            return "evicted from the incoming buffer, never received again"
        if (channel, mid) in self.abandoned:
            return "never received; its sender gave up after max_attempts"
        if chan.missing_dependency(mid) is not None:
            return "never received, although a causal history named it"
        return "never received; no message it got named it"

    def summary(self) -> dict[str, Any]:
        n = self.config.participants
        messages = len(self.truth)
        pairs = messages * (n - 1)
        delivered = sum(t.delivered for t in self.truth.values())
        ttc = sorted(
            t.last_delivery_ms - t.sent_ms for t in self.truth.values() if t.delivered >= n - 1
        )
        within_1_min = bisect.bisect_right(ttc, 60_000)
        within_10_min = bisect.bisect_right(ttc, 600_000)
        irretrievably_lost = sum(len(s) for per_p in self.lost for s in per_p)
        lost_examples = [
            {
                "participant": participant_name(index),
                "channel": c,
                "message_id": mid,
                "reason": "reported lost: dependency not retrieved within lost_timeout_ms",
            }
            for index, per_p in enumerate(self.lost)
            for c, mids in enumerate(per_p)
            for mid in sorted(mids)
        ][:EXAMPLES]
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
            "told_missing_pairs": verdict.told_missing_pairs,
            "time_to_consistency_ms": _percentiles(ttc),
            "unconverged_messages": messages - len(ttc),
            "bytes_on_wire": self.bytes_on_wire,
            "bytes_per_content_message": self.bytes_on_wire / messages if messages else 0.0,
            "bytes_by_kind": {**self.bytes_by_kind, "store_query": self.store_query_bytes},
            "bloom_bytes": self.bloom_bytes,
            "bloom_share": self.bloom_bytes / self.bytes_on_wire if self.bytes_on_wire else 0.0,
            "delivered_to_everyone": {
                "within_1_min": within_1_min / messages if messages else 1.0,
                "within_10_min": within_10_min / messages if messages else 1.0,
                "ever": len(ttc) / messages if messages else 1.0,
            },
            "unlearnable_messages": len(self.unlearnable),
            "bloom_ignored": dict(self.bloom_ignored),
            "copies_sent": self.copies,
            "network_drops": dict(sorted(self.net_drops.items())),
            "abandoned": len(self.abandoned),
            "evicted": self.counts["evict"],
            "false_acks": self.false_acks,
            "store_queries": self.store_queries,
            "retrieval": self.config.retrieval,
            "store_round_trips": self.store_round_trips,
            "store_query_bytes": self.store_query_bytes,
            "store_catch_ups": self.catch_ups,
            "caught_up_messages": self.caught_up_messages,
            "store_catch_up_fetched": self.catch_up_fetched,
            "transmissions": {k: self.counts[k] for k in ("send", "resend", "sync", "repair")},
            "virtual_ms": self.end_ms,
            "wall_seconds": round(self.wall_seconds, 3),
            "receive_events_per_second": round(self.receive_events / self.wall_seconds)
            if self.wall_seconds
            else 0,
            "invariants_hold": verdict.ok,
            "problems": verdict.problems,
            # One entry per check, so a failed run says which invariant broke and where.
            "invariants": {
                "all_messages_everywhere": verdict.missing_pairs == 0,
                "identical_logs": verdict.identical_logs,
                "ordered_logs": verdict.ordered_logs,
                "no_duplicate_delivery": verdict.duplicates == 0,
                "causal_order": verdict.causal_order_ok,
                "offline_at_end": [participant_name(i) for i in verdict.offline_at_end],
                "missing_examples": verdict.missing_examples,
                "lost_examples": lost_examples,
            },
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
    return tuple(e.message_id for e in decode(data).causal_history)
