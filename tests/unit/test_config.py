"""Node configuration: defaults < TOML file < environment < flags; typos and wrong types refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamingnode.config import NodeConfig, load_config
from wal.backend import Durability
from wal.errors import InvalidArgumentError


def test_defaults_need_nothing() -> None:
    config = load_config(env={})
    assert config == NodeConfig()
    assert config.data_dir == Path("data") and config.listen.endswith(":19530")
    assert config.wal_durability is Durability.SYNC


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "n.toml"
    f.write_text('listen = "127.0.0.1:1"\ntick_interval = 0.5\nchannels = ["a", "b"]\ndata_dir = "/x"\n')
    env = {"STREAMINGNODE_TICK_INTERVAL": "0.25", "STREAMINGNODE_CHANNELS": "c, d"}
    config = load_config(f, env=env, overrides={"listen": "127.0.0.1:2", "data_dir": None})
    assert config.listen == "127.0.0.1:2"  # flag beats file
    assert config.tick_interval == 0.25 and config.channels == ("c", "d")  # env beats file
    assert config.data_dir == Path("/x")  # a None flag leaves the file's value


@pytest.mark.parametrize(("text", "env", "message"), [
    ("durabilty = 'sync'\n", {}, "unknown key 'durabilty'"),
    ("max_message_bytes = 'big'\n", {}, "max_message_bytes has a value of the wrong type"),
    ("tick_interval = true\n", {}, "tick_interval has a value of the wrong type"),
    ("", {"STREAMINGNODE_PRODUCE_MAX_IN_FLIGHT": "many"}, "STREAMINGNODE_PRODUCE_MAX_IN_FLIGHT"),
    ("", {"STREAMINGNODE_DURABILITY": "fast"}, "durability must be 'sync' or 'relaxed'"),
    ("max_message_bytes = 0\n", {}, "max_message_bytes must be > 0"),
    ("", {"STREAMINGNODE_PRODUCE_MAX_IN_FLIGHT_BYTES": "0"}, "produce_max_in_flight_bytes must be > 0"),
    ("", {"STREAMINGNODE_MAX_UNARY_REQUEST_BYTES": "0"}, "max_unary_request_bytes must be > 0"),
    ("max_unary_request_bytes = 67108865\n", {}, r"max_unary_request_bytes must be > 0 and <= max_request_bytes"),
    ("not toml at all [", {}, "is not valid TOML"),
])
def test_bad_settings_are_refused_by_name(tmp_path: Path, text: str, env: dict[str, str], message: str) -> None:
    f = tmp_path / "n.toml"
    f.write_text(text)
    with pytest.raises(InvalidArgumentError, match=message):
        load_config(f, env=env)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="cannot read config file"):
        load_config(tmp_path / "absent.toml", env={})


def test_retention_settings_default_and_precedence(tmp_path: Path) -> None:
    assert NodeConfig().retention_seconds == 86400.0 and NodeConfig().retention_check_seconds == 60.0
    f = tmp_path / "n.toml"
    f.write_text("retention_seconds = 3600\nretention_check_seconds = 5\n")
    config = load_config(f, env={"STREAMINGNODE_RETENTION_SECONDS": "-1"})
    assert config.retention_seconds == -1.0 and config.retention_check_seconds == 5.0  # env beats file
    assert load_config(f, env={}, overrides={"retention_seconds": 0}).retention_seconds == 0.0  # flag beats file
    with pytest.raises(InvalidArgumentError, match="retention_check_seconds must be > 0"):
        load_config(env={"STREAMINGNODE_RETENTION_CHECK_SECONDS": "0"})
    with pytest.raises(InvalidArgumentError, match="retention_seconds has a value of the wrong type"):
        load_config(env={"STREAMINGNODE_RETENTION_SECONDS": "a day"})


def test_trace_exporter_is_off_by_default_and_set_like_every_other_setting(tmp_path: Path) -> None:
    assert NodeConfig().trace_exporter == "none"
    f = tmp_path / "n.toml"
    f.write_text('trace_exporter = "console"\n')
    assert load_config(f, env={}).trace_exporter == "console"
    assert load_config(f, env={"STREAMINGNODE_TRACE_EXPORTER": "otlp"}).trace_exporter == "otlp"
    assert load_config(f, env={"STREAMINGNODE_TRACE_EXPORTER": "otlp"},
                       overrides={"trace_exporter": "none"}).trace_exporter == "none"
    with pytest.raises(InvalidArgumentError, match="trace_exporter must be 'none', 'console' or 'otlp'"):
        load_config(env={"STREAMINGNODE_TRACE_EXPORTER": "jaeger"})
