"""Config: precedence, validation messages, TOML round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstream.cli import main
from rollstream.config import Config, load_config, to_toml, validate
from rollstream.errors import ConfigError


def test_defaults_validate() -> None:
    config = load_config(environ={})
    assert config == Config()
    assert config.rl.group_size == 8 and config.infra.topic_prefix == "rollstream."


def test_precedence_file_then_env_then_set(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[learner]\nlr = 1e-5\nmicro_batch = 2\n[rl]\ngroup_size = 4\n")
    env = {"ROLLSTREAM__LEARNER__LR": "2e-5", "ROLLSTREAM__RL__GROUP_SIZE": "6", "UNRELATED": "x"}
    config = load_config(path, ["rl.group_size=16"], environ=env)
    assert config.learner.lr == 2e-5  # env beats file
    assert config.learner.micro_batch == 2  # file beats default
    assert config.rl.group_size == 16  # --set beats env


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("learner.lrr=1", "unknown config key 'learner.lrr'; allowed here: model, device, lr"),
        ("nosuch.key=1", "unknown config key 'nosuch'; allowed here: infra, rl, sampler"),
        ("stream.estimator=ppo", "'stream.estimator'.*one of 'grpo', 'dr_grpo', 'rloo'"),
        ("rl.group_size=0", "'rl.group_size'.*>= 1"),
        ("learner.lr=fast", "'learner.lr'.*float"),
        ("learner=1", "expected section.key"),
        ("learner.broadcast_every=3", r"broadcast_every \(3\) must be at most rl.max_staleness \+ 1 \(2\)"),
    ],
)
def test_wrong_key_or_value_names_it(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override], environ={})


def test_bad_toml_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[learner\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", environ={})


def test_show_round_trips(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["config", "show", "--set", "learner.lr=3e-6", "--set", "sampler.family_weights={a = 2.0}"]) == 0
    text = capsys.readouterr().out
    assert "lr = 3e-06" in text
    import tomllib

    assert validate(tomllib.loads(text)) == load_config(
        None, ["learner.lr=3e-6", "sampler.family_weights={a = 2.0}"], environ={}
    )
    assert validate(tomllib.loads(to_toml(Config()))) == Config()


def test_cli_reports_config_errors_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--set", "rl.max_staleness=-1"]) == 2
    assert "rl.max_staleness" in capsys.readouterr().err


def test_broadcasts_as_rare_as_the_staleness_bound_allows_are_accepted() -> None:
    config = load_config(None, ["rl.max_staleness=3", "learner.broadcast_every=4"], environ={})
    assert config.learner.broadcast_every == 4
