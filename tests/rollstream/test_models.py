"""The one model loader (rollstream/models.py): resolving specs, the converted-model cache's key,
the tokenizer settings, plain copies of GGUF-loaded models; and, on the real SmolLM2, that the
generator and the learner tokenize a chat prompt and a completion to the same ids."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from rollstream import models
from rollstream.config import CheckpointConfig, Config, LearnerConfig
from rollstream.errors import ModelError
from rollstream.models import (
    ModelFiles,
    converted_dir,
    load_model,
    load_policy,
    load_tokenizer,
    plain_model_from,
    resolve_model,
)
from rollstream.testing import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    """A file that resolves like a GGUF (resolving never reads it)."""
    path = tmp_path / "wheel" / "Tiny.Q4_1.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(60))
    return path


@pytest.mark.unit
def test_a_local_directory_resolves_to_itself(tiny_dir: Path) -> None:
    assert resolve_model(str(tiny_dir)) == ModelFiles(tiny_dir)
    assert ModelFiles(tiny_dir).load_kwargs() == {"local_files_only": True}


@pytest.mark.unit
@pytest.mark.parametrize("spec", ["no/such/dir", "smollm3", "."])
def test_a_spec_that_names_nothing_loadable_is_refused(spec: str) -> None:
    with pytest.raises(ModelError, match="neither"):
        resolve_model(spec)


@pytest.mark.unit
def test_a_gguf_resolves_to_its_converted_copy_once_that_is_complete(fake_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    as_gguf = ModelFiles(fake_gguf.parent, fake_gguf.name)
    assert resolve_model(str(fake_gguf), cache) == as_gguf
    assert as_gguf.load_kwargs() == {"local_files_only": True, "gguf_file": fake_gguf.name}
    copy = converted_dir(fake_gguf, cache)
    copy.mkdir(parents=True)
    assert resolve_model(str(fake_gguf), cache) == as_gguf  # no config.json: not a finished copy
    (copy / "config.json").write_text("{}")
    assert resolve_model(str(fake_gguf), cache) == ModelFiles(copy)
    assert resolve_model(str(fake_gguf), None) == as_gguf  # no cache: always the GGUF


@pytest.mark.unit
def test_a_copy_written_by_the_old_loaders_is_never_read(fake_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    stat = fake_gguf.stat()
    old = cache / f"{fake_gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"  # the key before CACHE_FORMAT
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    assert converted_dir(fake_gguf, cache) != old
    assert resolve_model(str(fake_gguf), cache).gguf_file == fake_gguf.name


@pytest.mark.unit
def test_the_cache_key_changes_with_the_file_and_the_format(fake_gguf: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    first = converted_dir(fake_gguf, tmp_path)
    assert first.parent == tmp_path and first.name.startswith(fake_gguf.stem)
    assert first.name.endswith(f"-v{models.CACHE_FORMAT}")
    stat = fake_gguf.stat()
    os.utime(fake_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert converted_dir(fake_gguf, tmp_path) != first
    monkeypatch.setattr(models, "CACHE_FORMAT", models.CACHE_FORMAT + 1)
    assert converted_dir(fake_gguf, tmp_path).name.endswith(f"-v{models.CACHE_FORMAT}")


@pytest.mark.unit
def test_tokenizer_settings_are_applied_on_load_whatever_was_saved(tiny_dir: Path, tmp_path: Path) -> None:
    import shutil

    saved = tmp_path / "saved-otherwise"
    shutil.copytree(tiny_dir, saved)
    config_file = saved / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(clean_up_tokenization_spaces=True, pad_token=None)
    config_file.write_text(json.dumps(config))
    tokenizer = load_tokenizer(str(saved))
    assert tokenizer.clean_up_tokenization_spaces is False
    assert tokenizer.pad_token_id == tokenizer.eos_token_id is not None  # no pad saved: eos
    text = "def f(a, b) :\n    return a , b . don 't"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text  # the exact text, spaces before punctuation kept
    own = load_tokenizer(str(tiny_dir))
    assert own.pad_token == "<|endoftext|>" and own.clean_up_tokenization_spaces is False  # a saved pad stays


@pytest.mark.unit
def test_a_directory_without_a_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "bare")
    assert load_tokenizer(str(tmp_path / "bare"), missing_ok=True) is None
    with pytest.raises(ModelError, match="tokenizer"):
        load_tokenizer(str(tmp_path / "bare"))
    model = load_model(str(tmp_path / "bare"))
    assert not model.training and next(model.parameters()).dtype == torch.float32


@pytest.mark.unit
def test_load_policy_of_a_directory(tiny_dir: Path) -> None:
    model, tokenizer = load_policy(str(tiny_dir), dtype=torch.bfloat16)
    assert not model.training
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert tokenizer.clean_up_tokenization_spaces is False
    assert models.load_model_config(str(tiny_dir)).vocab_size == model.config.vocab_size


@pytest.mark.unit
def test_plain_model_from_drops_quantization_config(tiny_dir: Path, tmp_path: Path) -> None:
    model = load_model(str(tiny_dir))
    # as a GGUF load leaves it
    model.config.quantization_config = {"quant_method": "gguf", "gguf_file": "x.gguf"}
    plain = plain_model_from(model)
    assert not hasattr(plain.config, "quantization_config")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in plain.state_dict().items())
    assert models.tied_parameter_names(plain) == ["lm_head.weight"]
    plain.save_pretrained(tmp_path / "plain")
    reloaded = load_model(str(tmp_path / "plain"))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in reloaded.state_dict().items())


@pytest.mark.unit
def test_save_converted_is_atomic_and_keeps_a_finished_copy(tiny_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load_policy(str(tiny_dir))
    target = tmp_path / "cache" / "copy"
    models.save_converted(model, tokenizer, target)
    assert (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == ["copy"]  # no partial left behind
    (target / "marker").write_text("first")
    models.save_converted(model, tokenizer, target)  # already there: left alone
    assert (target / "marker").read_text() == "first"


@pytest.mark.integration
def test_generator_and_learner_tokenize_a_chat_prompt_and_a_completion_alike(tmp_path: Path) -> None:
    """Each stage's own loading path, on the real SmolLM2 (the first run converts the GGUF: 60-100 s)."""
    from rollstream.consumers.generator.backends.hf import TransformersBackend
    from rollstream.consumers.generator.chat import chat_prompt_ids
    from rollstream.learner.train import build_trainer

    generator = TransformersBackend.load("smollm2")  # the transformers generator and eval
    config = Config(learner=LearnerConfig(model="smollm2", checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"))))
    trainer, learner_tokenizer, _, _ = build_trainer(config, resume_from=None)
    tokenizers = {
        "generator": generator.tokenizer,
        "learner": learner_tokenizer,
        "sglang generator": load_tokenizer("smollm2"),  # what consumers.generator.build_backend gives SGLang
        "straight from the GGUF": load_tokenizer("smollm2", cache_dir=None),  # never the cached copy
    }
    messages = [
        {"role": "system", "content": "You write Python.  Answer with code only."},
        {"role": "user", "content": "Write add(a, b) that returns a + b ; don't print ."},
    ]
    completion = "```python\ndef add(a, b) :\n    return a + b  # it 's done , isn't it ?\n```<|im_end|>"
    prompt_ids = chat_prompt_ids(generator.tokenizer, messages)
    completion_ids = generator.tokenizer(completion, add_special_tokens=False)["input_ids"]
    assert len(prompt_ids) > 20 and completion_ids[-1] == 2  # <|im_end|> is one special token
    for name, tokenizer in tokenizers.items():
        assert chat_prompt_ids(tokenizer, messages) == prompt_ids, name
        assert tokenizer(completion, add_special_tokens=False)["input_ids"] == completion_ids, name
        assert tokenizer.decode(completion_ids) == completion, name  # the exact text, nothing cleaned up
        assert tokenizer.clean_up_tokenization_spaces is False, name
        assert tokenizer.pad_token_id == generator.tokenizer.pad_token_id is not None, name
    assert trainer.pad_id == generator.tokenizer.pad_token_id
    learner_model = trainer.model
    assert all(torch.equal(v, learner_model.state_dict()[k]) for k, v in generator.model.state_dict().items())
