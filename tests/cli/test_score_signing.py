"""``rollstream score`` signs its verdicts when a key is configured and stops, naming the file, when
the key cannot be read; ``rollstream verify --scores`` checks them and names a field changed
afterwards. Unit tier: the sim backend scores (nothing runs)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json

import pytest

from rollstream.attest import new_keypair
from rollstream.cli.verify import verify_main
from rollstream.config import AttestConfig, Config, ExecutorConfig, SimExecutorConfig
from rollstream.consumers.executor.score import score_file, score_main
from rollstream.consumers.executor.sim_sandbox import SimSandbox
from rollstream.errors import ConfigError

pytestmark = pytest.mark.unit

REFERENCE = "def add(a, b):\n    return a + b"
TASK = {"task_id": "add/0", "family": "add", "prompt": "Write add(a, b).", "reference_solution": REFERENCE,
        "reward": {"entry_point": "add", "tests": ["assert add(1, 2) == 3"]}}


def pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"task": TASK, "completion": f"```python\n{code}\n```", "id": f"c{i}"}) + "\n"
                            for i, code in enumerate([REFERENCE, "def add(a, b):\n    return a - b"])))
    return path


def score(config: Config, path) -> list[dict]:
    out = io.StringIO()
    counts = asyncio.run(score_file(config, [str(path)], out, backend=SimSandbox(config, [REFERENCE])))
    assert counts["errors"] == 0, out.getvalue()
    return [json.loads(line) for line in out.getvalue().splitlines()]


def verify(config: Config, scores, keys, out) -> int:
    return asyncio.run(verify_main(config, argparse.Namespace(
        run=None, archive=None, scores=str(scores), keys=str(keys), sample=0, all=False, seed=0, json_out=str(out))))


def test_score_signs_with_a_configured_key_and_verify_names_a_changed_field(tmp_path, capsys) -> None:
    private, public, _ = new_keypair(tmp_path / "keys", "exec-1")
    config = Config(executor=ExecutorConfig(backend=SimExecutorConfig(), attest=AttestConfig(key_file=str(private))))
    verdicts = score(config, pairs(tmp_path))
    assert [v["reward"] > 0 for v in verdicts] == [True, False]
    assert all(v["attestation"]["key_id"].startswith("ed25519-") for v in verdicts)
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps(v) + "\n" for v in verdicts))
    assert verify(config, scores, public.parent, tmp_path / "ok.json") == 0, capsys.readouterr().out
    assert json.loads((tmp_path / "ok.json").read_text()) == {"verdicts": 2, "findings": []}

    verdicts[1] = {**verdicts[1], "reward": verdicts[0]["reward"], "outcome": "passed"}  # a failure made a pass
    scores.write_text("".join(json.dumps(v) + "\n" for v in verdicts))
    assert verify(config, scores, public.parent, tmp_path / "bad.json") == 1
    [finding] = json.loads((tmp_path / "bad.json").read_text())["findings"]
    assert finding == {"rollout_id": "line 2", "kind": "score", "detail": "changed after signing: outcome, reward"}
    assert "NOT VERIFIED line 2: score: changed after signing: outcome, reward" in capsys.readouterr().out

    assert "attestation" not in score(Config(executor=ExecutorConfig(backend=SimExecutorConfig())), pairs(tmp_path))[0]  # no key configured: unsigned, as before


def test_score_with_a_key_that_cannot_be_read_fails_naming_it(tmp_path) -> None:
    missing = tmp_path / "gone.key"
    config = Config(executor=ExecutorConfig(backend=SimExecutorConfig(), attest=AttestConfig(key_file=str(missing))))
    path = pairs(tmp_path)
    for run in (lambda: score_file(config, [str(path)], io.StringIO(), backend=SimSandbox(config, [REFERENCE])),
                lambda: score_main(config, [str(path)], str(tmp_path / "out.jsonl"))):
        with pytest.raises(ConfigError) as error:
            asyncio.run(run())
        assert str(missing) in str(error.value) and "rollstream keys new" in str(error.value)
    assert not (tmp_path / "out.jsonl").exists() or (tmp_path / "out.jsonl").read_text() == ""


def test_the_command_line_says_so_and_exits_nonzero(tmp_path, capsys) -> None:
    """``rollstream score --set executor.attest.key_file=MISSING`` exits 2 with the message on
    stderr, before any sandbox starts; ``rollstream keys new`` then gives a key that works."""
    from rollstream.cli.main import main

    path, missing = pairs(tmp_path), tmp_path / "missing.key"
    assert main(["score", str(path), "--set", f"executor.attest.key_file={missing}"]) == 2
    said = capsys.readouterr()
    assert str(missing) in said.err and "rollstream keys new" in said.err and said.out == ""
    assert main(["keys", "new", "--dir", str(tmp_path / "keys"), "--id", "exec-9"]) == 0
    assert f'key_file = "{tmp_path / "keys" / "exec-9.key"}"' in capsys.readouterr().out
