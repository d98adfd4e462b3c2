"""The conformance peer: the ``sdsync peer --stdio`` JSON-lines contract over a MessageChannel.

Theory of operation
-------------------
One JSON request per line in, exactly one JSON reply per line out (:func:`serve`); each op
maps onto one call of the core (send, receive, sync, sweeps, state) at the session's clock,
which a ``clock`` request sets (scripted time) or the system clock gives. Events go out as
JSON objects with bytes fields as ``<name>_hex``. The same scenario can drive this peer and
the Node driver around @waku/sds (tests/interop/js/driver.mjs), which is how
interoperability is tested, in this process (:class:`PeerSession`) or as a process.

Errors say whose fault they are: ``{"ok": false, "error": {"kind": "remote", ...}}`` when
the *wire bytes* are bad (state unchanged), ``"local"`` when the request itself is (an
unknown op, malformed JSON, bad hex, a missing field). The session keeps running.

``state`` also reports the received bloom filters the channel ignored, by kind ("wrong
size", "saturated"): a peer whose filters have another size acknowledges nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Callable
from typing import Any, TextIO

from sdsync.core import ChannelConfig, Event, MessageChannel
from sdsync.errors import LocalProtocolError, SdsError
from sdsync.runtime import system_clock_ms

__all__ = ["PeerSession", "serve"]

Reply = dict[str, Any]
logger = logging.getLogger("sdsync.peer")


def event_to_json(event: Event) -> dict[str, Any]:
    """``{"type": ..., "message_id": ..., ...}`` with bytes fields as ``<name>_hex``."""
    out: dict[str, Any] = {"type": event.type}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if f.name == "content":
            out["payload_hex"] = value.hex()
        elif isinstance(value, bytes):
            out[f"{f.name}_hex"] = value.hex()
        elif value is None and f.name == "retrieval_hint":
            out["retrieval_hint_hex"] = None
        else:
            out[f.name] = value
    return out


def _events(events: list[Event]) -> list[dict[str, Any]]:
    return [event_to_json(e) for e in events]


def _hex_field(request: dict[str, Any], name: str, *, required: bool) -> bytes | None:
    value = request.get(name)
    if value is None:
        if required:
            raise LocalProtocolError(f"missing field {name!r}")
        return None
    if not isinstance(value, str):
        raise LocalProtocolError(f"{name} must be a hex string")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise LocalProtocolError(f"{name} is not valid hex") from None


class PeerSession:
    """The state behind one ``sdsync peer`` process; ``handle`` maps a line to a reply."""

    def __init__(
        self,
        channel_id: str,
        participant_id: str,
        config: ChannelConfig,
        clock: Callable[[], int] = system_clock_ms,
    ) -> None:
        self.channel_id = channel_id
        self.participant_id = participant_id
        self.config = config
        self._now: int | None = None
        self._clock = clock
        self._channel: MessageChannel | None = None
        self._ops: dict[str, Callable[[dict[str, Any]], Reply]] = {
            "clock": self._op_clock,
            "send": self._op_send,
            "receive": self._op_receive,
            "sync": self._op_sync,
            "ephemeral": self._op_ephemeral,
            "sweep_incoming": self._op_sweep_incoming,
            "sweep_outgoing": self._op_sweep_outgoing,
            "repair_sweep": self._op_repair_sweep,
            "state": self._op_state,
        }

    @property
    def now(self) -> int:
        return self._now if self._now is not None else self._clock()

    @property
    def channel(self) -> MessageChannel:
        # Created lazily so its Lamport clock starts at the first scripted time.
        if self._channel is None:
            self._channel = MessageChannel(
                self.channel_id, self.participant_id, now_ms=self.now, config=self.config
            )
        return self._channel

    def handle(self, line: str) -> Reply:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise LocalProtocolError("each line must be a JSON object")
            op = self._ops.get(request.get("op"))  # type: ignore[arg-type]
            if op is None:
                raise LocalProtocolError(f"unknown op {request.get('op')!r}")
            return op(request)
        except json.JSONDecodeError as exc:
            return _error("local", f"malformed JSON: {exc}")
        except SdsError as exc:
            return _error(exc.kind, str(exc))
        except Exception as exc:  # a bug of ours must not kill a scripted session
            logger.exception("internal error handling %r", line[:200])
            return _error("local", f"internal error: {exc!r}")

    def _op_clock(self, request: dict[str, Any]) -> Reply:
        now = request.get("now_ms")
        if not isinstance(now, int) or isinstance(now, bool) or now < 0:
            raise LocalProtocolError("now_ms must be a non-negative integer")
        self._now = now
        return {"ok": True}

    def _op_send(self, request: dict[str, Any]) -> Reply:
        payload = _hex_field(request, "payload_hex", required=True) or b""
        hint = _hex_field(request, "retrieval_hint_hex", required=False)
        message_id = request.get("message_id")
        if message_id is not None and not isinstance(message_id, str):
            raise LocalProtocolError("message_id must be a string")
        out = self.channel.send(payload, self.now, message_id=message_id)
        if hint is not None:
            self.channel.set_retrieval_hint(out.message_id, hint)
        return {
            "ok": True,
            "message_id": out.message_id,
            "wire_hex": out.data.hex(),
            "events": _events(out.events),
        }

    def _op_receive(self, request: dict[str, Any]) -> Reply:
        data = _hex_field(request, "wire_hex", required=True) or b""
        hint = _hex_field(request, "retrieval_hint_hex", required=False)
        events = self.channel.receive(data, self.now, retrieval_hint=hint)
        return {"ok": True, "events": _events(events)}

    def _op_sync(self, request: dict[str, Any]) -> Reply:
        out = self.channel.send_sync(self.now)
        if out is None:
            return {"ok": True, "wire_hex": None, "events": []}
        return {"ok": True, "wire_hex": out.data.hex(), "events": _events(out.events)}

    def _op_ephemeral(self, request: dict[str, Any]) -> Reply:
        payload = _hex_field(request, "payload_hex", required=True) or b""
        out = self.channel.send_ephemeral(payload)
        return {"ok": True, "wire_hex": out.data.hex(), "events": _events(out.events)}

    def _op_sweep_incoming(self, request: dict[str, Any]) -> Reply:
        sweep = self.channel.sweep_incoming(self.now)
        missing = [
            {
                "message_id": e.message_id,
                "retrieval_hint_hex": e.retrieval_hint.hex() if e.retrieval_hint else None,
            }
            for e in sweep.missing
        ]
        return {"ok": True, "missing": missing, "events": _events(sweep.events)}

    def _op_sweep_outgoing(self, request: dict[str, Any]) -> Reply:
        sweep = self.channel.sweep_outgoing()
        return {
            "ok": True,
            "unacknowledged": [e.message_id for e in sweep.unacknowledged],
            "possibly_acknowledged": [e.message_id for e in sweep.possibly_acknowledged],
        }

    def _op_repair_sweep(self, request: dict[str, Any]) -> Reply:
        sweep = self.channel.sweep_repair(self.now)
        return {
            "ok": True,
            "wire_hex_list": [d.hex() for d in sweep.data],
            "events": _events(sweep.events),
        }

    def _op_state(self, request: dict[str, Any]) -> Reply:
        chan = self.channel
        return {
            "ok": True,
            "lamport": chan.lamport_timestamp,
            "log": chan.log_ids(),
            "bloom_hex": chan.bloom_bytes().hex(),
            "incoming": chan.incoming_ids(),
            "outgoing": chan.outgoing_ids(),
            # Received filters that gave no ack evidence, by kind ("wrong size": a peer
            # on another bloom size, i.e. another profile; "saturated").
            "bloom_ignored": dict(sorted(chan.stats.bloom_ignored.items())),
        }


def _error(kind: str, message: str) -> Reply:
    return {"ok": False, "error": {"kind": kind, "message": message}}


def serve(session: PeerSession, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> None:
    """Answer every input line until end of input."""
    for line in stdin:
        if not line.strip():
            continue
        stdout.write(json.dumps(session.handle(line), separators=(",", ":")) + "\n")
        stdout.flush()
