"""`sdsync chat`: the flags of a chat run (:mod:`sdsync.chat`), and its exit code.

Exit codes: 0 done (scripted: converged, nothing failed), 1 not converged or a message
failed, 2 bad usage (including a state directory of someone else), 130 interrupted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sdsync.chat import DEFAULT_LISTEN, ChatOptions, run_chat
from sdsync.cli import logs
from sdsync.cli.errors import fail
from sdsync.cli.options import DEFAULT_PROFILE, ProfileOption, chosen_profile, given
from sdsync.core import ChannelConfig
from sdsync.errors import LocalProtocolError, OptionError
from sdsync.runtime import PROFILES, Profile, RuntimeConfig
from sdsync.waku.relay.topics import TWN_CLUSTER_ID


def configure_logging() -> None:
    logs.configure_logging(logging.WARNING, text_format="%(name)s: %(message)s")


#: The flag that sets each ChatOptions field an OptionError can name.
FLAGS = {
    "stores": "--store",
    "services": "--service",
    "peers": "--peer",
    "light": "--light",
    "state_dir": "--state-dir",
    "sends": "--send",
    "quiet_ms": "--quiet-ms",
}


def flagged(exc: LocalProtocolError) -> str:
    """The message of ``exc``, led by the flag it is about if it names an option."""
    return f"{FLAGS[exc.option]} {exc}" if isinstance(exc, OptionError) else str(exc)


def chat_main(options: ChatOptions) -> int:
    configure_logging()
    console = Console(stderr=options.scripted, soft_wrap=True)
    try:
        return asyncio.run(run_chat(options, console))
    except LocalProtocolError as exc:
        raise fail(flagged(exc)) from None
    except KeyboardInterrupt:
        return 130


def chat_configs(
    profile: Profile,
    *,
    sync_interval_ms: int | None = None,
    retry_ms: int | None = None,
    store_query_ms: int | None = None,
    repair_min_ms: int | None = None,
    repair_max_ms: int | None = None,
) -> tuple[RuntimeConfig, ChannelConfig]:
    """The profile's configuration, the chat's own choices, and the flags given (not None)
    over them."""
    runtime = profile.runtime
    query_ms = store_query_ms if store_query_ms is not None else runtime.store_query_ms
    timing = given(
        sync_interval_ms=sync_interval_ms,
        resend_interval_ms=retry_ms,
        resend_possibly_acknowledged_ms=None if retry_ms is None else 3 * retry_ms,
        store_query_ms=query_ms,
        # The incoming buffer is swept at least as often as the store may be asked.
        incoming_sweep_ms=min(runtime.incoming_sweep_ms, query_ms),
    )
    repair = given(t_min_ms=repair_min_ms, t_max_ms=repair_max_ms)
    channel = dataclasses.replace(
        profile.channel,
        # A chat shows a message at once, marked while earlier ones are missing.
        deliver_early=True,
        repair=dataclasses.replace(profile.channel.repair, **repair),
    )
    return dataclasses.replace(runtime, **timing), channel


ListOption = list[str] | None
_RUNTIME = PROFILES[DEFAULT_PROFILE].runtime
_REPAIR = PROFILES[DEFAULT_PROFILE].channel.repair


def _default(value: int) -> str:
    return f"(default: the profile's; {DEFAULT_PROFILE}: {value})"


def chat_command(
    channel: Annotated[str, typer.Option(help="Channel id (the spec's default is 0).")] = "0",
    name: Annotated[
        str | None,
        typer.Option(help="Participant id; generated and kept in --state-dir if not given."),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Keep identity and channel state here; restart with it to resume.",
        ),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(
            metavar="MULTIADDR",
            help=f"Listen address (default: the last one in --state-dir, else {DEFAULT_LISTEN}).",
        ),
    ] = None,
    peer: Annotated[
        ListOption,
        typer.Option(
            metavar="MULTIADDR",
            help="A peer to connect to, /ip4/HOST/tcp/PORT/p2p/ID; repeatable. Redialled "
            "until connected, and after it goes away.",
        ),
    ] = None,
    light: Annotated[
        bool,
        typer.Option(
            "--light",
            help="Relay nothing: a Waku light client, publishing by LightPush and receiving "
            "by Filter through --service nodes, which are its store peers too unless --store "
            "is given.",
        ),
    ] = False,
    service: Annotated[
        ListOption,
        typer.Option(
            metavar="MULTIADDR",
            help="A Waku service node of --light (LightPush, Filter, and store v3 unless "
            "--store is given), /ip4/HOST/tcp/PORT/p2p/ID; repeatable: a message goes to the "
            "first that takes it, Filter subscribes at up to two.",
        ),
    ] = None,
    store: Annotated[
        ListOption,
        typer.Option(
            metavar="URL|MULTIADDR",
            help="A store node to fetch missing messages from by their retrieval hints: its "
            "REST API (http://127.0.0.1:8645) or a Waku store peer, asked over "
            "/vac/waku/store-query/3.0.0 (/ip4/HOST/tcp/PORT/p2p/ID); repeatable, the next "
            "one asked while one is unavailable.",
        ),
    ] = None,
    store_query_ms: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Ask the store for missing messages at most this often (the incoming "
            f"buffer is then swept at least as often) "
            f"{_default(_RUNTIME.store_query_ms)}.",
        ),
    ] = None,
    drop_rate: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Drop this share of received frames (testing)."),
    ] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Seed of --drop-rate and of timers.")] = None,
    send: Annotated[
        ListOption,
        typer.Option(
            metavar="TEXT",
            help="Send TEXT, one message per --send, in order; then exit (or wait, with "
            "--wait-converged). Disables the interactive prompt.",
        ),
    ] = None,
    send_interval_ms: Annotated[
        int, typer.Option(min=0, help="Pause between --send messages.")
    ] = 0,
    wait_converged: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="Wait until converged (see docs/chat.md); exit 0 if so, 1 at the timeout.",
        ),
    ] = None,
    quiet_ms: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Quiet period of --wait-converged (default 3 sync intervals, at most a "
            "third of --wait-converged).",
        ),
    ] = None,
    min_peers: Annotated[
        int,
        typer.Option(
            min=0,
            help="Converged needs messages from this many other participants (directly or "
            "relayed).",
        ),
    ] = 0,
    min_mesh: Annotated[
        int,
        typer.Option(
            min=0,
            help="--send first waits (up to the --wait-converged time, else 10 s) for this "
            "many peers in the channel's gossipsub mesh, i.e. directly connected (--light: "
            "services holding our Filter subscription).",
        ),
    ] = 1,
    cluster_id: Annotated[
        int, typer.Option(min=0, help="Waku cluster of the relay (1: The Waku Network).")
    ] = TWN_CLUSTER_ID,
    shard: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Relay on /waku/2/rs/<cluster>/<shard> (static sharding); default: the "
            "content topic's autosharding shard.",
        ),
    ] = None,
    print_log: Annotated[
        bool,
        typer.Option("--print-log", help="At the end, print the local log as JSON lines."),
    ] = False,
    profile: ProfileOption = DEFAULT_PROFILE,
    sync_interval_ms: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Base interval of sync messages {_default(_RUNTIME.sync_interval_ms)}.",
        ),
    ] = None,
    retry_ms: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="First resend of an unacknowledged message (then backoff, x3 if "
            f"possibly acknowledged) {_default(_RUNTIME.resend_interval_ms)}.",
        ),
    ] = None,
    repair_min_ms: Annotated[
        int | None,
        typer.Option(
            min=0,
            help=f"SDS-R: earliest repair request/response {_default(_REPAIR.t_min_ms)}.",
        ),
    ] = None,
    repair_max_ms: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"SDS-R: latest repair request/response {_default(_REPAIR.t_max_ms)}.",
        ),
    ] = None,
) -> None:
    """Group chat over Waku Relay; run one per terminal (docs/chat.md).

    It prints its own address: give that to the others with --peer. js-waku relay nodes
    join with the content topic and pubsub topic it prints. With --light it relays nothing
    and goes through --service nodes instead.

    Type a line to send it; its status follows. /log, /peers, /quit.

    Scripted (--send, --wait-converged, --print-log): exit 0 done, 1 not converged, 2 bad usage.
    """
    chosen = chosen_profile(profile)
    try:
        runtime, config = chat_configs(
            chosen,
            sync_interval_ms=sync_interval_ms,
            retry_ms=retry_ms,
            store_query_ms=store_query_ms,
            repair_min_ms=repair_min_ms,
            repair_max_ms=repair_max_ms,
        )
        options = ChatOptions(
            channel=channel,
            name=name,
            state_dir=state_dir,
            listen=listen,
            peers=tuple(peer or ()),
            stores=tuple(store or ()),
            light=light,
            services=tuple(service or ()),
            drop_rate=drop_rate,
            seed=seed,
            sends=tuple(send or ()),
            send_interval_ms=send_interval_ms,
            wait_converged_s=wait_converged,
            quiet_ms=quiet_ms,
            min_peers=min_peers,
            min_mesh=min_mesh,
            cluster_id=cluster_id,
            shard=shard,
            print_log=print_log,
            runtime=runtime,
            config=config,
        )
    except LocalProtocolError as exc:
        raise typer.BadParameter(flagged(exc)) from None
    raise typer.Exit(chat_main(options))
