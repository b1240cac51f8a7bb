"""`.ci/register-runsc`: gVisor registered with dockerd's daemon.json, idempotently, keeping the
rest of the file (what `.ci/install` relies on to reload dockerd only when it changed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "register-runsc"


def register(daemon_json: Path, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(daemon_json)], capture_output=True, text=True,
                          env={**os.environ, "PATH": path}, timeout=30)


def test_registers_once_and_keeps_the_rest(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runsc = bin_dir / "runsc"
    runsc.write_text("#!/bin/sh\n")
    runsc.chmod(0o755)
    daemon = tmp_path / "daemon.json"
    daemon.write_text(json.dumps({"log-level": "warn", "runtimes": {"kata": {"path": "/usr/bin/kata"}}}))
    first = register(daemon, str(bin_dir))
    assert first.returncode == 0, first.stderr  # changed: dockerd is to be reloaded
    conf = json.loads(daemon.read_text())
    assert conf["log-level"] == "warn" and conf["runtimes"]["kata"] == {"path": "/usr/bin/kata"}
    assert conf["runtimes"]["runsc"] == {"path": str(runsc), "runtimeArgs": ["--network=none", "--host-uds=open"]}
    assert register(daemon, str(bin_dir)).returncode == 1  # already so: nothing to reload
    conf["runtimes"]["runsc"]["runtimeArgs"] = []  # a registration without --network=none is corrected
    daemon.write_text(json.dumps(conf))
    assert register(daemon, str(bin_dir)).returncode == 0
    assert json.loads(daemon.read_text())["runtimes"]["runsc"]["runtimeArgs"] == ["--network=none", "--host-uds=open"]


def test_without_runsc_it_says_how_to_install_it(tmp_path: Path):
    daemon = tmp_path / "daemon.json"
    done = register(daemon, str(tmp_path))
    assert done.returncode == 2 and "apt-get install runsc" in done.stderr and not daemon.exists()
