"""One rule for every setting with a flag: flag > environment > config file >
default, checked through the real ``up`` and ``agent`` commands (click
parsing included, where a stray ``default=`` once beat the environment),
with only the process start replaced by a recorder."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner, Result

import etcdsched.agent
from etcdsched.cli import processes
from etcdsched.cli.context import Cli
from etcdsched.cli.main import main
from etcdsched.client import DEFAULT_URL
from etcdsched.config import Config

NOT_SETTINGS = {"data_dir", "log_level", "roles"}
"""Options of ``up``/``agent`` that are not settings (nothing else reads them)."""


@dataclass(frozen=True)
class Pair:
    """A value that must win and one that must lose, as a flag, an
    environment variable and a config file value each spell them."""

    win: Any
    lose: Any
    win_args: tuple[str, ...]

    def env(self, value: Any) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)


PAIRS = {
    "host": Pair("10.0.0.1", "10.0.0.2", ("--host", "10.0.0.1")),
    "port": Pair(9001, 9002, ("--port", "9001")),
    "etcd": Pair("etcd-a:2379", "etcd-b:2379", ("--etcd", "etcd-a:2379")),
    "tls_cert": Pair(Path("/w/cert.pem"), Path("/l/cert.pem"), ("--tls-cert", "/w/cert.pem")),
    "tls_key": Pair(Path("/w/key.pem"), Path("/l/key.pem"), ("--tls-key", "/w/key.pem")),
    "reserved": Pair(True, False, ("--reserved",)),
}
"""Per flag of FLAG_SETTINGS (but ``--config``, tested on its own below)."""

COMMANDS = {"up": processes.up, "agent": processes.agent}
LEVELS = ("flag", "env", "file", "default")


def _flags(command: click.Command) -> list[str]:
    return [p.name for p in command.params if p.name in processes.FLAG_SETTINGS]


CASES = [
    pytest.param(cmd, flag, level, id=f"{cmd}-{flag}-{level}")
    for cmd, command in COMMANDS.items()
    for flag in _flags(command)
    if flag != "config"
    for level in LEVELS
]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own ETCDSCHED_* must not decide a test."""
    for name in list(os.environ):
        if name.startswith("ETCDSCHED_"):
            monkeypatch.delenv(name)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What ``up``/``agent`` would have started the process with."""
    calls: list[dict[str, Any]] = []

    async def run_up(config: Config, data_dir: Path, etcd: str | None = None) -> None:
        calls.append({"config": config, "etcd": etcd})

    async def run_agent(config: Config, roles: set[str]) -> None:
        calls.append({"config": config})

    monkeypatch.setattr(etcdsched.agent, "run_up", run_up)
    monkeypatch.setattr(etcdsched.agent, "run_agent", run_agent)
    monkeypatch.setattr(processes, "_setup_logging", lambda level: None)
    return calls


def _invoke(cmd: str, args: list[str], env: dict[str, str], tmp_path: Path) -> Result:
    base = ["--data-dir", str(tmp_path / "data")] if cmd == "up" else ["--role", "worker"]
    return CliRunner().invoke(COMMANDS[cmd], [*base, *args], env=env)


@pytest.mark.parametrize(("cmd", "flag", "top"), CASES)
def test_each_level_beats_every_level_below_it(
    cmd: str, flag: str, top: str, tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    """``top`` holds the winning value, every lower level (but the default)
    a losing one; the process must start with the winner."""
    setting, pair = processes.FLAG_SETTINGS[flag], PAIRS[flag]
    below = LEVELS[LEVELS.index(top) :]
    args = list(pair.win_args) if top == "flag" else []
    env: dict[str, str] = {}
    if "env" in below:
        env[f"ETCDSCHED_{setting.upper()}"] = pair.env(pair.win if top == "env" else pair.lose)
    if "file" in below:
        file = tmp_path / "settings.yaml"
        value = pair.win if top == "file" else pair.lose
        file.write_text(yaml.safe_dump({setting: str(value) if isinstance(value, Path) else value}))
        env["ETCDSCHED_CONFIG"] = str(file)
    result = _invoke(cmd, args, env, tmp_path)
    assert result.exit_code == 0, result.output
    expected = Config.model_fields[setting].default if top == "default" else pair.win
    assert getattr(started[0]["config"], setting) == expected
    if cmd == "up" and setting == "etcd":  # up's own etcd only when nothing set the setting
        assert started[0]["etcd"] == (None if top == "default" else pair.win)


def test_every_flag_of_up_and_agent_is_a_setting_with_a_precedence_case() -> None:
    for command in COMMANDS.values():
        names = {p.name for p in command.params}
        assert names - NOT_SETTINGS <= set(processes.FLAG_SETTINGS), command.name
    assert set(processes.FLAG_SETTINGS) - {"config"} == set(PAIRS)


def test_no_setting_flag_has_a_default_or_envvar_that_could_beat_the_environment() -> None:
    """A click ``default=`` is "given" to ``Config`` and so beats the
    environment and the file (the ``up --port`` bug); an ``envvar=`` would
    have click parse the variable too, with its own rules, where ``Config``
    must be the one reader of ``ETCDSCHED_*``."""
    for name, command in COMMANDS.items():
        required = [] if name == "up" else ["--role", "worker"]
        with command.make_context(name, required) as ctx:
            for param in command.params:
                if param.name in processes.FLAG_SETTINGS:
                    assert ctx.params[param.name] is None, (name, param.name)
                    assert not param.envvar, (name, param.name)


def test_no_reserved_beats_an_environment_and_file_that_reserve(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    file = tmp_path / "settings.yaml"
    file.write_text("worker_reserved: true\n")
    env = {"ETCDSCHED_WORKER_RESERVED": "true", "ETCDSCHED_CONFIG": str(file)}
    assert _invoke("agent", ["--no-reserved"], env, tmp_path).exit_code == 0
    assert started[0]["config"].worker_reserved is False
    env["ETCDSCHED_WORKER_RESERVED"] = "false"
    assert _invoke("agent", [], env, tmp_path).exit_code == 0
    assert started[1]["config"].worker_reserved is False


def test_config_flag_beats_etcdsched_config(tmp_path: Path, started: list[dict[str, Any]]) -> None:
    (tmp_path / "flag.yaml").write_text("api_port: 9101\n")
    (tmp_path / "env.yaml").write_text("api_port: 9102\n")
    env = {"ETCDSCHED_CONFIG": str(tmp_path / "env.yaml")}
    result = _invoke("up", ["--config", str(tmp_path / "flag.yaml")], env, tmp_path)
    assert result.exit_code == 0, result.output
    assert started[0]["config"].api_port == 9101


def test_a_config_file_sets_settings_without_a_flag(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    file = tmp_path / "settings.yaml"
    file.write_text('worker_labels: {gpu: "a100"}\nworker_tenants: [team-a]\nworker_slots: 16\n')
    result = _invoke("agent", ["--config", str(file)], {"ETCDSCHED_WORKER_SLOTS": "8"}, tmp_path)
    assert result.exit_code == 0, result.output
    config = started[0]["config"]
    assert (config.worker_labels, config.worker_tenants) == ({"gpu": "a100"}, ["team-a"])
    assert config.worker_slots == 8  # the environment still wins


def test_a_missing_config_file_is_one_line_naming_it(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    result = _invoke("agent", ["--config", str(tmp_path / "nope.yaml")], {}, tmp_path)
    assert result.exit_code == 1 and not started
    assert f"cannot read config file {tmp_path / 'nope.yaml'}" in result.output


def test_an_unknown_key_names_key_and_file(tmp_path: Path, started: list[dict[str, Any]]) -> None:
    file = tmp_path / "settings.yaml"
    file.write_text("api_prot: 9090\n")
    result = _invoke("up", [], {"ETCDSCHED_CONFIG": str(file)}, tmp_path)
    assert result.exit_code == 1 and not started
    assert f"unknown setting 'api_prot' in config file {file}" in result.output
    assert "did you mean 'api_port'" in result.output


def test_a_bad_value_is_one_line_not_a_traceback(
    tmp_path: Path, started: list[dict[str, Any]]
) -> None:
    result = _invoke("up", [], {"ETCDSCHED_API_PORT": "eighty"}, tmp_path)
    assert result.exit_code == 1 and not started
    assert "invalid settings" in result.output and "api_port" in result.output


# -- the client commands: --url/--token ----------------------------------------
@pytest.fixture
def client_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home for the client config file, in an empty directory (no
    ./.etcdsched/admin.token); returns the config file's path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "xdg" / "etcdsched" / "config.yaml"
    path.parent.mkdir(parents=True)
    return path


def _connection(args: list[str]) -> tuple[str, str | None]:
    """The URL and token a client command would call with."""
    with main.make_context("etcdsched", [*args, "status"]) as ctx:
        conn = Cli(ctx.params["url"], ctx.params["token"], "table").connection()
    return conn.url, conn.token


def test_client_url_and_token_follow_flag_env_file_default(
    client_places: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _connection([]) == (DEFAULT_URL, None)
    client_places.write_text("url: https://file\ntoken: t-file\n")
    assert _connection([]) == ("https://file", "t-file")
    monkeypatch.setenv("ETCDSCHED_URL", "https://env")
    monkeypatch.setenv("ETCDSCHED_TOKEN", "t-env")
    assert _connection([]) == ("https://env", "t-env")
    assert _connection(["--url", "https://flag", "--token", "t-flag"]) == ("https://flag", "t-flag")


def test_a_client_token_never_pairs_with_a_url_from_a_lower_place(client_places: Path) -> None:
    """The one deliberate exception, per pair rather than per setting: the
    first place that gives either gives both, so a token is sent only to
    the URL configured beside it."""
    client_places.write_text("url: https://file\ntoken: t-file\n")
    assert _connection(["--token", "t-flag"]) == (DEFAULT_URL, "t-flag")
