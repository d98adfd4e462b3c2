"""The service's parts in this process: the event hub, the CLI's checks, the server's limits."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from reliabilityprocess import EventLog
from typer.testing import CliRunner

from sdsync.cli.main import app
from sdsync.cli.reliability import is_loopback, participant_id, split_listen
from sdsync.errors import LocalProtocolError
from sdsync.reliability import EventHub, ReliabilityServer
from sdsync.reliability import reliability_pb2 as pb
from sdsync.reliability import reliability_pb2_grpc as pb_grpc
from sdsync.runtime.manager import ReliabilityManager


def test_the_hub_bounds_subscribers_and_wakes_waiters_on_new_events() -> None:
    hub = EventHub(max_subscribers=3, max_per_peer=2, write_timeout_s=5.0)
    first = hub.subscribe("a", lambda: None)
    hub.subscribe("a", lambda: None)
    with pytest.raises(Exception, match="2 event streams on this connection"):
        hub.subscribe("a", lambda: None)
    busy = hub.subscribe("b", lambda: None)
    with pytest.raises(Exception, match="already 3 event streams"):
        hub.subscribe("c", lambda: None)
    assert hub.refused == 2
    hub.unsubscribe(first)
    hub.unsubscribe(first)  # idempotent: a cut stream's call ends later
    assert hub.subscribers == 2
    hub.subscribe("c", lambda: None)  # the place is free again
    busy.writing_since = 100.0
    assert hub.cut_stalled(104.9) == []
    assert hub.cut_stalled(105.0) == [busy]
    assert (hub.cut, hub.subscribers) == (1, 2)
    before = hub.generation
    woke = threading.Event()

    def waiter() -> None:
        hub.wait(before, 60.0)
        woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    hub.notify()
    thread.join(60.0)
    assert woke.is_set() and hub.generation != before


def test_the_service_needs_explicit_acknowledgements() -> None:
    with pytest.raises(LocalProtocolError, match="explicit"):
        ReliabilityServer(ReliabilityManager("alice"), "127.0.0.1:0")


def test_listen_addresses() -> None:
    assert split_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert split_listen("[::1]:50051") == ("[::1]", 50051)
    for bad in ("127.0.0.1", ":80", "host:port", "127.0.0.1:70000"):
        with pytest.raises(ValueError):
            split_listen(bad)
    assert is_loopback("127.0.0.1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    assert not is_loopback("example.org")


def test_serve_refuses_a_remote_listen_without_allow_remote() -> None:
    result = CliRunner().invoke(app, ["reliability", "serve", "--listen", "0.0.0.0:0"])
    assert result.exit_code == 2
    assert "--allow-remote" in result.output
    result = CliRunner().invoke(app, ["reliability", "serve", "--listen", "nowhere"])
    assert result.exit_code == 2


def test_the_participant_id_is_kept_in_the_state_dir(tmp_path: Path) -> None:
    first = participant_id(None, tmp_path)
    assert participant_id(None, tmp_path) == first
    assert participant_id("alice", tmp_path) == "alice"
    assert participant_id(None, None) != participant_id(None, None)


def test_subscribers_are_bounded_and_stop_ends_streams_and_closes_the_manager() -> None:
    manager = ReliabilityManager("alice", acknowledge="explicit")
    server = ReliabilityServer(manager, "127.0.0.1:0", max_workers=4, max_subscribers=1)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.ReliabilityStub(channel)
    events = EventLog(stub)
    with pytest.raises(grpc.RpcError) as refused:
        EventLog(stub)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    stub.OpenChannel(pb.OpenChannelRequest(channel_id="room"))
    assert manager.channels() == ["room"]
    server.stop()
    events.wait_for(lambda: events.ended)
    assert manager.channels() == []
    channel.close()
