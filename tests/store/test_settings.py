"""The node's settings have one owner (issue 37): `sdsync.store.settings` declares each
setting once, takes its default from the component that uses it, checks every value, and
`sdsync store serve` is built from it — the same names, defaults, bounds and panels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.main import get_command

from sdsync.cli.main import app
from sdsync.cli.store import LOG_OPTIONS, RUN_OPTIONS, SERVE_PANELS, SERVE_SECRETS
from sdsync.errors import LocalProtocolError, OptionError
from sdsync.store import NodeConfig
from sdsync.store.launch import RelayOptions
from sdsync.store.light_clients import LightClientConfig
from sdsync.store.server import HttpLimits
from sdsync.store.settings import BY_NAME, SETTINGS, plan_node, size_text
from sdsync.store.sync import SyncConfig
from sdsync.transport.settings import ConnectionLimits
from sdsync.waku.filter.service import FilterLimits
from sdsync.waku.store.service import AnswerLimits
from sdsync.waku.sync import WakuSyncConfig

SHARD = {"relay_shard": [0]}


def serve_params() -> dict[str, Any]:
    command = get_command(app).commands["store"].commands["serve"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_the_command_line_is_the_settings_and_the_runs_own_options() -> None:
    params = serve_params()
    assert list(params) == [*RUN_OPTIONS, *(s.name for s in SETTINGS), *LOG_OPTIONS]
    for setting in SETTINGS:
        param = params[setting.name]
        default = param.default.value if hasattr(param.default, "value") else param.default
        assert default == setting.default, setting.name
        assert param.opts[0] == setting.flag
        assert param.multiple == setting.repeatable, setting.name
        assert param.min == setting.minimum, setting.name
        assert (param.envvar or None) == setting.envvar
    assert SERVE_SECRETS == ("token", "nodekey", "sync_token")
    panels = {name: title for title, names in SERVE_PANELS for name in names}
    assert all(panels[s.name] == s.group for s in SETTINGS)


def test_defaults_plan_each_components_own_defaults(tmp_path: Path) -> None:
    plan = plan_node({**SHARD, "data_dir": tmp_path}, identity=False)
    config = plan.config
    defaults = NodeConfig(data_dir=tmp_path)
    assert (config.listen_host, config.port) == (defaults.listen_host, defaults.port)
    assert config.retention == defaults.retention
    assert config.retention_interval_s == defaults.retention_interval_s
    assert config.timestamp_variance_s == defaults.timestamp_variance_s
    assert config.http == HttpLimits()
    assert config.store_answers == AnswerLimits()
    assert config.sync == SyncConfig(pubsub_topics=("/waku/2/rs/1/0",))
    assert config.light_clients.filter == FilterLimits()
    assert config.light_clients.lightpush_rate == LightClientConfig().lightpush_rate
    assert config.light_clients.lightpush_rate_per_ip == LightClientConfig().lightpush_rate_per_ip
    assert config.waku_sync == WakuSyncConfig(pubsub_topics=("/waku/2/rs/1/0",))
    assert plan.relay.limits == ConnectionLimits()
    relay = RelayOptions()
    assert (plan.relay.listen, plan.relay.rate) == (tuple(relay.listen), relay.rate)
    assert plan.relay.rate_per_ip == relay.rate_per_ip
    assert plan.db_url == str(tmp_path / "store.sqlite3")
    assert plan.identity is None and plan.web is None and plan.size_policy is None


def test_a_node_without_relay_mounts_no_relay_parts(tmp_path: Path) -> None:
    plan = plan_node({"data_dir": tmp_path})
    assert plan.config.relay_topics == () and plan.config.waku_sync is None
    assert plan.relay.limits is None and plan.identity is None
    assert not (tmp_path / "nodekey").exists()  # no relay: no key written


def test_planning_without_identity_writes_nothing(tmp_path: Path) -> None:
    plan_node({**SHARD, "data_dir": tmp_path / "new"}, identity=False)
    assert not (tmp_path / "new").exists()
    plan = plan_node({**SHARD, "data_dir": tmp_path})
    assert plan.identity is not None and plan.relay.key == plan.identity.key
    assert (tmp_path / "nodekey").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("values", "option"),
    [
        ({"retention_interval": 0.5}, "retention_interval"),
        ({"relay_max_connections": 50}, "relay_max_connections"),
        ({"relay_shard": [0, -1]}, "relay_shard"),
        ({"relay_shard": 3}, "relay_shard"),  # a repeatable setting takes a list
        ({"light": "yes"}, "light"),
        ({"relay_pending_handshakes": True}, "relay_pending_handshakes"),
        ({"sync_method": "gossip"}, "sync_method"),
        ({"listen": "8645"}, "listen"),
        ({"retention": ["forever"]}, "retention"),
        ({"lightpush_rate_limit": "fast"}, "lightpush_rate_limit"),
        ({"relay_rate_limit": "1/0x"}, "relay_rate_limit"),
        ({"store_answer_bytes": "0"}, "store_answer_bytes"),
        ({"sync_sessions_per_minute": 0.0}, "sync_sessions_per_minute"),
        ({"pubsub_topic": ["/waku/2/rs/2/0"]}, "pubsub_topic"),
        ({"web": True, "light": False}, "light"),
        ({"web": True, "web_address": ["/ip4/1.2.3.4/tcp/1"]}, "web_address"),
        ({**SHARD, "nodekey": "00" * 32}, "nodekey"),
        ({**SHARD, "nodekey": "07" * 32, "nodekey_file": "k"}, "nodekey"),
        ({**SHARD, "relay_exempt_ip": ["localhost"]}, "relay_exempt_ip"),  # matched nothing
        ({**SHARD, "relay_rate_limit": "fast"}, "relay_rate_limit"),  # once wrote the key
        ({"http_exempt_ip": ["127.0.0.1", "10.0.0.0/8"]}, "http_exempt_ip"),
    ],
)
def test_a_bad_value_is_refused_naming_its_setting(
    tmp_path: Path, values: dict[str, Any], option: str
) -> None:
    with pytest.raises(OptionError) as refused:
        plan_node({"data_dir": tmp_path, **values})
    assert refused.value.option == option
    assert option in BY_NAME
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_exempt_addresses_are_kept_as_a_connection_spells_them(tmp_path: Path) -> None:
    values = {**SHARD, "data_dir": tmp_path, "relay_exempt_ip": ["::0001", "none"]}
    limits = plan_node(values, identity=False).relay.limits
    assert limits is not None and limits.exempt_ips == frozenset({"::1"})


def test_a_name_no_setting_has_is_the_callers_misuse() -> None:
    with pytest.raises(LocalProtocolError, match="no such setting: relay_shards"):
        plan_node({"relay_shards": [0]})


@given(st.integers(min_value=1, max_value=2**40))
def test_sizes_read_back_as_themselves(size: int) -> None:
    text = size_text(size)
    plan = plan_node({"store_answer_bytes": text}, identity=False)
    assert plan.config.store_answers.total_bytes == size


def test_every_flag_default_is_a_value_the_owner_accepts(tmp_path: Path) -> None:
    plan = plan_node({s.name: s.default for s in SETTINGS} | {"data_dir": tmp_path})
    assert plan.values["listen"] == "127.0.0.1:8645"
