"""Config: precedence, validation messages, TOML round trip."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from rollstream.cli import main
from rollstream.config import (
    Config,
    SGLangConfig,
    SimExecutorConfig,
    SimGeneratorConfig,
    SimLearnerConfig,
    TransformersConfig,
)
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
                                "generator.backend.url='http://s:1'"], environ={})
    assert config.learner.loss.clip_high == 0.3 and config.learner.lora.rank == 4
    assert isinstance(config.generator.backend, SGLangConfig)
    assert config.generator.backend.url == "http://s:1" and config.generator.backend.concurrency == 64
    plain = load_config(None, [], environ={})
    assert plain.learner.lora is None and plain.generator.backend == TransformersConfig()  # off unless asked for
    assert load_config(None, ["generator.backend='sglang'"], environ={}).generator.backend.url  # its defaults


def test_a_backend_is_a_table_named_by_its_kind(tmp_path: Path) -> None:
    path = tmp_path / "sim.toml"
    path.write_text("[generator.backend]\nkind = 'sim'\nper_row_s = 0.01\n\n"
                    "[executor]\nbackend = {kind = 'sim', seconds = 0.5}\n\n[learner]\nbackend = 'sim'\n")
    config = load_config(path, [], environ={})
    assert config.generator.backend == SimGeneratorConfig(per_row_s=0.01)
    assert config.executor.backend == SimExecutorConfig(seconds=0.5)
    assert config.learner.backend == SimLearnerConfig() and config.learner.backend.kind == "sim"
    # a layer naming the same kind merges into the table under it; another kind replaces it
    same = load_config(path, ["generator.backend=sim", "generator.backend.sigma=0.1"], environ={})
    assert same.generator.backend == SimGeneratorConfig(per_row_s=0.01, sigma=0.1)
    other = load_config(path, [], environ={"ROLLSTREAM__GENERATOR__BACKEND": "sglang"})
    assert other.generator.backend == SGLangConfig()
    # the kind and its keys in either order in one layer
    assert load_config(None, ["generator.backend.url=http://a:1", "generator.backend=sglang"],
                       environ={}).generator.backend == SGLangConfig(url="http://a:1")
    # written back as TOML and read again: the same config
    assert validate(tomllib.loads(to_toml(config))) == config
    assert "[generator.backend]\nkind = \"sim\"" in to_toml(config)


@pytest.mark.parametrize(("sets", "message"), [
    (["generator.backend.url=http://a:1"], r"'generator.backend' has no kind: .*'transformers', 'sglang', 'scripted', 'sim'"),
    (["generator.backend=vllm"], r"'generator.backend' has kind = 'vllm'"),
    (["executor.backend=gvisor"], r"'executor.backend' has kind = 'gvisor': .*'docker', 'sim'"),
    (["generator.backend=sim", "generator.backend.url=http://a:1"],
     r"unknown config key 'generator.backend.url'; allowed here \(kind 'sim'\): base_s"),
    (["learner.backend=sim", "learner.backend.per_token_s=-1"], r"'learner.backend.per_token_s'.*>= 0.0"),
])
def test_a_wrong_backend_table_names_the_kinds_and_keys(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets, environ={})


@pytest.mark.parametrize(("text", "kind", "key"), [
    ("[generator]\nbackend = 'sim'\n\n[generator.sim]\nbase_s = 0.1\n", "sim", ""),
    ("[generator.sglang]\nurl = 'http://s:1'\n", "sglang", ""),
    ("[generator]\nscripted_answers = 'a.jsonl'\n", "scripted", "answers"),
    ("[executor]\nsim_seconds = 0.1\n", "sim", "seconds"),
    ("[learner]\nsim_per_token_s = 0.1\n", "sim", "per_token_s"),
])
def test_the_backend_sections_before_the_tagged_tables_are_refused(tmp_path: Path, text: str, kind: str,
                                                                   key: str) -> None:
    path = tmp_path / "old.toml"
    path.write_text(text)
    section = text.strip("[").split("]")[0].split(".")[0]
    with pytest.raises(ConfigError, match=rf"moved into the backend's table {section}.backend: write "
                                          rf"\[{section}.backend\] kind = '{kind}'" + (f" and {key} =" if key else "")):
        load_config(path, [], environ={})


@pytest.mark.parametrize(("where", "text", "new"), [
    ("file", "[learner]\nlr = 3e-6\n", "learner.optim.lr"),
    ("file", "[learner]\ncheckpoint_dir = 'ck'\n", "learner.checkpoint.dir"),
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
    with pytest.raises(ConfigError, match="learner.backend = 'sim' trains nothing"):
        load_config(None, ["learner.backend=sim", "learner.ranks=2", "learner.parallel=ddp"], environ={})


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


def test_a_config_written_over_a_profile_resolves_to_itself_over_it(tmp_path: Path) -> None:
    """``to_toml(config, base)``: only what differs from ``base`` (a bench's run over the profile
    `rollstream run` applies); read back over the same profile, the same config, where a whole
    dump would have put the defaults back over the profile's settings."""
    import msgspec

    from rollstream.config import SimGeneratorConfig
    from rollstream.config_load import profile_path, profiled

    base = profiled("quick")
    assert base != Config() and to_toml(base, base) == ""
    replace = msgspec.structs.replace
    config = replace(base, rl=replace(base.rl, group_size=3),
                     generator=replace(base.generator, backend=SimGeneratorConfig(base_s=0.5)),
                     learner=replace(base.learner, checkpoint=replace(base.learner.checkpoint, every=0)))
    text = to_toml(config, base)
    assert "[executor]" not in text and "[rl]\ngroup_size = 3\n" in text
    assert "[generator.backend]\nkind = \"sim\"\nbase_s = 0.5" in text and "[learner.checkpoint]\nevery = 0" in text
    path = tmp_path / "over.toml"
    path.write_text(text)
    assert load_config(path, environ={}, profile=profile_path("quick")) == config
    named = replace(base, eval=replace(base.eval, model="smollm2"))
    with pytest.raises(ValueError, match="cannot unset"):  # a file cannot say None over a value
        to_toml(base, named)
