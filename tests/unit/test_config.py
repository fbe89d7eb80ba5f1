"""Config checks that catch a setting which would silently not work, and
the config file's refusals (the precedence itself:
test_settings_precedence.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from etcdsched.config import Config, ConfigFileError


def test_a_lookahead_past_the_horizon_is_refused_naming_both() -> None:
    with pytest.raises(ValidationError, match=r"horizon_ms .* lookahead_ms"):
        Config(lookahead_ms=70_000, horizon_ms=60_000)


def test_a_worker_may_offer_more_slots_than_one_run_may_ask_for() -> None:
    assert Config(worker_slots=50_000).worker_slots == 50_000
    with pytest.raises(ValidationError, match="worker_slots"):
        Config(worker_slots=2_000_000)


# -- the config file (--config, ETCDSCHED_CONFIG) ---------------------------------
@pytest.fixture
def settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file named by ETCDSCHED_CONFIG, and no other ETCDSCHED_* variable."""
    for name in list(os.environ):
        if name.startswith("ETCDSCHED_"):
            monkeypatch.delenv(name)
    path = tmp_path / "settings.yaml"
    monkeypatch.setenv("ETCDSCHED_CONFIG", str(path))
    return path


def test_a_config_file_sets_settings_by_their_names(settings_file: Path) -> None:
    settings_file.write_text(
        "# comments are fine\napi_port: 9090\nworker_labels: {gpu: a100}\n"
        "job_env_allow: [LANG]\nworker_reserved: true\n"
    )
    config = Config()
    assert (config.api_port, config.worker_labels) == (9090, {"gpu": "a100"})
    assert (config.job_env_allow, config.worker_reserved) == (["LANG"], True)
    assert config.config == settings_file


def test_an_empty_config_file_sets_nothing(settings_file: Path) -> None:
    settings_file.write_text("# nothing yet\n")
    assert Config().api_port == 8080


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("api_prot: 9090\n", r"unknown setting 'api_prot' in config file .*settings\.yaml"),
        ("API_PORT: 9090\n", r"unknown setting 'API_PORT' .* \(did you mean 'api_port'\?\)"),
        ("config: other.yaml\n", r"'config' cannot be set inside a config file"),
        ("- api_port\n", r"must be a mapping of setting: value"),
        ("api_port: [\n", r"is not valid YAML"),
    ],
)
def test_a_config_file_that_cannot_be_used_is_refused_naming_why(
    settings_file: Path, text: str, error: str
) -> None:
    settings_file.write_text(text)
    with pytest.raises(ConfigFileError, match=error):
        Config()


def test_a_missing_or_unreadable_config_file_is_an_error_naming_it(settings_file: Path) -> None:
    with pytest.raises(ConfigFileError, match=f"cannot read config file {settings_file}: No such"):
        Config()
    settings_file.mkdir()
    with pytest.raises(ConfigFileError, match=f"cannot read config file {settings_file}: Is a"):
        Config()


def test_a_config_file_value_is_checked_like_any_other(settings_file: Path) -> None:
    settings_file.write_text("lookahead_ms: 70000\nhorizon_ms: 60000\n")
    with pytest.raises(ValidationError, match=r"horizon_ms .* lookahead_ms"):
        Config()


def test_the_log_delete_grace_setting_defaults_to_retentions_own() -> None:
    """config sits below the scheduler in the layers, so the default is a literal."""
    from etcdsched.config import Config
    from etcdsched.scheduler.retention import LOG_DELETE_GRACE_MS

    assert Config().retention_log_delete_grace_ms == LOG_DELETE_GRACE_MS
