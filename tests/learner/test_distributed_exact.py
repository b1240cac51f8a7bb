"""2 gloo ranks under torchrun against the one-rank step (issue 26): loss, gradients and
SGD-updated weights within 1e-5 in fp32, ddp and fsdp, with and without LoRA; also with a KL
reference and PPO mini-batches (the gradients compared are those of the step's last update).
No service, but two processes that load torch: the integration tier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.learner.test_distributed import torchrun

pytestmark = pytest.mark.integration


def test_two_gloo_ranks_match_one_rank(tmp_path: Path) -> None:
    out = tmp_path / "exact.json"
    proc = torchrun("tests.learner.dist_exact", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    # {ddp, fsdp} x {full, lora} x {token_mean, sequence_mean}, and {ddp, fsdp} with KL and 2 updates
    assert len(report) == 10
    for case, diff in report.items():
        assert diff["tokens"][0] == diff["tokens"][1], case
        for key in ("loss", "grad_norm", "grads", "weights"):
            assert diff[key] <= 1e-5, (case, key, diff)
        assert diff["weights_moved"] > 1e-4, case  # the step did change the weights
