"""Config: precedence, validation messages, TOML round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstream.cli import main
from rollstream.config import Config
from rollstream.config_load import load_config, to_toml, validate
from rollstream.errors import ConfigError

pytestmark = pytest.mark.unit


def test_defaults_validate() -> None:
    config = load_config(environ={})
    assert config == Config()
    assert config.rl.group_size == 8 and config.infra.topic_prefix == "rollstream."


def test_precedence_profile_file_env_set(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text("[learner]\nmax_steps = 7\nmicro_batch = 3\n[learner.optim]\nwarmup_steps = 5\n")
    path = tmp_path / "c.toml"
    path.write_text("[learner]\nmicro_batch = 2\n[learner.optim]\nlr = 1e-5\n[rl]\ngroup_size = 4\n")
    env = {"ROLLSTREAM__LEARNER__OPTIM__LR": "2e-5", "ROLLSTREAM__RL__GROUP_SIZE": "6", "UNRELATED": "x"}
    config = load_config(path, ["rl.group_size=16"], environ=env, profile=profile)
    assert config.learner.optim.lr == 2e-5  # env beats file
    assert config.learner.micro_batch == 2  # file beats profile
    assert config.learner.max_steps == 7 and config.learner.optim.warmup_steps == 5  # profile beats default
    assert config.rl.group_size == 16  # --set beats env


def test_sections_nest_what_belongs_together() -> None:
    config = load_config(None, ["learner.loss.clip_high=0.3", "learner.lora.rank=4", "generator.backend='sglang'",
                                "generator.sglang.url='http://s:1'"], environ={})
    assert config.learner.loss.clip_high == 0.3 and config.learner.lora.rank == 4
    assert config.generator.sglang.url == "http://s:1" and config.generator.sglang.concurrency == 64
    plain = load_config(None, [], environ={})
    assert plain.learner.lora is None and plain.generator.sglang is None  # off unless asked for
    assert load_config(None, ["generator.backend='sglang'"], environ={}).generator.sglang.url  # its defaults


@pytest.mark.parametrize(("where", "text", "new"), [
    ("file", "[learner]\nlr = 3e-6\n", "learner.optim.lr"),
    ("file", "[learner]\ncheckpoint_dir = 'ck'\n", "learner.checkpoint.dir"),
    ("file", "[generator]\nbackend = 'sglang'\nsglang_url = 'http://old:1'\n", "generator.sglang.url"),
    ("set", "learner.kl_beta=0.1", "learner.loss.kl_beta"),
    ("env", "ROLLSTREAM__LEARNER__WARMUP_STEPS=3", "learner.optim.warmup_steps"),
    ("set", "learner.lora_rank=8", "learner.lora.rank"),
])
def test_old_flat_keys_are_refused_naming_the_new_key(tmp_path: Path, where: str, text: str, new: str) -> None:
    path = tmp_path / "old.toml"
    path.write_text(text if where == "file" else "")
    env = dict([text.split("=", 1)]) if where == "env" else {}
    with pytest.raises(ConfigError, match=rf"moved to {new}"):
        load_config(path, [text] if where == "set" else [], environ=env)


def test_the_old_lora_switch_is_refused_with_the_table_to_write() -> None:
    with pytest.raises(ConfigError, match=r"LoRA is on when a \[learner.lora\] table is present"):
        load_config(None, ["learner.lora=true"], environ={})


def test_combinations_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigError, match="adapter-only"):
        load_config(None, ["learner.lora.broadcast='adapters'"], environ={})
    with pytest.raises(ConfigError, match="generator.backend is 'transformers'"):
        load_config(None, ["generator.sglang.url='http://s:1'"], environ={})


def test_the_quick_profile_is_a_shipped_file() -> None:
    from rollstream.config_load import profile_path

    quick = profile_path("quick")
    assert quick.is_file() and quick.suffix == ".toml"
    config = load_config(None, [], environ={}, profile=quick)
    assert config.rl.group_size == 4 and config.generator.torch_threads == 1 and config.learner.optim.lr == 2e-6


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("learner.lrr=1", "unknown config key 'learner.lrr'; allowed here: model, device, micro_batch"),
        ("learner.optim.lrr=1", "unknown config key 'learner.optim.lrr'; allowed here: lr, weight_decay"),
        ("learner.lora.rankk=1", "unknown config key 'learner.lora.rankk'; allowed here: rank, broadcast"),
        ("nosuch.key=1", "unknown config key 'nosuch'; allowed here: infra, rl, sampler"),
        ("rl.group_size=0", "'rl.group_size'.*>= 1"),
        ("generator.dtype='float16'", "'generator.dtype'.*one of 'float32', 'bfloat16'"),
        ("learner.optim.lr=fast", "'learner.optim.lr'.*float"),
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
    settings = ["learner.optim.lr=3e-6", "sampler.family_weights={a = 2.0}", "learner.lora.rank=4"]
    assert main(["config", "show", *(a for s in settings for a in ("--set", s))]) == 0
    text = capsys.readouterr().out
    assert "[learner.optim]\nlr = 3e-06" in text and "[learner.lora]\nrank = 4" in text
    import tomllib

    assert validate(tomllib.loads(text)) == load_config(None, settings, environ={})
    assert validate(tomllib.loads(to_toml(Config()))) == Config()


def test_cli_reports_config_errors_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--set", "rl.max_staleness=-1"]) == 2
    assert "rl.max_staleness" in capsys.readouterr().err


def test_broadcasts_as_rare_as_the_staleness_bound_allows_are_accepted() -> None:
    config = load_config(None, ["rl.max_staleness=3", "learner.broadcast_every=4"], environ={})
    assert config.learner.broadcast_every == 4
