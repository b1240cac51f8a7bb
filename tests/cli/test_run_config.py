"""`rollstream run` writes the resolved config to the run directory and starts every process from
it: the file reloads to the same config, keeps no password, and the children's environment
carries the passwords and none of the ROLLSTREAM_ variables that would override the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstream.cli.main import main
from rollstream.cli.run import CONFIG_FILE, write_run_config
from rollstream.config_load import load_config, profile_path

pytestmark = pytest.mark.unit


def test_the_run_config_reloads_to_the_same_config_without_its_passwords(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLSTREAM__LEARNER__MAX_STEPS", "100")  # the run's own --set wins over it
    monkeypatch.setenv("ROLLSTREAM_CONFIG", str(tmp_path / "elsewhere.toml"))
    resolved = load_config(None, ["learner.max_steps=4", "infra.redis_url=redis://u:s3cret@10.0.0.9:6380/2",
                                  "rl.group_size=6", "sampler.sources=['builtin']", "eval.ks=[1, 4]",
                                  "eval.samples=4"],
                           environ={}, profile=profile_path("quick"))
    path, env = write_run_config(resolved, tmp_path / "run")
    text = path.read_text()
    assert path == tmp_path / "run" / CONFIG_FILE
    assert "s3cret" not in text and 'redis_url = "redis://***@10.0.0.9:6380/2"' in text
    assert not any(k.startswith("ROLLSTREAM__LEARNER") or k == "ROLLSTREAM_CONFIG" for k in env)
    assert env["ROLLSTREAM__INFRA__REDIS_URL"] == '"redis://u:s3cret@10.0.0.9:6380/2"'
    assert load_config(str(path), [], environ=env) == resolved  # what each child resolves


def test_config_show_run_prints_what_the_run_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    resolved = load_config(None, ["rl.group_size=5"], environ={})
    write_run_config(resolved, tmp_path / "runs" / "r1")
    assert main(["config", "show", "--run", str(tmp_path / "runs" / "r1")]) == 0
    assert "group_size = 5" in capsys.readouterr().out
    assert main(["config", "show", "--set", f"infra.state_dir={tmp_path}", "--run", "nope"]) == 2
    assert "no " in capsys.readouterr().err


@pytest.mark.unit
def test_a_run_cleans_up_after_the_reader_of_its_output_is_gone(tmp_path: Path) -> None:
    """`rollstream run` stops its children, deletes its Redis keys and stops the broker in a
    ``finally`` that prints: with its reader killed (EPIPE) every print raised and cut that
    cleanup short. Its streams there drop output once the reader is gone."""
    import subprocess
    import sys

    marker = tmp_path / "cleaned"
    code = ("import sys, time\n"
            "from rollstream.cli.run import ReaderMayBeGone\n"
            "time.sleep(0.5)\n"
            "sys.stdout = ReaderMayBeGone(sys.stdout)\n"
            "for _ in range(200):\n"
            "    print('x' * 1000, flush=True)\n"
            "open(sys.argv[1], 'w').write('cleaned')\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(marker)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader goes away before the first print
    assert proc.wait(timeout=60) == 0
    assert marker.read_text() == "cleaned"
