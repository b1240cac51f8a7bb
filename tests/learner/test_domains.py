"""Code and math trained together (learner/domains.py): per-domain advantage normalisation over a
step and per-domain loss weights, pure; where the domain comes from (the generator) and that it
travels through the stream's decision; one step through the learner loop's own code."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import torch

from rollstream.config import Config, LearnerConfig, LossConfig, OptimConfig, StreamConfig
from rollstream.config_load import load_config
from rollstream.consumers.generator.backends.base import Completion
from rollstream.consumers.generator.stage import action_from
from rollstream.errors import ConfigError
from rollstream.kafka import Delivery
from rollstream.learner import ledger as ledger_module
from rollstream.learner.batch import collate, micro_batches
from rollstream.learner.domains import domain_scales, loss_weights, normalise_by_domain
from rollstream.learner.metrics import LearnerMetrics
from rollstream.learner.train import LearnerLoop, Lineage
from rollstream.learner.trainer import Trainer
from rollstream.metrics import StageMetrics
from rollstream.schemas import GroupAdvantaged, RewardSpec, codec
from rollstream.schemas.events import AdvantagedRollout, Rollout
from rollstream.streams.estimators import group_advantages
from rollstream.streams.groups import LoadedGroup, decide
from rollstream.tasks import DOMAINS
from rollstream.testing import make_prompt, make_reward
from tests.helpers import group, rollout, tiny_model

pytestmark = pytest.mark.unit
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def item(domain: str, advantage: float, index: int = 0, *, family: str = "t", group_id: str = "g",
         completion: list[int] | None = None) -> AdvantagedRollout:
    r = rollout(group_id, index, [1, 2, 3], completion or [4 + index, 5, 6 + index])
    return AdvantagedRollout(rollout=msgspec.structs.replace(r, domain=domain, family=family),
                             reward=advantage, advantage=advantage)


def std(values: list[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


# --- the pure math -------------------------------------------------------------------------------


def test_each_domain_gets_one_over_its_own_std() -> None:
    pairs = [("code", 0.3), ("code", -0.1), ("code", -0.2), ("math", 0.5), ("math", -0.5)]
    scales = domain_scales(pairs)
    assert scales["code"] == pytest.approx(1 / std([0.3, -0.1, -0.2]))
    assert scales["math"] == pytest.approx(1 / std([0.5, -0.5]))
    assert set(scales) == {"code", "math"}


def test_a_domain_without_spread_is_left_as_it_is() -> None:
    assert domain_scales([("math", 0.7)]) == {"math": 1.0}  # one rollout: no std
    assert domain_scales([("code", 0.2), ("code", 0.2), ("math", 1.0), ("math", -1.0)])["code"] == 1.0
    assert domain_scales([]) == {}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_advantage_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        domain_scales([("code", 1.0), ("code", bad)])


def test_step_normalisation_gives_every_domain_unit_std_and_keeps_baselines() -> None:
    items = ([item("code", a, i) for i, a in enumerate([0.1, -0.05, -0.05, 0.2, -0.2])]
             + [item("math", a, 10 + i) for i, a in enumerate([0.5, -0.5, 0.5, -0.5])])
    out, scales = normalise_by_domain(items, "step")
    for domain in ("code", "math"):
        before = [i.advantage for i in items if i.rollout.domain == domain]
        after = [o.advantage for o in out if o.rollout.domain == domain]
        assert std(after) == pytest.approx(1.0)
        assert after == pytest.approx([a * scales[domain] for a in before])  # scaled, not re-centred
        assert [a > 0 for a in after] == [b > 0 for b in before]
    assert [o.rollout for o in out] == [i.rollout for i in items]  # only the advantage changes
    assert [o.reward for o in out] == [i.reward for i in items]


def test_an_unrecorded_domain_is_normalised_on_its_own() -> None:
    items = [item("", 2.0, 0), item("", -2.0, 1), item("code", 0.5, 2), item("code", -0.5, 3)]
    out, scales = normalise_by_domain(items, "step")
    assert set(scales) == {"", "code"}
    assert std([o.advantage for o in out[:2]]) == pytest.approx(1.0)
    assert std([o.advantage for o in out[2:]]) == pytest.approx(1.0)


def test_off_trains_the_streams_advantages_unchanged() -> None:
    items = [item("code", 0.3, 0), item("math", -0.9, 1), item("math", 0.9, 2)]
    out, scales = normalise_by_domain(items, "none")
    assert scales == {} and all(o is i for o, i in zip(out, items))
    with pytest.raises(ValueError, match="domain normalisation"):
        normalise_by_domain(items, "running")


def test_one_grpo_group_per_domain_is_left_within_1e6() -> None:
    """grpo per group has unit-std advantages already: a domain of one such group barely moves."""
    code = group_advantages([0.2, 0.5, 0.5, 0.9, -0.2], "grpo")
    math_ = group_advantages([1.0, 0.0, 0.0, 0.0], "grpo")
    items = [item("code", a, i) for i, a in enumerate(code)] + [item("math", a, 9 + i) for i, a in enumerate(math_)]
    out, scales = normalise_by_domain(items, "step")
    assert scales["code"] == pytest.approx(1.0, abs=1e-5) and scales["math"] == pytest.approx(1.0, abs=1e-5)
    assert [o.advantage for o in out] == pytest.approx(code + math_, abs=1e-5)


def test_dr_grpo_domains_of_different_reward_scales_come_out_comparable() -> None:
    """dr_grpo never divides: 0/1 answers and graded rewards differ in scale until normalised."""
    code = [a for rewards in ([0.1, 0.2, 0.15, 0.25], [0.3, 0.35, 0.3, 0.4])
            for a in group_advantages(rewards, "dr_grpo")]
    math_ = group_advantages([1.0, 0.0, 1.0, 0.0], "dr_grpo")
    items = [item("code", a, i) for i, a in enumerate(code)] + [item("math", a, 20 + i) for i, a in enumerate(math_)]
    assert std(math_) / std(code) > 5
    out, _ = normalise_by_domain(items, "step")
    assert std([o.advantage for o in out[:8]]) == pytest.approx(std([o.advantage for o in out[8:]]))


def test_loss_weights_are_family_times_domain() -> None:
    items = [item("code", 1.0, 0, family="a"), item("math", 1.0, 1, family="a"),
             item("math", 1.0, 2, family="b"), item("", 1.0, 3, family="b")]
    assert loss_weights(items) is None
    assert loss_weights(items, {}, {}) is None
    assert loss_weights(items, None, {"code": 1.0, "math": 1.0}) is None  # all 1: no weights at all
    assert loss_weights(items, None, {"math": 0.5}) == [1.0, 0.5, 0.5, 1.0]
    assert loss_weights(items, {"b": 3.0}, {"math": 0.5, "code": 2.0}) == [2.0, 0.5, 1.5, 3.0]
    assert loss_weights(items, None, {"code": 0.0}) == [0.0, 1.0, 1.0, 1.0]


def test_collate_carries_the_domain_weights() -> None:
    items = [item("code", 1.0, 0), item("math", -1.0, 1)]
    assert collate(items).weights is None
    assert collate(items, domain_weights={"code": 1.0, "math": 1.0}).weights is None
    assert collate(items, domain_weights={"math": 0.25}).weights.tolist() == [1.0, 0.25]
    assert collate(items, family_weights={"t": 2.0}, domain_weights={"math": 0.25}).weights.tolist() == [2.0, 0.5]
    [batch] = micro_batches(items, 4, domain_weights={"code": 3.0})
    assert sorted(batch.weights.tolist()) == [1.0, 3.0]


def _gradient(domain_weights: dict[str, float]) -> torch.Tensor:
    torch.manual_seed(0)
    model = tiny_model()
    items = [item("code" if i < 2 else "math", 1.0 if i % 2 else -1.0, i, group_id=f"g{i}") for i in range(4)]
    settings = LearnerConfig(domain_loss_weights=domain_weights, loss=LossConfig(loss_agg="sequence_mean"))
    batch = collate(items, domain_weights=settings.domain_loss_weights)
    Trainer(model, settings)._micro_step(batch, None, batch.num_tokens, 4)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_domain_loss_weights_scale_each_domains_gradient() -> None:
    only_code, only_math, both = _gradient({"math": 0.0}), _gradient({"code": 0.0}), _gradient({})
    assert torch.allclose(only_code + only_math, both, atol=1e-6)
    assert torch.allclose(_gradient({"math": 0.0, "code": 3.0}), 3 * only_code, atol=1e-6)
    assert only_code.abs().sum() > 0 and only_math.abs().sum() > 0
    assert torch.equal(_gradient({"code": 1.0, "math": 1.0}), both)  # weight 1: today's gradient, bit for bit


# --- the config ----------------------------------------------------------------------------------


def test_unknown_domain_names_are_a_config_error_at_load(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[learner]\ndomain_loss_weights = {code = 1.0, maths = 2.0}\n')
    with pytest.raises(ConfigError, match=r"learner.domain_loss_weights: unknown domain\(s\) 'maths'; "
                                          r"the domains are code, math"):
        load_config(path)
    with pytest.raises(ConfigError, match="'Math'"):
        load_config(None, overrides=["learner.domain_loss_weights.Math=2"])
    with pytest.raises(ConfigError, match="domain_normalize"):
        load_config(None, overrides=["learner.domain_normalize=running"])
    assert load_config(None, overrides=["learner.domain_loss_weights.math=0.5"]).learner.domain_loss_weights == {
        "math": 0.5}


def test_defaults_change_nothing_and_the_mixed_recipe_turns_both_on() -> None:
    default = LearnerConfig()
    assert default.domain_normalize == "none" and default.domain_loss_weights == {}
    mixed = load_config(CONFIGS / "mixed.toml").learner
    assert mixed.domain_normalize == "step"
    assert set(mixed.domain_loss_weights) == set(DOMAINS)
    assert load_config(CONFIGS / "learning.toml").learner.domain_normalize == "none"


# --- where the domain comes from, and that it travels ----------------------------------------------


def test_the_generator_stamps_each_rollout_with_its_tasks_domain() -> None:
    completion = Completion(request_id="r", token_ids=[5, 6], logprobs=[-0.1, -0.2], text="\\boxed{3}",
                            finish_reason="stop", logprob_temperature=1.0, policy_version_first=0,
                            policy_version_last=0)
    code = make_prompt()
    math_prompt = msgspec.structs.replace(code, reward=RewardSpec(kind="math_answer", answer="3"))
    for prompt, domain in ((code, "code"), (math_prompt, "math")):
        action = action_from(prompt, 0, [1, 2], completion, generator_id="gen", queued_s=0.0, generate_s=0.0)
        assert action.rollout.domain == domain


def test_a_rollout_written_before_the_field_decodes_with_no_domain() -> None:
    r = rollout("g", 0, [1, 2], [3, 4])
    rollout_codec = codec(Rollout)
    fields = msgspec.msgpack.decode(rollout_codec.encode(r))  # the wire map, as an older writer's lacks it
    assert fields.pop("domain") == ""
    old = rollout_codec.decode(msgspec.msgpack.encode(fields))
    assert old.domain == "" and old == r


def test_the_streams_decision_carries_the_domain_and_todays_advantages() -> None:
    encode = codec(type(make_reward("g", 0, 1.0))).encode
    rewards = [0.0, 1.0, 1.0, 0.0]
    events = [make_reward("m", i, r) for i, r in enumerate(rewards)]
    events = [msgspec.structs.replace(e, rollout=msgspec.structs.replace(e.rollout, domain="math")) for e in events]
    loaded = LoadedGroup("m", 0, rollouts={e.rollout.rollout_id: encode(e) for e in events})
    event = codec(GroupAdvantaged).decode(decide([loaded], {}, StreamConfig(), 4, now=1.0)["m"].value)
    assert [r.rollout.domain for r in event.rollouts] == ["math"] * 4
    assert [r.advantage for r in event.rollouts] == group_advantages(rewards, "grpo")


# --- one step through the learner loop -----------------------------------------------------------


class Fakes:
    """The producer, consumer and Redis of the loop, recording what they are given."""

    def __init__(self) -> None:
        self.sent: list = []
        self.done: list = []

    async def send_many(self, records) -> None:
        self.sent.extend(records)

    def consume_done(self, delivery) -> None:
        self.done.append(delivery)

    async def getmany(self, **_kw) -> list:
        return []


def fake_consumer(fakes: Fakes) -> SimpleNamespace:
    raw = SimpleNamespace(pause=lambda *_: None, resume=lambda *_: None, paused=lambda: [], assignment=lambda: [])
    return SimpleNamespace(done=fakes.consume_done, getmany=fakes.getmany, raw=raw)


def _loop_step(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, learner: LearnerConfig
               ) -> tuple[list[AdvantagedRollout], torch.Tensor | None, dict]:
    """One ``LearnerLoop.step`` on a code group and a math group of different advantage scales:
    what the trainer trained on, the loss weights of its micro-batch, and the metrics' scales."""
    async def no_counts(*_args) -> None: ...

    monkeypatch.setattr(ledger_module, "count_outcomes", no_counts)
    code = group("code", [0.1, -0.1, 0.05, -0.05], seed=1)
    math_ = group("math", [0.5, -0.5, 0.5, -0.5], seed=2)
    groups = [msgspec.structs.replace(g, rollouts=[msgspec.structs.replace(
        r, rollout=msgspec.structs.replace(r.rollout, domain=g.group_id)) for r in g.rollouts])
        for g in (code, math_)]
    deliveries = [Delivery("advantages", 0, i, g.group_id.encode(), g, time.time()) for i, g in enumerate(groups)]
    fakes = Fakes()
    consumer = fake_consumer(fakes)
    config = Config(learner=learner)
    config = msgspec.structs.replace(config, learner=msgspec.structs.replace(
        learner, checkpoint=msgspec.structs.replace(learner.checkpoint, dir=str(tmp_path))))
    trainer = Trainer(tiny_model(), config.learner)
    trained, weights = [], []
    real_step, real_micro = trainer.step, trainer._micro_step
    trainer.step = lambda rollouts: (trained.extend(rollouts), real_step(rollouts))[1]  # type: ignore[method-assign]
    trainer._micro_step = lambda batch, *a: (weights.append(batch.weights), real_micro(batch, *a))[1]  # type: ignore[method-assign]
    metrics = LearnerMetrics(StageMetrics(f"test_domains_{id(trainer)}"))
    loop = LearnerLoop(config, trainer, None, Lineage(step=0, version=0), consumer, fakes, None, None,
                       metrics, "run-1")  # type: ignore[arg-type]
    assert asyncio.run(loop.step(deliveries))
    assert [fate.fate for _, fate in fakes.sent] == ["trained", "trained"] and len(fakes.done) == 2
    scales = {d: metrics.domain_scale.labels(d)._value.get() for d in ("code", "math")}
    return trained, weights[0] if len(weights) == 1 else None, scales


def test_a_learner_step_normalises_each_domain_and_weighs_its_loss(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    settings = LearnerConfig(micro_batch=16, prefix_sharing=False, domain_normalize="step",
                             domain_loss_weights={"math": 0.5}, optim=OptimConfig(lr=1e-3))
    trained, weights, scales = _loop_step(monkeypatch, tmp_path, settings)
    by_domain = {d: [r.advantage for r in trained if r.rollout.domain == d] for d in ("code", "math")}
    assert std(by_domain["code"]) == pytest.approx(1.0) and std(by_domain["math"]) == pytest.approx(1.0)
    assert scales["code"] == pytest.approx(1 / std([0.1, -0.1, 0.05, -0.05]))
    assert scales["math"] == pytest.approx(1 / std([0.5, -0.5, 0.5, -0.5]))
    assert weights is not None and sorted(weights.tolist()) == [0.5] * 4 + [1.0] * 4
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert msgspec.json.decode(lines[-1])["domain_scales"] == pytest.approx(scales)


def test_a_learner_step_with_the_defaults_trains_the_streams_advantages(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    trained, weights, _ = _loop_step(monkeypatch, tmp_path, LearnerConfig(micro_batch=16, prefix_sharing=False))
    assert sorted(r.advantage for r in trained) == sorted([0.1, -0.1, 0.05, -0.05, 0.5, -0.5, 0.5, -0.5])
    assert weights is None
