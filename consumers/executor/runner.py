"""The host's end of one container's runner: its attach stream, the request a job becomes, the
:class:`RunResult` its reply becomes.

The protocol itself (one JSON object per line each way) is the runner's
(consumers/executor/runtime/supervisor.py). What comes back is read as data only: a reply says the
job's verdict only if it carries the request's nonce (consumers/executor/pool.py checks), and a
container whose last job showed a violation, or whose runner did not report it clean, is recycled.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
from typing import Any

from rollstream.consumers.executor.jobs import TAIL_BYTES, WORKSPACE_BYTES, Job, RunResult
from rollstream.schemas.events import SandboxLimits

log = logging.getLogger(__name__)


class Warm:
    """One started container with its attach stream and the reader of the runner's replies."""

    def __init__(self, container: Any, stream: Any, sandbox_id: str) -> None:
        self.container = container
        self.stream = stream
        self.sandbox_id = sandbox_id
        self.container_id = container.id[:12]
        self.executions = 0
        self.ready: dict[str, Any] = {}  # the runner's first message (its Python, what it can check)
        self.egress_source = ""  # a keyed pool's: the name of its own socket at the pool's egress proxy
        self.replies: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.runner_stderr = bytearray()
        self.reader = asyncio.create_task(self._read(), name=f"sandbox-reader-{sandbox_id}")

    async def _read(self) -> None:
        buffer = bytearray()
        try:
            while (message := await self.stream.read_out()) is not None:
                if message.stream != 1:
                    self.runner_stderr = (self.runner_stderr + message.data)[-TAIL_BYTES:]
                    continue
                buffer += message.data
                while (end := buffer.find(b"\n")) >= 0:
                    line, buffer = bytes(buffer[:end]), buffer[end + 1 :]
                    try:
                        self.replies.put_nowait(json.loads(line))
                    except ValueError:
                        log.warning("sandbox %s: unreadable runner line %r", self.sandbox_id, line[:200])
        except Exception as exc:  # a broken stream reads like a dead runner
            log.warning("sandbox %s: attach stream failed: %s", self.sandbox_id, exc)
        finally:
            self.replies.put_nowait(None)

    async def send(self, request: dict[str, Any]) -> None:
        await self.stream.write_in(json.dumps(request).encode() + b"\n")

    async def receive(self, timeout_s: float) -> dict[str, Any] | None:
        """The next reply; None when the runner died; TimeoutError when it does not answer."""
        async with asyncio.timeout(timeout_s):  # no extra task per call, unlike wait_for
            return await self.replies.get()


def workspace_files(reply: dict[str, Any]) -> tuple[list[tuple[str, bytes]], bool]:
    """The files a job left (``collect_files``), as the runner listed them; what does not read as
    (path, base64) within the caps is left out."""
    files: list[tuple[str, bytes]] = []
    total, truncated = 0, bool(reply.get("workspace_truncated"))
    listed = reply.get("files")
    for item in listed if isinstance(listed, list) else []:
        try:
            path, encoded = item
            data = base64.b64decode(encoded, validate=True)
        except (TypeError, ValueError):
            truncated = True
            continue
        total += len(data)
        if not isinstance(path, str) or len(path) > 1024 or total > WORKSPACE_BYTES:
            truncated = True
            continue
        files.append((path, data))
    return files, truncated


def job_request(job: Job, limits: SandboxLimits, *, test_hooks: bool, compile_timeout_s: float = 0.0) -> dict[str, Any]:
    """What the runner is sent for ``job``, under the pool's ``limits`` (a fresh nonce each time:
    the reply must carry it, nothing else is this job's verdict). The test hooks go only to a
    runner started with them."""
    request: dict[str, Any] = {
        "id": job.job_id,
        "nonce": secrets.token_hex(8),
        "setup": job.setup,
        "code": job.code,
        "tests": job.tests,
        "names": job.names,
        "modules": job.modules,
        "entry_point": job.entry_point,
        "program": job.program,
        "pytest": job.pytest,
        "trust": job.trust,
        "rules": job.rules,
        "timeout_s": job.timeout_s,
        "memory_mb": min(job.memory_mb, limits.memory_mb),
        "output_bytes": limits.output_bytes,
        "tail_bytes": TAIL_BYTES,
        "file_bytes": limits.tmpfs_mb << 20,
    }
    if job.language != "python":  # built first, within a bound of its own on top of the job's
        request.update(language=job.language, compile_timeout_s=compile_timeout_s)
    if job.test_hook is not None and test_hooks:
        request["test_hook"] = job.test_hook
    if job.runner_hook is not None and test_hooks:
        request["runner_hook"] = job.runner_hook
    if job.files or job.collect_files:
        request.update(files=[[path, base64.b64encode(data).decode()] for path, data in job.files],
                       collect_files=job.collect_files, workspace_bytes=WORKSPACE_BYTES)
    return request


def run_result(warm: Warm, reply: dict[str, Any] | None, waited_s: float, recycle_after: int) -> RunResult:
    """The RunResult of the reply of ``warm``'s runner (None: its runner died, killed by the
    container's memory limit), and whether its container is recycled: after any violation, a
    runner that did not report it clean, or ``recycle_after`` executions."""
    died = reply is None
    if died:  # the container's memory limit killed PID 1 (the only death the pool leaves to here)
        reply = {"violations": ["runner_died", "oom_killed"], "clean": False, "oom_killed": True}
    violations = [str(v)[:200] for v in reply.get("violations", [])]
    files, truncated = workspace_files(reply)
    if reply.get("oom_killed") and "oom_killed" not in violations:
        violations.append("oom_killed")  # the cgroup OOM killer ran: the runner may be hurt
    events = [e for e in reply.get("events", []) if isinstance(e, dict)]
    # Retired after any violation: an attack on the sandbox (violations, a runner not clean) or
    # on the verdict (the judge's tamper events: messages the honest code never sends), whether
    # or not the runner saw harm: a container whose last job attacked it serves no other job.
    attacked = bool(violations) or any(e.get("e") == "tamper" for e in events)
    recycled = attacked or not reply.get("clean", False) or warm.executions >= recycle_after
    return RunResult(
        sandbox_id=warm.sandbox_id,
        container_id=warm.container_id,
        exit_code=reply.get("exit_code"),
        signal=reply.get("signal"),
        duration_s=float(reply.get("duration_s", waited_s)),
        timed_out=bool(reply.get("timed_out", False)),
        output_limit=bool(reply.get("output_limit", False)),
        oom_killed=bool(reply.get("oom_killed", False)),
        output_bytes=int(reply.get("output_bytes", 0)),
        stdout_tail=str(reply.get("stdout_tail", ""))[-TAIL_BYTES:],
        stderr_tail=str(reply.get("stderr_tail", ""))[-TAIL_BYTES:],
        events=events,
        violations=violations,
        runner_died=died,
        recycled=recycled,
        files=files,
        files_truncated=truncated,
    )
