"""Read-only assets in real sandboxes (issue 37): a keyed pool mounts its set at /assets, read-only,
for the tasks that asked for it and no other; a wrong digest is the action's error; jobs without
assets keep the warm pool; an idle keyed pool goes with its volume. Pure logic: test_assets.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.assets import AssetError, local_digest
from rollstream.consumers.executor.jobs import Job
from rollstream.consumers.executor.pool import LABEL, OWNER_LABEL, DockerSandboxPool
from rollstream.consumers.executor.rewards import RewardRegistry
from rollstream.consumers.executor.score import evaluate
from rollstream.schemas.events import Asset, RewardSpec
from rollstream.tasks.outside import asset_tasks
from tests.fixtures.sandbox import check_references

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]  # containment: again under runsc in CI


async def volumes_of(owner: str) -> list[str]:
    import aiodocker

    async with aiodocker.Docker() as docker:
        found = await docker.volumes.list(filters={"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]})
    return sorted(v["Name"] for v in found.get("Volumes") or [])


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / "game").mkdir(parents=True)
    (root / "data.json").write_text(json.dumps({"answer": 42}))
    (root / "other.json").write_text(json.dumps({"answer": 7}))
    (root / "game" / "map.txt").write_text("#.@#\n")
    return root


@pytest.fixture
async def asset_pool(executor_config: ExecutorConfig, source: Path, tmp_path: Path
                     ) -> AsyncIterator[DockerSandboxPool]:
    config = msgspec.structs.replace(executor_config, asset_cache=str(tmp_path / "cache"), keyed_pool_size=1,
                                     asset_sources=[f"file://{source}"])
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        yield pool


def asset(source: Path, rel: str, place: str | None = None) -> Asset:
    return Asset(path=place or rel, url=f"file://{source / rel}", digest=local_digest(source / rel))


PROBE = """
import json, os
def probe():
    out = {"listing": sorted(os.listdir('/assets')) if os.path.isdir('/assets') else None}
    try:
        out["answer"] = json.load(open('/assets/data.json'))["answer"]
    except OSError as exc:
        out["answer"] = type(exc).__name__
    for target in ('/assets/data.json', '/assets/new.txt', '/assets/game/map.txt'):
        try:
            with open(target, 'a') as f:
                f.write('x')
            out[target] = 'written'
        except OSError as exc:
            out[target] = exc.errno
    try:
        os.chmod('/assets/data.json', 0o666)
        out['chmod'] = 'changed'
    except OSError as exc:
        out['chmod'] = exc.errno
    return out
"""


async def probe(pool: DockerSandboxPool, assets: list[Asset], job_id: str) -> dict:
    result = await pool.execute(Job(job_id=job_id, code=PROBE + "print(json.dumps(probe()))", assets=assets,
                                    trust="in_process"))
    assert result.exit_code == 0, result.stderr_tail
    return json.loads(result.stdout_tail.strip().splitlines()[-1])


async def test_an_asset_is_readable_and_never_writable(asset_pool: DockerSandboxPool, source: Path) -> None:
    seen = await probe(asset_pool, [asset(source, "data.json"), asset(source, "game")], "assets-1")
    assert seen["listing"] == ["data.json", "game"] and seen["answer"] == 42
    assert seen["/assets/data.json"] in (13, 30) and seen["/assets/new.txt"] in (13, 30)  # EACCES / EROFS
    assert seen["/assets/game/map.txt"] in (13, 30) and seen["chmod"] in (1, 30)
    assert (source / "data.json").read_text() == json.dumps({"answer": 42})  # and the source is untouched


async def test_only_the_tasks_that_asked_see_a_set(asset_pool: DockerSandboxPool, source: Path) -> None:
    first = await probe(asset_pool, [asset(source, "data.json")], "assets-a")
    other = await probe(asset_pool, [asset(source, "other.json", "data.json")], "assets-b")  # same place
    none = await probe(asset_pool, [], "assets-none")
    assert (first["answer"], other["answer"]) == (42, 7)
    assert none["listing"] is None and none["answer"] == "FileNotFoundError"  # the warm pool: no /assets
    assert len(asset_pool._keyed) == 2


async def test_a_wrong_digest_is_refused_before_anything_runs(asset_pool: DockerSandboxPool, source: Path,
                                                              registry: RewardRegistry) -> None:
    wrong = Asset(path="data.json", url=f"file://{source / 'data.json'}", digest=local_digest(source / "other.json"))
    spec = RewardSpec(tests=["assert json.load(open('/assets/data.json'))['answer'] == 42"], setup="import json",
                      assets=[wrong])
    with pytest.raises(AssetError, match="refused"):
        await evaluate(asset_pool, registry, spec, "```python\nx = 1\n```", "assets-wrong")
    beyond = msgspec.structs.replace(spec, assets=[Asset(path="p", url="file:///etc/passwd",
                                                         digest="sha256:" + "0" * 64)])
    with pytest.raises(ValueError, match="executor.asset_sources"):  # the stage dead-letters it
        await evaluate(asset_pool, registry, beyond, "```python\nx = 1\n```", "assets-beyond")
    assert not asset_pool._keyed
    right = msgspec.structs.replace(spec, assets=[asset(source, "data.json")])
    scored = (await evaluate(asset_pool, registry, right, "```python\nx = 1\n```", "assets-right")).scored
    assert scored.execution.tests_passed == 1, (scored.execution.error_kind, scored.execution.error_message)


async def test_the_outside_asset_tasks_pass_with_their_references_and_fail_with_wrong_code(
        executor_config: ExecutorConfig, registry: RewardRegistry, tmp_path: Path) -> None:
    config = msgspec.structs.replace(executor_config, asset_cache=str(tmp_path / "cache"), pool_size=1)
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        await check_references(pool, registry, asset_tasks())
        assert len(pool._keyed) == 2  # two sets (the dataset, the levels): a pool each


async def test_an_idle_keyed_pool_goes_with_its_volume(executor_config: ExecutorConfig, source: Path,
                                                       tmp_path: Path, owner: str) -> None:
    config = msgspec.structs.replace(executor_config, asset_cache=str(tmp_path / "cache"), keyed_pool_size=1,
                                     asset_sources=[str(source)], keyed_pool_idle_s=1.0)
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        await probe(pool, [asset(source, "data.json")], "assets-idle")
        assert len(await volumes_of(owner)) == 1
        for _ in range(40):
            if not pool._keyed:
                break
            await asyncio.sleep(0.25)
        assert not pool._keyed
        assert await volumes_of(owner) == []
        assert (await probe(pool, [asset(source, "data.json")], "assets-again"))["answer"] == 42  # on demand again
    assert await volumes_of(owner) == []  # closing the pool removes the keyed pools' volumes


async def test_the_stage_dead_letters_a_task_whose_assets_or_network_cannot_be_had(config, sandbox_image: str, owner: str,
                                                                         source: Path, tmp_path: Path) -> None:
    from rollstream.kafka import EventProducer, ensure_topics
    from rollstream.schemas.events import DeadLetter, RewardScored
    from rollstream.schemas.topics import codec
    from tests.consumers.executor.test_executor_stage import action, stage_config, while_staged

    config = stage_config(config, sandbox_image, owner, asset_cache=str(tmp_path / "cache"), keyed_pool_size=1,
                          asset_sources=[f"file://{source}"])
    await ensure_topics(config.infra, ["actions", "rewards", "audit"])
    reads = "import json\ndef add(a, b):\n    return json.load(open('/assets/data.json'))['answer'] - 42 + a + b"
    good = action("a1", 0, reads, assets=[asset(source, "data.json")])
    wrong = action("a1", 1, reads, assets=[Asset(path="data.json", url=f"file://{source / 'data.json'}",
                                                  digest=local_digest(source / "other.json"))])
    beyond = action("a1", 2, reads, assets=[Asset(path="data.json", url="file:///etc/hostname",
                                                   digest="sha256:" + "0" * 64)])
    plain = action("a1", 3, "def add(a, b):\n    return a + b")
    online = action("a1", 4, "def add(a, b):\n    return a + b", network=["api.example.com:443"])  # none allowed
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("actions", a) for a in (good, wrong, beyond, plain, online)])
    rewards, letters = await while_staged(config, ("rewards", RewardScored, 2), ("actions.dlq", DeadLetter, 3))
    assert {r.rollout.rollout_id: r.reward for r in rewards} == {"a1/0": 1.0, "a1/3": 1.0}
    reasons = {codec(type(good)).decode(d.value).rollout.rollout_id: d.reason for d in letters}
    assert "refused" in reasons["a1/1"] and "executor.asset_sources" in reasons["a1/2"], reasons
    assert "beyond executor.egress_allowed" in reasons["a1/4"], reasons


async def test_offline_scoring_resolves_assets_as_the_executor_does(executor_config: ExecutorConfig,
                                                                     tmp_path: Path) -> None:
    from rollstream.config import Config
    from rollstream.consumers.executor.score import score_file
    from rollstream.schemas.tasks import encode_task
    from rollstream.tasks.outside import asset_tasks

    task = next(t for t in asset_tasks() if t.task_id == "outside/count_walls")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(encode_task(task) + b"\n")
    completions = tmp_path / "completions.jsonl"
    completions.write_text("\n".join(json.dumps({"task_id": task.task_id, "completion": f"```python\n{code}```"})
                                     for code in (task.reference_solution, task.wrong_solutions[0])) + "\n")
    out = tmp_path / "out.jsonl"
    config = Config(executor=msgspec.structs.replace(executor_config, asset_cache=str(tmp_path / "cache")))
    with out.open("w") as f:
        counts = await score_file(config, [str(tasks), str(completions)], f)
    right, wrong = (json.loads(line) for line in out.read_text().splitlines())
    assert (counts["scored"], counts["errors"]) == (2, 0)
    assert right["reward"] == 1.0 and wrong["reward"] < 1.0, (right, wrong)
