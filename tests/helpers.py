"""The tests' shared helpers, in one module (fixtures are in tests/fixtures/, registered as
plugins by tests/conftest.py; event builders and the tiny model in rollstream.testing).

* sandbox containers of an owner label: :func:`containers_of`, :func:`remove_containers_of`; what
  runs in one (:func:`container_processes`, :func:`container_ended`); a process's metrics
  (:func:`scrape_metrics`);
* topics: :func:`read_events` (decoded, from the start, no consumer group),
  :func:`read_dead_letters`, :func:`read_all` (raw records, every partition);
* processes: stream workers started as ``rollstream stream`` in their own session and ended
  by pid (:func:`start_worker`, :func:`wait_ready`, :func:`kill`, :func:`end`);
* the learner's hand-made advantaged groups and tiny in-memory models (:func:`group`,
  :func:`rollout`, :func:`tiny_model`);
* oracles and probes: :func:`score_completion` (teacher-forced log-probs), :func:`read_counter`;
* waiting for a state with a deadline, never a fixed sleep: :func:`wait_until`,
  :func:`wait_until_sync`;
* a missing service fails the test, or skips it where ROLLSTREAM_TEST_ALLOW_MISSING says so
  (:func:`missing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from aiokafka import AIOKafkaConsumer, TopicPartition

from rollstream.config import Config
from rollstream.config_load import to_toml
from rollstream.infra import pid_alive
from rollstream.schemas.events import AdvantagedRollout, GroupAdvantaged, GroupStats, Rollout


async def read_events(infra, name: str, event: type, until=lambda got: False, timeout_s: float = 20.0) -> list:
    """The events on registry topic ``name`` from the start (no consumer group), decoded as
    ``event``, until ``until(events)`` holds or ``timeout_s`` passed (then whatever arrived)."""
    from aiokafka import AIOKafkaConsumer

    from rollstream.kafka import topic_name
    from rollstream.schemas import codec

    consumer = AIOKafkaConsumer(topic_name(infra, name), bootstrap_servers=infra.kafka_bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
    await consumer.start()
    events: list = []
    try:
        deadline = time.monotonic() + timeout_s
        while not until(events) and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                events += [codec(event).decode(r.value) for r in records]
    finally:
        await consumer.stop()
    return events


async def read_dead_letters(infra, name: str, want: int, timeout_s: float = 20.0) -> list:
    """The DeadLetter records of registry topic ``name``'s DLQ."""
    from rollstream.schemas import DeadLetter

    return await read_events(infra, f"{name}.dlq", DeadLetter, lambda got: len(got) >= want, timeout_s)


REPO = Path(__file__).resolve().parents[1]


def write_config(config: Config, path: Path) -> Path:
    path.write_text(to_toml(config))
    return path


def start_worker(config_path: Path, log_path: Path, stage: str = "stream") -> subprocess.Popen[bytes]:
    """``rollstream STAGE --config ...`` in its own session, output to ``log_path``."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "rollstream.cli", stage, "--config", str(config_path)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True,
        )


def ready_count(log_path: Path) -> int:
    from rollstream.streams.faust_runtime import READY_LOG_LINE  # Faust is imported only where needed

    try:
        return log_path.read_text(errors="replace").count(READY_LOG_LINE)
    except FileNotFoundError:
        return 0


async def wait_ready(proc: subprocess.Popen[bytes], log_path: Path, *, starts: int = 1, timeout_s: float = 90) -> None:
    """Wait until the log shows ``starts`` "Ready" lines (a worker appends to its log)."""
    deadline = time.monotonic() + timeout_s
    while ready_count(log_path) < starts:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited with {proc.returncode}; log:\n{log_path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"worker not ready after {timeout_s}s; log:\n{log_path.read_text()[-3000:]}")
        await asyncio.sleep(0.1)


def kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL, timeout_s: float = 20) -> int:
    """Send ``sig`` to the worker (by pid), wait for it, return its exit code."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=10)


def end(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None and pid_alive(proc.pid):
            kill(proc)


async def read_all(bootstrap: str, topic: str, *, expect: int, timeout_s: float = 60.0,
                   idle_s: float = 2.0) -> list[tuple[int, bytes | None, bytes]]:
    """Every (partition, key, value) on ``topic``, from the start: waits until ``expect`` records arrived
    and then ``idle_s`` more without any (so extra records would be seen), or ``timeout_s``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        deadline = time.monotonic() + 10
        while not partitions and time.monotonic() < deadline:
            await consumer.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
            await asyncio.sleep(0.2)
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        await consumer.seek_to_beginning()
        records: list[tuple[int, bytes | None, bytes]] = []
        deadline = time.monotonic() + timeout_s
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            got = [(m.partition, m.key, m.value) for msgs in batch.values() for m in msgs]
            if got:
                records.extend(got)
                last_new = time.monotonic()
            elif len(records) >= expect and time.monotonic() - last_new > idle_s:
                break
        return records
    finally:
        await consumer.stop()


VOCAB = 64


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=True, pad_token_id=0,
    )
    return AutoModelForCausalLM.from_config(config)


def rollout(
    group_id: str, index: int, prompt: list[int], completion: list[int], *, version: int = 0,
    behaviour: list[float] | None = None, mask: list[int] | None = None, group_size: int = 4,
) -> Rollout:
    return Rollout(
        rollout_id=f"{group_id}/{index}", group_id=group_id, sample_index=index, group_size=group_size,
        task_id="t/0", family="t", prompt_token_ids=prompt, completion_token_ids=completion,
        behaviour_logprobs=behaviour if behaviour is not None else [-1.0] * len(completion),
        generated_mask=mask, policy_version_first=version, policy_version_last=version,
        issued_policy_version=version, finish_reason="stop",
    )


def group(group_id: str, advantages: list[float], *, version: int = 0, seed: int = 0,
          length: int = 6) -> GroupAdvantaged:
    gen = torch.Generator().manual_seed(seed)
    items = []
    for i, adv in enumerate(advantages):
        prompt = torch.randint(1, VOCAB, (3,), generator=gen).tolist()
        completion = torch.randint(1, VOCAB, (length - (i % 3),), generator=gen).tolist()
        items.append(AdvantagedRollout(
            rollout=rollout(group_id, i, prompt, completion, version=version, group_size=len(advantages)),
            reward=adv, advantage=adv,
        ))
    rewards = [a for a in advantages]
    return GroupAdvantaged(
        group_id=group_id, task_id="t/0", family="t", estimator="grpo", complete=True, rollouts=items,
        stats=GroupStats(size=len(items), expected_size=len(items), reward_mean=0.0,
                         reward_std=float(torch.tensor(rewards).std()) if len(rewards) > 1 else 0.0,
                         reward_min=min(rewards), reward_max=max(rewards)),
        emitted_at=time.time(),
    )


async def containers_of(owner: str) -> list[dict]:
    import aiodocker

    from rollstream.consumers.executor.pool import LABEL, OWNER_LABEL

    async with aiodocker.Docker() as docker:
        found = await docker.containers.list(
            all=True, filters=json.dumps({"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]})
        )
        return [c._container for c in found]


async def container_processes(container_id: str) -> int:
    """How many processes run in the container (``docker top``; 0 when it is gone). An idle sandbox
    runs five (the runner, its two zygotes and the judge and candidate forked ahead)."""
    top = await asyncio.create_subprocess_exec("docker", "top", container_id, "-o", "pid",
                                               stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    out, _ = await top.communicate()
    return max(len(out.split()) - 1, 0)


async def container_ended(container_id: str) -> bool:
    """Whether the container is gone or no longer running."""
    import aiodocker

    async with aiodocker.Docker() as docker:
        try:
            info = await docker.containers.container(container_id).show()
        except aiodocker.DockerError:
            return True
    return not info["State"]["Running"]


def scrape_metrics(port: int) -> dict[str, float]:
    """The rollstream_ samples a process serves on ``port`` (name with labels -> value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("rollstream_") and " " in line:
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


async def remove_containers_of(owner: str) -> int:
    import aiodocker

    from rollstream.consumers.executor.pool import LABEL, OWNER_LABEL

    async with aiodocker.Docker() as docker:
        found = await docker.containers.list(
            all=True, filters=json.dumps({"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]})
        )
        for container in found:
            try:
                await container.delete(force=True)
            except aiodocker.DockerError:
                pass
        volumes = await docker.volumes.list(filters={"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]})
        for volume in volumes.get("Volumes") or []:  # the asset volumes of pools keyed by a set
            try:
                await aiodocker.volumes.DockerVolume(docker, volume["Name"]).delete()
            except aiodocker.DockerError:
                pass
        return len(found)


def read_counter(metrics: Any, name: str, **labels: str) -> float:
    """Current value of a counter sample of a stage's metrics (rollstream.metrics.StageMetrics)."""
    value = metrics.registry.get_sample_value(f"rollstream_{name}_total", labels)
    return value or 0.0


@torch.inference_mode()
def score_completion(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                     sampling: Any = None) -> list[float]:
    """Teacher-forced log-probs of ``completion_ids`` after ``prompt_ids``, as sampling records
    them: tempered, untruncated (one forward over the whole sequence, no cache, no padding); the
    oracle the transformers backend's behaviour log-probs are checked against."""
    from rollstream.consumers.generator.backends.base import Sampling
    from rollstream.consumers.generator.backends.sampling import tempered_logprobs

    sampling = sampling or Sampling()
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=model.device)  # [1, P+C]
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1, :]  # [C, V]
    logprobs = tempered_logprobs(logits, torch.full((logits.shape[0],), float(sampling.temperature),
                                                    device=model.device))
    targets = torch.tensor(list(completion_ids), device=model.device)[:, None]  # [C, 1]
    return logprobs.gather(1, targets)[:, 0].tolist()


def missing(service: str, why: str) -> None:
    """Fail the test for want of ``service``, or skip it when ROLLSTREAM_TEST_ALLOW_MISSING says so."""
    allowed = {s.strip() for s in os.environ.get("ROLLSTREAM_TEST_ALLOW_MISSING", "").split(",")}
    if service in allowed or "all" in allowed:
        pytest.skip(f"no {service} ({why}); skipped: ROLLSTREAM_TEST_ALLOW_MISSING names it")
    pytest.fail(f"no {service}: {why} (set ROLLSTREAM_TEST_ALLOW_MISSING={service} to skip instead)",
                pytrace=False)


async def wait_until(check: Any, what: str, timeout_s: float = 30.0, every_s: float = 0.05) -> Any:
    """Poll ``check()`` (a function, or a coroutine function) until it returns something true,
    and return that; fail naming ``what`` after ``timeout_s``. What a test waits for, instead of
    sleeping for a time it hopes is enough."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(every_s)


def wait_until_sync(check: Any, what: str, timeout_s: float = 30.0, every_s: float = 0.2) -> Any:
    """:func:`wait_until` for a synchronous test (``check`` is a plain function)."""
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(every_s)
    return got


class DockerSocketProxy:
    """A unix-socket proxy in front of the Docker engine's socket, for a pool to talk through
    (``ExecutorConfig.docker_url = proxy.url``): :meth:`cut` drops every connection through it
    and refuses new ones (the engine unreachable, as the executor sees it), :meth:`restore`
    accepts again. The shared engine itself is never stopped."""

    def __init__(self, path: str, target: str = "/var/run/docker.sock") -> None:
        self.path, self.target = path, target
        self.url = f"unix://{path}"
        self.refusing = False
        self.connections: set[asyncio.StreamWriter] = set()
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> DockerSocketProxy:
        self.server = await asyncio.start_unix_server(self._serve, self.path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def cut(self) -> None:
        self.refusing = True
        for writer in list(self.connections):
            writer.transport.abort()
        self.connections.clear()

    def restore(self) -> None:
        self.refusing = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.target)
        except OSError:
            writer.transport.abort()
            return
        self.connections.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self.connections.discard(writer)
            self.connections.discard(up_writer)
