"""Every setting of the node works the same way as a flag, a TOML key and a ``STREAMINGNODE_*`` variable,
and ``serve --help`` shows it with its help text.

The list of settings is NodeConfig's fields (``streamingnode.config.settings``), not a list written
here: a field added later is checked by these tests without anyone remembering to.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import pytest

import streamingnode.__main__ as entry
from streamingnode.config import NodeConfig, Setting, load_config, settings

SETTINGS = settings()

# Settings that the model accepts only together with others (NodeConfig.__post_init__): those go along,
# from the same source, with the value a setting is tested with.
COMPANIONS: dict[str, dict[str, Any]] = {
    "tls_cert": {"tls_key": Path("/k.pem")},
    "tls_key": {"tls_cert": Path("/c.pem")},
    "tls_client_ca": {"tls_cert": Path("/c.pem"), "tls_key": Path("/k.pem")},
    "cluster_nats": {"node_id": "n1"},
    "wal": {"cluster_nats": "nats://127.0.0.1:4222", "node_id": "n1"},
}


def other_value(s: Setting) -> Any:
    """A valid value of ``s`` that is not its default."""
    if s.is_bool:
        return not s.default
    if s.choices is not None:
        return next(c for c in s.choices if c != s.default)
    if isinstance(s.default, int):
        return s.default + 1
    if isinstance(s.default, float):
        return s.default + 0.5
    if isinstance(s.default, tuple):
        return ("a", "b")
    if s.default is None or isinstance(s.default, Path):
        return Path("/somewhere/else")
    if s.name == "advertise":  # an address (host:port), empty by default
        return "node-1:19530"
    return "nats://127.0.0.1:4222" if s.name == "cluster_nats" else "x" + s.default


def as_text(value: Any) -> str:
    """``value`` as a flag or an environment variable spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def as_toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    return f'"{value}"'


def flag_args(name: str, value: Any) -> list[str]:
    s = next(x for x in SETTINGS if x.name == name)
    if s.is_bool:
        return [s.flag if value else "--no-" + s.flag.removeprefix("--")]
    return [s.flag, as_text(value)]


def with_companions(s: Setting) -> dict[str, Any]:
    return {s.name: other_value(s), **COMPANIONS.get(s.name, {})}


def serve_config(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> NodeConfig:
    """The NodeConfig ``streamingnode serve <argv>`` would run with."""
    import streamingnode.server as server  # noqa: PLC0415

    seen: list[NodeConfig] = []

    async def fake_serve(config: NodeConfig, **_: object) -> None:
        seen.append(config)

    monkeypatch.setattr(server, "serve", fake_serve)
    monkeypatch.setattr("streamingnode.observability.logs.configure_logging", lambda *_, **__: None)
    assert entry.main(["serve", *argv]) == 0
    return seen[0]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("STREAMINGNODE_")]:
        monkeypatch.delenv(key)


def test_the_settings_are_the_config_fields() -> None:
    assert [s.name for s in SETTINGS] == list(NodeConfig.__dataclass_fields__)
    assert {"log_level", "log_format"} <= {s.name for s in SETTINGS}
    # Every value the tests below use is valid, and differs from the default.
    for s in SETTINGS:
        cfg = NodeConfig(**with_companions(s))
        assert getattr(cfg, s.name) != s.default, s.name


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_each_setting_as_a_flag(s: Setting, monkeypatch: pytest.MonkeyPatch) -> None:
    values = with_companions(s)
    argv = [a for name, value in values.items() for a in flag_args(name, value)]
    cfg = serve_config(argv, monkeypatch)
    assert getattr(cfg, s.name) == values[s.name]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_each_setting_as_a_toml_key(s: Setting, tmp_path: Path) -> None:
    values = with_companions(s)
    path = tmp_path / "node.toml"
    path.write_text("".join(f"{name} = {as_toml(value)}\n" for name, value in values.items()))
    assert getattr(load_config(path, env={}), s.name) == values[s.name]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_each_setting_as_an_environment_variable(s: Setting, monkeypatch: pytest.MonkeyPatch) -> None:
    values = with_companions(s)
    env = {f"STREAMINGNODE_{name.upper()}": as_text(value) for name, value in values.items()}
    assert getattr(load_config(env=env), s.name) == values[s.name]
    # ... and the same through the command itself.
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert getattr(serve_config([], monkeypatch), s.name) == values[s.name]


def test_each_setting_is_in_serve_help_with_its_text() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        entry.main(["serve", "--help"])
    text = " ".join(out.getvalue().split())  # argparse wraps lines
    for s in SETTINGS:
        assert s.help, f"{s.name} has no docstring in NodeConfig"
        assert f"{s.flag} " in text or f"{s.flag}," in text, s.name
        # The first words of the help text: argparse may break lines inside it, not change it.
        first = " ".join(s.help.split()[:4]).replace("%", "%")
        assert first in text, (s.name, first)
        assert s.env in text, s.name


def test_flags_beat_the_environment_which_beats_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "node.toml"
    path.write_text('log_level = "error"\nlisten = "127.0.0.1:1"\ntick_interval = 0.5\n')
    monkeypatch.setenv("STREAMINGNODE_LOG_LEVEL", "warning")
    monkeypatch.setenv("STREAMINGNODE_LISTEN", "127.0.0.1:2")
    cfg = serve_config(["--config", str(path), "--listen", "127.0.0.1:3"], monkeypatch)
    assert (cfg.log_level, cfg.listen, cfg.tick_interval) == ("warning", "127.0.0.1:3", 0.5)


def test_an_empty_metrics_listen_variable_turns_metrics_off() -> None:
    assert load_config(env={"STREAMINGNODE_METRICS_LISTEN": ""}).metrics_listen == ""
    assert load_config(env={"STREAMINGNODE_CLUSTER_NATS": ""}).cluster_nats == ""
    # For a number or a path an empty variable is no value at all.
    assert load_config(env={"STREAMINGNODE_TICK_INTERVAL": ""}).tick_interval == NodeConfig().tick_interval


def test_a_bad_log_level_is_refused_by_name() -> None:
    from wal.errors import InvalidArgumentError  # noqa: PLC0415

    with pytest.raises(InvalidArgumentError, match="log_level must be one of debug, info, warning, error"):
        load_config(env={"STREAMINGNODE_LOG_LEVEL": "loud"})


def test_data_dir_is_accepted_after_every_subcommand_that_has_one(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("serve", "demo", "inspect", "verify", "compact", "salvage"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            entry.main([command, "--help"])
        assert "--data-dir" in out.getvalue(), command
    assert entry.main(["inspect", "--data-dir", str(tmp_path / "d")]) == 0


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version  # noqa: PLC0415

    with pytest.raises(SystemExit) as exit_:
        entry.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"streamingnode {version('streamingnode')}"
