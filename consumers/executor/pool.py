"""The sandbox backend: a warm pool of hardened Docker containers, each running the fork-per-job runner.

Consumes :class:`~rollstream.consumers.executor.jobs.Job` s; produces
:class:`~rollstream.consumers.executor.jobs.RunResult` s (what happened, with the violations seen).
Guarantees:

* Every container is created hardened (consumers/executor/hardening.py ``hardened_config``: no
  network, read-only root, no capabilities, uid 65534, pids/memory/CPU limits, logging off).
* Each execution runs in fresh processes forked by the in-container runner's zygotes
  (``consumers/executor/runtime/supervisor.py``, ``zygotes.py``: a judge and a candidate) with a hard
  wall-clock limit enforced twice: by the runner (SIGKILL of every process in the container) and
  by this host side (the container is killed when the runner does not answer in time).
* A container is reused only while the runner reports it clean (no process left, empty
  ``/work``, no IPC objects) and no violation happened; otherwise, and after ``recycle_after``
  executions, it is retired and a fresh one replaces it in the background.
* Containers carry the labels ``rollstream.sandbox=1``, ``rollstream.sandbox.owner=<owner>`` and
  the executor's host and process; at start the pool removes containers of its owner whose
  executor process is gone (a crashed executor). Containers also stop by themselves when their
  executor disconnects (``StdinOnce``) and are then auto-removed.
* A job with assets or a network allowlist runs in a pool keyed by them
  (consumers/executor/keyed.py); jobs without never wait on one: they take the warm pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import socket
import time
from typing import Any

import msgspec

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.egress import EgressProxy
from rollstream.consumers.executor.hardening import (
    ASSETS,
    hardened_config,
    runner_command,
    runner_preamble,
    runtime_identity,
)
from rollstream.consumers.executor.image import LANGUAGES_LABEL, PYTEST_LABEL, PYTHON
from rollstream.consumers.executor.jobs import Job, RunResult, limits_from_config
from rollstream.consumers.executor.keyed import KeyedPools
from rollstream.consumers.executor.runner import Warm, job_request, run_result
from rollstream.errors import SandboxError, SandboxLost
from rollstream.retry import retry
from rollstream.schemas.events import SandboxLimits

log = logging.getLogger(__name__)

LABEL = "rollstream.sandbox"
OWNER_LABEL = "rollstream.sandbox.owner"
HOST_LABEL = "rollstream.sandbox.host"
PROCESS_LABEL = "rollstream.sandbox.process"
READY_TIMEOUT_S = 60.0


def process_identity(pid: int | None = None) -> str | None:
    """``pid:starttime`` of a live process (starttime guards against pid reuse), else None."""
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return f"{pid}:{fields[19]}"


def _owner_alive(labels: dict[str, str]) -> bool:
    if labels.get(HOST_LABEL) != socket.gethostname():
        return True  # not ours to judge: another host shares this daemon
    identity = labels.get(PROCESS_LABEL, "")
    pid = identity.partition(":")[0]
    return pid.isdigit() and process_identity(int(pid)) == identity


async def remove_orphans(docker: Any, owner: str) -> int:
    """Remove containers of ``owner`` whose executor process is gone. Returns how many."""
    import aiodocker

    found = await docker.containers.list(
        all=True, filters=json.dumps({"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]})
    )
    removed = 0
    for container in found:
        labels = container._container.get("Labels") or {}
        if labels.get(OWNER_LABEL) != owner or _owner_alive(labels):
            continue
        with contextlib.suppress(aiodocker.DockerError):
            await container.delete(force=True)
            removed += 1
    if removed:
        log.warning("removed %d orphaned sandbox containers of owner %s", removed, owner)
    volumes = (await docker.volumes.list(filters={"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]}))
    for volume in volumes.get("Volumes") or []:  # asset volumes of pools keyed by a set (their fill helpers: above)
        if (volume.get("Labels") or {}).get(OWNER_LABEL) == owner and not _owner_alive(volume.get("Labels") or {}):
            with contextlib.suppress(aiodocker.DockerError):
                await aiodocker.volumes.DockerVolume(docker, volume["Name"]).delete()
                log.warning("removed orphaned asset volume %s of owner %s", volume["Name"], owner)
    return removed


class DockerSandboxPool:
    """The aiodocker :class:`SandboxBackend`: ``async with DockerSandboxPool(config) as pool``."""

    def __init__(self, config: ExecutorConfig, *, owner: str | None = None, grace_s: float = 3.0,
                 test_hooks: bool = False, volume: str = "", egress: tuple[EgressProxy, str] | None = None,
                 language: str = PYTHON) -> None:
        self.config = config
        self.volume = volume  # a keyed pool's: the asset volume its containers mount at /assets
        self.egress = egress  # a keyed pool's: its egress proxy and the volume of the proxy's socket
        self.language = language  # a keyed pool's: the language its programs are built in (image: language_image)
        self.keyed = bool(volume or egress or language != PYTHON)
        self.test_hooks = test_hooks  # tests only: the runner honours Job.test_hook
        self.owner = owner or config.owner
        self.grace_s = grace_s
        self._limits = limits_from_config(config)
        self.docker: Any = None  # the aiodocker client, open while the pool is
        self._idle: asyncio.Queue[Warm] = asyncio.Queue()
        self._all: set[Warm] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._broken: BaseException | None = None
        self._leftover: list[Any] = []  # containers the engine could not be asked to delete yet
        self._names = itertools.count()
        self._run_id = secrets.token_hex(3)
        self.recycled = 0
        self.image_id = ""  # the sandbox image's id (sha256:...), known once started
        self.has_pytest = False  # the image has pytest (image.py PYTEST_LABEL), known once started
        self.runtime = ""  # runtime_identity(): what runs the containers and the runner
        self._keyed = KeyedPools(self)  # the pools of the jobs with assets or a network allowlist

    @property
    def limits(self) -> SandboxLimits:
        return self._limits

    async def __aenter__(self) -> DockerSandboxPool:
        import aiodocker

        self.docker = aiodocker.Docker(url=self.config.docker_url or None)
        try:
            image = await self.docker.images.inspect(self.config.image)
            info = await self.docker.system.info()
        except Exception as exc:
            await self.docker.close()
            if isinstance(exc, aiodocker.DockerError) and exc.status == 404:
                raise SandboxError(
                    f"sandbox image {self.config.image!r} not found; "
                    "build it with `rollstream sandbox build --offline`"
                ) from exc
            raise SandboxError(f"cannot use the Docker daemon: {exc}") from exc
        self.image_id = str(image.get("Id") or self.config.image)
        labels = (image.get("Config") or {}).get("Labels") or {}
        self.has_pytest = PYTEST_LABEL in labels
        if self.language != PYTHON and self.language not in str(labels.get(LANGUAGES_LABEL, "")).split(","):
            await self.docker.close()
            raise SandboxError(
                f"the sandbox image {self.config.image!r} has no {self.language} compiler (its languages: "
                f"{labels.get(LANGUAGES_LABEL) or 'python'}): build it with `rollstream sandbox build --languages "
                f"{self.language}` (or set executor.language_image)")
        registered = sorted(info.get("Runtimes") or {"runc": {}})
        if self.config.runtime not in registered:
            await self.docker.close()
            raise SandboxError(
                f"executor.runtime = {self.config.runtime!r} is not registered with the Docker engine (it has: "
                f"{', '.join(registered)}); `.ci/install` registers runsc, `rollstream sandbox doctor` says which "
                "runtimes work here (docs/executor.md, \"Runtimes\")")
        self.runtime = runtime_identity(self.config.runtime)
        try:
            await remove_orphans(self.docker, self.owner)
            warm = await asyncio.gather(*(self._spawn() for _ in range(self.config.pool_size)))
        except BaseException:
            await self.aclose()
            raise
        for w in warm:
            self._idle.put_nowait(w)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._keyed.aclose()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(self._remove(w) for w in list(self._all)), return_exceptions=True)
        if self.docker is not None:
            with contextlib.suppress(Exception):
                await self._remove_leftovers()
            await self.docker.close()
            self.docker = None

    def keyed_pool(self, volume: str, egress: tuple[EgressProxy, str] | None,
                   language: str = PYTHON) -> DockerSandboxPool:
        """A pool like this one (not started) for a keyed pool's asset ``volume``, ``egress`` and
        ``language`` (besides Python: the language image, with the memory and work dir a build needs)."""
        config = msgspec.structs.replace(self.config, pool_size=self.config.keyed_pool_size)
        if language != PYTHON:
            config = msgspec.structs.replace(config, image=config.language_image,
                                             memory_mb=max(config.memory_mb, config.language_memory_mb),
                                             tmpfs_mb=max(config.tmpfs_mb, config.language_tmpfs_mb))
        return DockerSandboxPool(config, owner=self.owner, grace_s=self.grace_s, test_hooks=self.test_hooks,
                                 volume=volume, egress=egress, language=language)

    def labels(self) -> dict[str, str]:
        return {
            LABEL: "1",
            OWNER_LABEL: self.owner,
            HOST_LABEL: socket.gethostname(),
            PROCESS_LABEL: process_identity() or "",
        }

    async def _spawn(self) -> Warm:
        """Create, attach, start a container and wait for its runner to say it is ready."""
        name = f"rollstream-sbx-{self._run_id}-{next(self._names)}-{secrets.token_hex(2)}"
        cmd = runner_command(*(["--test-hooks"] if self.test_hooks else []))
        body = hardened_config(self.config.image, self._limits, self.labels(), cmd, runtime=self.config.runtime,
                               exec_work=self.language != PYTHON)
        if self.volume:
            body["HostConfig"]["Mounts"].append({"Type": "volume", "Source": self.volume, "Target": ASSETS,
                                                 "ReadOnly": True, "VolumeOptions": {"NoCopy": True}})
        source = ""
        if self.egress is not None:  # still network none: its own socket at the proxy is the only way out
            # A socket per container, under a random name only this container's PID 1 learns (the
            # directory cannot be listed): what reaches the proxy through it is this container's,
            # under limits of its own, so one container's code cannot starve another's job.
            source = secrets.token_hex(16)
            path = await self.egress[0].listen(source)
            body["HostConfig"]["Mounts"].append({"Type": "volume", "Source": self.egress[1], "Target": "/egress",
                                                 "ReadOnly": True, "VolumeOptions": {"NoCopy": True}})
            body["Env"].append(f"ROLLSTREAM_EGRESS={path}")
        try:
            container = await self.docker.containers.create(body, name=name)
        except BaseException:
            if source:
                await self.egress[0].unlisten(source)  # type: ignore[index]
            raise
        stream = container.attach(stdin=True, stdout=True, stderr=True)
        try:
            await stream.__aenter__()  # attach before start: output is not logged anywhere else
            await container.start()
        except BaseException:
            await stream.close()
            with contextlib.suppress(Exception):
                await container.delete(force=True)
            if source:
                await self.egress[0].unlisten(source)  # type: ignore[index]
            raise
        warm = Warm(container, stream, name)
        warm.egress_source = source
        self._all.add(warm)
        try:
            await warm.stream.write_in(runner_preamble())
            ready = await warm.receive(READY_TIMEOUT_S)
        except TimeoutError:
            ready = None
        if not ready or not ready.get("ready"):
            detail = bytes(warm.runner_stderr).decode(errors="replace")
            await self._remove(warm)
            raise SandboxError(f"sandbox {name} did not start: {ready!r} {detail}")
        if ready.get("channels_guarded") is not True:
            await self._remove(warm)
            raise SandboxError(
                f"the {self.config.runtime} runtime here lets the code under test open the runner's descriptors "
                "(/proc/1/fd of a non-dumpable process): a completion could read its tests from the judge's part and "
                "write on the runner's channels, so no verdict from it could be trusted (Debian 12's gVisor, runsc "
                "2022-12-19, does); use executor.runtime = \"runc\" (docs/executor.md, \"Runtimes\")")
        warm.ready = ready
        return warm

    async def _remove(self, warm: Warm) -> None:

        self._all.discard(warm)
        warm.reader.cancel()
        with contextlib.suppress(Exception):
            await warm.stream.close()
        await self.delete(warm.container)
        if warm.egress_source and self.egress is not None:
            await self.egress[0].unlisten(warm.egress_source)

    async def delete(self, container: Any) -> None:
        """Delete ``container``; one the engine could not be asked to delete (unreachable) is kept
        in ``_leftover`` and tried again later (the next executor start removes any left as orphans)."""
        import aiodocker

        try:
            await container.delete(force=True)
        except aiodocker.DockerError as exc:
            if exc.status != 404:  # 404: auto-removed already
                self._leftover.append(container)
        except Exception:  # the engine unreachable
            self._leftover.append(container)

    async def _remove_leftovers(self) -> None:
        leftover, self._leftover = self._leftover, []
        for container in leftover:
            await self.delete(container)

    def _retire(self, warm: Warm) -> None:
        """Remove ``warm`` and start a replacement in the background."""
        self.recycled += 1
        task = asyncio.create_task(self._replace(warm), name=f"sandbox-replace-{warm.sandbox_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replace(self, warm: Warm) -> None:
        await self._remove(warm)
        await self._remove_leftovers()
        try:  # whatever Docker or its HTTP client raise: a hiccup until it happened five times
            fresh = await retry(self._spawn, what=f"replacing sandbox {warm.sandbox_id}",
                                retry_on=(Exception,), attempts=5, first_delay_s=0.5, max_delay_s=4.0)
        except Exception as exc:  # a background task has no caller: execute() reports it
            log.error("could not replace sandbox %s: %s", warm.sandbox_id, exc)
            self._broken = exc
            return
        self._idle.put_nowait(fresh)

    async def _acquire(self) -> Warm:
        while True:
            if self._broken is not None and not self._all:
                raise SandboxError(f"no sandbox can be started: {self._broken}") from self._broken
            if not self._idle.empty():
                return self._idle.get_nowait()
            try:
                async with asyncio.timeout(1.0):  # wake up now and then to notice a broken pool
                    return await self._idle.get()
            except TimeoutError:
                continue

    async def execute(self, job: Job) -> RunResult:
        if (job.assets or job.network or job.language != PYTHON) and not self.keyed:
            return await self._keyed.execute(job)
        return await self._execute(job)

    async def _execute(self, job: Job) -> RunResult:
        if job.pytest and not self.has_pytest:
            raise SandboxError(f"the sandbox image {self.config.image!r} has no pytest (built before pytest files): "
                               "rebuild it with `rollstream sandbox build --offline` (or without --offline)")
        if job.language != self.language:
            raise SandboxError(f"a {job.language} job reached the {self.language} pool")
        warm = await self._acquire()
        request = job_request(job, self._limits, test_hooks=self.test_hooks,
                              compile_timeout_s=self.config.compile_timeout_s)
        if warm.reader.done() or not warm.replies.empty():  # died while idle: not this job's doing
            self._retire(warm)
            raise SandboxLost(f"sandbox {warm.sandbox_id} died while idle", "died_idle")
        if self.egress is None:
            return await self._run(warm, job, request)
        return await self._run_with_egress(warm, job, request, self.egress[0])

    async def _run_with_egress(self, warm: Warm, job: Job, request: dict[str, Any], proxy: EgressProxy) -> RunResult:
        """The job with its own token at the proxy, valid on its container's socket alone: its
        connections, and what the proxy refused of its container while it ran, are its own."""
        token = secrets.token_hex(16)
        try:
            await proxy.begin(token, job.job_id, job.network, self.config.egress_private, warm.egress_source)
        except Exception as exc:  # the proxy's stream is gone: not this job's doing, nothing of it ran
            self._idle.put_nowait(warm)
            raise SandboxLost(f"egress proxy {proxy.warm.sandbox_id} is gone: {exc}", "egress_lost") from exc
        request["egress_token"] = token
        try:
            result = await self._run(warm, job, request)
        except asyncio.CancelledError:  # a stop: the proxy closes the job's connections, nobody waits for it
            ending = asyncio.create_task(proxy.end(token), name=f"egress-end-{job.job_id}")
            self._tasks.add(ending)
            ending.add_done_callback(self._tasks.discard)
            raise
        except BaseException:
            await proxy.end(token)
            raise
        return msgspec.structs.replace(result, connections=await proxy.end(token))

    async def _run(self, warm: Warm, job: Job, request: dict[str, Any]) -> RunResult:
        try:
            await warm.send(request)
        except Exception as exc:
            self._retire(warm)
            raise SandboxLost(f"sandbox {warm.sandbox_id}: could not send the job: {exc}", "send_failed") from exc
        started = time.monotonic()
        try:
            reply = await warm.receive(job.timeout_s + float(request.get("compile_timeout_s", 0.0)) + self.grace_s)
        except TimeoutError:
            reply = {"id": job.job_id, "nonce": request["nonce"], "timed_out": True,
                     "violations": ["runner_unresponsive"], "clean": False}
        except asyncio.CancelledError:  # its reply would be taken for the next job's: replace it
            self._retire(warm)
            raise
        if reply is None:  # the attach stream ended: PID 1 is gone, or so is the engine or the container
            cause = await self._why_lost(warm)
            if cause is not None:
                self._retire(warm)
                raise SandboxLost(f"sandbox {warm.sandbox_id}: {cause.replace('_', ' ')} during job {job.job_id}",
                                  cause)
        elif reply.get("ran") is False:
            # The runner refused the job: its container is unfit (runtime/host.py unfit_reason says why in
            # "unfit", a structured field). Not this job's doing, and nothing of it ran.
            self._retire(warm)
            raise SandboxLost(f"sandbox {warm.sandbox_id} was unfit for a job: {str(reply.get('unfit'))[:200]}",
                              "container_unfit")
        elif "error" in reply or reply.get("id") != job.job_id or reply.get("nonce") != request["nonce"]:
            # PID 1 failed handling it (a runner bug, a request it could not read) or answered for
            # another job: not attributable to this job, never its verdict; the container goes
            self._retire(warm)
            raise SandboxLost(f"sandbox {warm.sandbox_id}: runner error: "
                              f"{str(reply.get('error', 'a reply for another job'))[:200]}", "runner_error")
        warm.executions += 1
        result = run_result(warm, reply, time.monotonic() - started, self.config.recycle_after)
        if result.recycled:
            self._retire(warm)
        else:
            self._idle.put_nowait(warm)
        return result

    async def _why_lost(self, warm: Warm) -> str | None:
        """Why a runner stopped answering mid-job: a cause when the machinery failed (SandboxLost),
        None when the container's memory limit killed it (the job's doing: an ``oom`` verdict).
        PID 1 cannot be signalled from inside (under runc it is the namespace's init; under runsc
        another uid than the job's), so a container still there, not OOM-killed, whose runner is
        gone was stopped from outside or failed by itself."""
        import aiodocker

        try:
            info = await warm.container.show()
        except aiodocker.DockerError as exc:
            return "container_gone" if exc.status == 404 else "engine_unreachable"
        except Exception:  # the engine's socket refused or cut (aiohttp's errors, OSError)
            return "engine_unreachable"
        state = info.get("State") or {}
        if state.get("OOMKilled"):
            return None
        if state.get("Running"):
            return "stream_lost"  # the engine dropped the attach stream; the runner may live on
        return "container_killed" if state.get("ExitCode") in (137, 143) else "runner_died"
