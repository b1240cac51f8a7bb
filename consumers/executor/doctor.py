"""`rollstream sandbox doctor`: which container runtimes run the sandbox here, and why not.

For each runtime rollstream knows (``runc``, ``runsc``) and any other the Docker engine has
registered, it starts one warm sandbox under that runtime and scores known completions through
the real judge: one that passes one test of two (the verdict must say 1 of 2), one that tries to
create a SysV shared-memory segment (it must be refused: an object that outlives a job would
reach the next one), and a short run of executions for the time each takes. Then the egress path
(``RewardSpec.network``, docs/executor.md "Network"): a sandbox of a pool with an allowlist asks its
proxy (started on network ``none``) for a host the proxy cannot resolve; it works when the proxy
answers 502 and records the connection as the job's (under runsc that needs ``--host-uds=open``). It reports what the
sandbox's kernel says it is and, for a runtime that does not work, why and what to do. Last, the
sandbox images the engine holds (label ``rollstream.sandbox.image``) and the languages each runs,
with the compiler versions a language image recorded in its labels (image.py ``LANGUAGES_LABEL``,
``COMPILER_LABEL``): ``rollstream sandbox build --languages ...`` makes them.

Consumes: the Docker engine and the sandbox image. Produces: a table on stdout (``--json``: one
object); exit status 0 when the configured ``executor.runtime`` works, 1 otherwise.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid

import msgspec

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.image import COMPILER_LABEL, LANGUAGES_LABEL, PYTHON
from rollstream.consumers.executor.jobs import Job
from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.rewards import default_registry
from rollstream.consumers.executor.score import evaluate
from rollstream.errors import SandboxError
from rollstream.schemas.events import RewardSpec

KNOWN = ("runc", "runsc")
WHAT = {"runc": "the host's kernel (namespaces, cgroups, seccomp)",
        "runsc": "gVisor: a kernel of its own in user space, between the code and the host's"}
HOW_TO_REGISTER = {
    "runsc": "install gVisor (Debian: `apt-get install runsc`) and register it in /etc/docker/daemon.json as "
             '"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open"]}}, '
             "then "
             "`kill -HUP $(pidof dockerd)`; .ci/install does both",
}
PROBE = """import os
print("kernel", os.uname().release)
def add(a, b):
    return a + b
"""
IPC = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
made = libc.shmget(0, 4096, 0o1666 | 0o1000)
print("shmget", made, ctypes.get_errno())
if made >= 0:
    libc.shmctl(made, 0, None)  # IPC_RMID: leave nothing behind either way
"""
EGRESS = """import urllib.error, urllib.request
try:
    urllib.request.urlopen("http://doctor.invalid/", timeout=10)
    print("egress", "answered")
except urllib.error.HTTPError as exc:
    print("egress", exc.code)
except OSError as exc:
    print("egress", type(exc).__name__)
"""
EGRESS_HOST = "doctor.invalid:80"
TIMED = 10


class RuntimeCheck(msgspec.Struct, kw_only=True):
    runtime: str
    registered: bool
    works: bool = False
    what: str = ""
    kernel: str = ""
    start_s: float | None = None  # one warm container: create, start, runner ready
    execution_ms: float | None = None  # median of TIMED executions (pass one test of two)
    problem: str = ""
    egress: str = ""  # "works", or why a task with a network allowlist would reach nothing here


class ImageLanguages(msgspec.Struct, kw_only=True):
    image: str  # its tags, comma-separated (its id where it has none)
    languages: list[str]  # ["python"] for the Python image
    compilers: dict[str, str] = {}  # language -> the version line its label recorded


def image_languages(tags: list[str], labels: dict[str, str], image_id: str = "") -> ImageLanguages:
    """What one sandbox image's labels say it runs."""
    named = [name for name in (labels.get(LANGUAGES_LABEL) or PYTHON).split(",") if name]
    return ImageLanguages(image=",".join(tags) or image_id[:19], languages=named,
                          compilers={name: labels[COMPILER_LABEL + name] for name in named
                                     if COMPILER_LABEL + name in labels})


async def sandbox_images(config: ExecutorConfig) -> list[ImageLanguages]:
    """Every sandbox image the engine holds and the languages (and compiler versions) it records."""
    import aiodocker

    docker = aiodocker.Docker(url=config.docker_url or None)
    try:
        found = await docker.images.list(filters=json.dumps({"label": ["rollstream.sandbox.image"]}))
    except Exception as exc:
        raise SandboxError(f"cannot list the sandbox images: {exc}") from exc
    finally:
        await docker.close()
    images = [image_languages(sorted(t for t in (i.get("RepoTags") or []) if t != "<none>:<none>"),
                              i.get("Labels") or {}, i.get("Id", "")) for i in found]
    return sorted(images, key=lambda i: (len(i.languages), i.image))


async def check_runtime(config: ExecutorConfig, runtime: str, registered: bool) -> RuntimeCheck:
    """Start one sandbox under ``runtime`` and score the probes through it."""
    check = RuntimeCheck(runtime=runtime, registered=registered, what=WHAT.get(runtime, ""))
    if not registered:
        check.problem = "not registered with the Docker engine; " + HOW_TO_REGISTER.get(
            runtime, "register it in daemon.json's runtimes")
        return check
    pool_config = msgspec.structs.replace(config, runtime=runtime, pool_size=1, concurrency=1, keyed_pool_size=1,
                                          owner=f"{config.owner}-doctor-{uuid.uuid4().hex[:6]}",
                                          egress_allowed=[EGRESS_HOST], egress_network="none")
    registry = default_registry(entry_points=[])
    started = time.monotonic()
    try:
        async with DockerSandboxPool(pool_config, grace_s=3.0) as pool:
            check.start_s = round(time.monotonic() - started, 2)
            spec = RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3", "assert add(2, 2) == 5"])
            seconds = []
            for index in range(TIMED):
                begun = time.monotonic()
                probe = await evaluate(pool, registry, spec, f"```python\n{PROBE}```", f"doctor-{index}")
                seconds.append(time.monotonic() - begun)
                execution = probe.scored.execution
                if (execution.tests_passed, execution.tests_total) != (1, 2):
                    check.problem = (f"a completion passing one test of two was judged {execution.tests_passed} of "
                                     f"{execution.tests_total} ({execution.error_kind}: {execution.error_message[:200]})")
                    return check
            check.execution_ms = round(1000 * statistics.median(seconds), 1)
            check.kernel = next((line.split(" ", 1)[1] for line in execution.stdout_tail.splitlines()
                                 if line.startswith("kernel ")), "")
            ipc = await evaluate(pool, registry, RewardSpec(tests=["assert True"]), f"```python\n{IPC}```", "doctor-ipc")
            said = next((line.split() for line in ipc.scored.execution.stdout_tail.splitlines()
                         if line.startswith("shmget ")), None)
            if said is None or int(said[1]) >= 0:
                check.problem = ("a job could create a SysV shared-memory segment (it would outlive the job): "
                                 f"{ipc.scored.execution.stdout_tail[-200:]!r}")
                return check
            check.egress = await check_egress(pool, runtime)
    except SandboxError as exc:
        check.problem = str(exc)[:600]
        return check
    check.works = True
    return check


async def check_egress(pool: DockerSandboxPool, runtime: str) -> str:
    """"works", or what a task with a network allowlist would meet under ``runtime``."""
    try:
        result = await pool.execute(Job(job_id="doctor-egress", code=EGRESS, network=[EGRESS_HOST],
                                        trust="in_process", timeout_s=20.0))
    except SandboxError as exc:
        return f"the egress proxy did not start: {str(exc)[:300]}"
    said = next((line.split()[1] for line in result.stdout_tail.splitlines() if line.startswith("egress ")), "")
    recorded = [(c.get("host"), c.get("verdict")) for c in result.connections]
    if said == "502" and recorded == [("doctor.invalid", "failed")]:
        return "works"
    hint = " (runsc must be registered with --host-uds=open: .ci/register-runsc)" if runtime == "runsc" else ""
    return f"the sandbox did not reach its proxy: it saw {said or result.stderr_tail[-200:]!r}, recorded {recorded}{hint}"


async def doctor(config: ExecutorConfig) -> list[RuntimeCheck]:
    """Every known or registered runtime, checked one after another."""
    import aiodocker

    try:
        docker = aiodocker.Docker(url=config.docker_url or None)
    except Exception as exc:
        raise SandboxError(f"cannot reach the Docker engine: {exc}") from exc
    try:
        info = await docker.system.info()
    except Exception as exc:
        raise SandboxError(f"cannot use the Docker engine: {exc}") from exc
    finally:
        await docker.close()
    registered = set(info.get("Runtimes") or {"runc": {}})
    runtimes = [*KNOWN, *sorted(registered - set(KNOWN) - {"io.containerd.runc.v2", "io.containerd.runtime.v1.linux"})]
    return [await check_runtime(config, runtime, runtime in registered) for runtime in runtimes]


def render(checks: list[RuntimeCheck], configured: str) -> str:
    rows = [("runtime", "works", "start s", "exec ms", "egress", "kernel", "")]
    for c in checks:
        rows.append((c.runtime + (" *" if c.runtime == configured else ""), "yes" if c.works else "no",
                     "" if c.start_s is None else f"{c.start_s:.2f}",
                     "" if c.execution_ms is None else f"{c.execution_ms:.1f}",
                     "" if not c.works else "yes" if c.egress == "works" else "no", c.kernel[:40],
                     (c.what + ("" if c.egress == "works" else f"; egress: {c.egress}")) if c.works else c.problem))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(value.ljust(width) for value, width in zip(row[:6], widths, strict=True)) + "  " + row[6]
             for row in rows]
    return "\n".join(lines) + f"\n* executor.runtime ({configured})"


def render_images(images: list[ImageLanguages]) -> str:
    lines = ["sandbox images (languages; compiler versions from the image's labels):"]
    for image in images:
        lines.append(f"  {image.image}: {', '.join(image.languages)}")
        lines += [f"    {name}: {version}" for name, version in image.compilers.items()]
    if not images:
        lines.append("  none: rollstream sandbox build --offline (Python), --languages c,cpp,java,javascript,go,rust")
    return "\n".join(lines)


def report(checks: list[RuntimeCheck], configured: str, as_json: bool,
           images: list[ImageLanguages] | None = None) -> tuple[str, int]:
    """The text (or JSON) to print and the exit status: 0 when the configured runtime works."""
    ok = any(c.runtime == configured and c.works for c in checks)
    if as_json:
        body = {"configured": configured, "works": ok, "runtimes": [msgspec.to_builtins(c) for c in checks]}
        if images is not None:
            body["images"] = [msgspec.to_builtins(i) for i in images]
        text = json.dumps(body, indent=2)
    else:
        text = render(checks, configured) + ("" if images is None else "\n" + render_images(images))
    return text, 0 if ok else 1

