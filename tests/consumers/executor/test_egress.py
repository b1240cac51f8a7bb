"""Network for the tasks that ask for it (issue 37), against hosts of the tests' own only: HTTP
servers in containers on a network this test creates, never an outside address. The sandbox keeps
network none; its only way out is the egress proxy, which lets through exactly the task's entries
and records every connection for the job that made it. Pure logic of the allowlist: test_egress_rules.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import msgspec
import pytest

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.egress import EgressError
from rollstream.consumers.executor.jobs import Job
from rollstream.consumers.executor.pool import LABEL, OWNER_LABEL, DockerSandboxPool
from rollstream.consumers.executor.rewards import RewardRegistry
from rollstream.consumers.executor.score import audit_record, evaluate
from rollstream.schemas.events import RewardSpec
from tests.fixtures.sandbox import check_references

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]  # containment: again under runsc in CI

SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (sys.argv[1] + ' ' + self.path).encode()
        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
import threading
for port in (8000, 8001):
    server = http.server.ThreadingHTTPServer(('0.0.0.0', port), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
threading.Event().wait()
"""


@pytest.fixture
async def hosts(sandbox_image: str, owner: str) -> AsyncIterator[dict[str, Any]]:
    """A network of the test's own with two web servers on it, ``web`` and ``other`` (ports 8000, 8001)."""
    import aiodocker

    name = f"rollstream-test-net-{uuid.uuid4().hex[:8]}"
    async with aiodocker.Docker() as docker:
        network = await docker.networks.create({"Name": name, "Labels": {LABEL: "1", OWNER_LABEL: owner}})
        containers = []
        try:
            found: dict[str, Any] = {"network": name}
            shop = ["python3", "-c", (resources.files("rollstream.tasks") / "service.py").read_text(), "--port", "8080"]
            for alias, cmd in (("web", ["python3", "-c", SERVER, "web"]), ("other", ["python3", "-c", SERVER, "other"]),
                               ("tasks-api", shop)):
                container = await docker.containers.run(
                    {"Image": sandbox_image, "Cmd": cmd, "User": "65534:65534",
                     "Labels": {LABEL: "1", OWNER_LABEL: owner},
                     "HostConfig": {"NetworkMode": name, "AutoRemove": True, "ReadonlyRootfs": True},
                     "NetworkingConfig": {"EndpointsConfig": {name: {"Aliases": [alias]}}}},
                    name=f"{name}-{alias}")
                containers.append(container)
                info = await container.show()
                found[alias] = info["NetworkSettings"]["Networks"][name]["IPAddress"]
                found["gateway"] = info["NetworkSettings"]["Networks"][name]["Gateway"]
            yield found
        finally:
            for container in containers:
                try:
                    await container.delete(force=True)
                except aiodocker.DockerError:
                    pass
            await network.delete()


@pytest.fixture
async def egress_pool(executor_config: ExecutorConfig, hosts: dict[str, Any]) -> AsyncIterator[DockerSandboxPool]:
    config = msgspec.structs.replace(executor_config, egress_network=hosts["network"], keyed_pool_size=1,
                                     egress_allowed=["web:8000", "other:8001", "tasks-api:8080"], egress_private=True)
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        yield pool


PROBE = r"""
import json, os, socket, urllib.request, urllib.error
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=5).read().decode()
    except urllib.error.HTTPError as exc:
        return f'HTTP {exc.code}'
    except OSError as exc:
        return f'{type(exc).__name__}'
def raw(host, port, udp=False):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        if udp:  # a DNS query for example.com
            s.sendto(bytes.fromhex('123401000001000000000000076578616d706c6503636f6d0000010001'), (host, port))
            return 'answered %d bytes' % len(s.recv(512))
        s.connect((host, port))
        return 'connected'
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()
out = {'proxy_env': os.environ.get('HTTP_PROXY'), 'interfaces': sorted(n for _, n in socket.if_nameindex())}
"""


async def run(pool: DockerSandboxPool, network: list[str], code: str, job_id: str) -> tuple[dict, list]:
    result = await pool.execute(Job(job_id=job_id, code=PROBE + code + "\nprint(json.dumps(out))", network=network,
                                    trust="in_process", timeout_s=30.0))
    assert result.exit_code == 0, result.stderr_tail
    return json.loads(result.stdout_tail.strip().splitlines()[-1]), result.connections


async def test_the_allowed_host_and_port_and_nothing_else(egress_pool: DockerSandboxPool, hosts: dict) -> None:
    seen, connections = await run(egress_pool, ["web:8000"], f"""
out['allowed'] = get('http://web:8000/hello')
out['other_port'] = get('http://web:8001/')
out['other_host'] = get('http://other:8000/')
out['by_address'] = get('http://{hosts["web"]}:8000/')
""", "egress-allowed")
    assert seen["proxy_env"] == "http://127.0.0.1:3128" and seen["interfaces"] == ["lo"]  # still network none
    assert seen["allowed"] == "web /hello"
    assert seen["other_port"] == seen["other_host"] == seen["by_address"] == "HTTP 403"
    verdicts = {(c["host"], c["port"]): c["verdict"] for c in connections}
    assert verdicts == {("web", 8000): "allowed", ("web", 8001): "denied", ("other", 8000): "denied",
                        (hosts["web"], 8000): "denied"}
    allowed = next(c for c in connections if c["verdict"] == "allowed")
    assert allowed["sent"] > 0 and allowed["received"] > 0 and allowed["method"] == "GET"


async def test_https_connect_is_tunnelled_only_to_an_allowed_entry(egress_pool: DockerSandboxPool) -> None:
    seen, connections = await run(egress_pool, ["web:8000"], """
def tunnel(target):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=5)
    s.sendall(('CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % (target, target)).encode())
    status = s.recv(4096).split(b'\\r\\n')[0].decode()
    if ' 200 ' in status:
        s.sendall(b'GET /through HTTP/1.1\\r\\nHost: web\\r\\nConnection: close\\r\\n\\r\\n')
        reply = b''
        while chunk := s.recv(4096):  # to the end: the head and the body may come apart
            reply += chunk
        status += ' | ' + reply.split(b'\\r\\n\\r\\n', 1)[-1].decode()
    s.close()
    return status
out['web'] = tunnel('web:8000')
out['other'] = tunnel('other:8001')
""", "egress-connect")
    assert seen["web"].endswith("web /through") and " 200 " in seen["web"]
    assert " 403 " in seen["other"]
    assert {(c["host"], c["method"], c["verdict"]) for c in connections} == {
        ("web", "CONNECT", "allowed"), ("other", "CONNECT", "denied")}


async def test_what_does_not_go_through_the_proxy_fails(egress_pool: DockerSandboxPool, hosts: dict) -> None:
    seen, connections = await run(egress_pool, ["web:8000"], f"""
out['web_direct'] = raw('{hosts["web"]}', 8000)
out['gateway'] = raw('{hosts["gateway"]}', 6379)
out['docker0'] = raw('172.17.0.1', 2375)
out['embedded_dns'] = raw('127.0.0.11', 53, udp=True)
out['public_dns'] = raw('8.8.8.8', 53, udp=True)
try:
    out['resolve'] = socket.gethostbyname('web')
except OSError as exc:
    out['resolve'] = type(exc).__name__
try:  # the sockets' directory: each sandbox's socket has a random name nobody can list
    out['listing'] = os.listdir('/egress/sock')
except OSError as exc:
    out['listing'] = type(exc).__name__
s = socket.socket(socket.AF_UNIX)
try:  # the one shared socket there was before, without the relay's token
    s.connect('/egress/sock/proxy.sock')
    s.sendall(b'ROLLSTREAM-TOKEN forged\\r\\nGET http://web:8000/ HTTP/1.1\\r\\nHost: web\\r\\n\\r\\n')
    out['forged'] = s.recv(4096).split(b'\\r\\n')[0].decode()
except OSError as exc:
    out['forged'] = type(exc).__name__
""", "egress-raw")
    for key in ("web_direct", "gateway", "docker0", "public_dns"):
        assert seen[key] in ("OSError", "TimeoutError", "ConnectionRefusedError"), (key, seen[key])
    assert not seen["embedded_dns"].startswith("answered"), seen["embedded_dns"]
    assert seen["resolve"] == "gaierror"  # no resolver in the sandbox: names resolve at the proxy
    assert seen["listing"] == "PermissionError"  # 0300: not even the owner's uid (the sandbox's) lists it
    assert seen["forged"] == "FileNotFoundError"  # no socket but the sandbox's own, under a name it never sees
    assert connections == []


async def test_a_second_sandbox_is_out_of_reach_and_jobs_are_told_apart(egress_pool: DockerSandboxPool) -> None:
    first, one = await run(egress_pool, ["web:8000"], "out['got'] = get('http://web:8000/one')", "egress-one")
    second, two = await run(egress_pool, ["web:8000"], "out['got'] = get('http://other:8000/two')", "egress-two")
    assert first["got"] == "web /one" and second["got"] == "HTTP 403"
    assert [c["verdict"] for c in one] == ["allowed"] and [c["verdict"] for c in two] == ["denied"]
    # a listener in one sandbox is reachable by nobody else: there is no address to reach it at
    listener, _ = await run(egress_pool, ["web:8000"], """
srv = socket.socket(); srv.bind(('0.0.0.0', 9999)); srv.listen(1)
out['routes'] = open('/proc/net/route').read().splitlines()[1:]
""", "egress-listen")
    assert listener["interfaces"] == ["lo"] and listener["routes"] == []


async def test_a_task_beyond_the_operators_allowlist_is_refused(egress_pool: DockerSandboxPool,
                                                                  registry: RewardRegistry) -> None:
    spec = RewardSpec(tests=["assert True"], network=["web:8001"])
    with pytest.raises(EgressError, match="executor.egress_allowed"):
        await evaluate(egress_pool, registry, spec, "```python\nx = 1\n```", "egress-beyond")
    wider = msgspec.structs.replace(spec, network=[".example.com:443"])
    with pytest.raises(ValueError, match="beyond executor.egress_allowed"):
        await evaluate(egress_pool, registry, wider, "```python\nx = 1\n```", "egress-wider")
    assert not egress_pool._keyed


async def test_the_audit_record_carries_the_connections(egress_pool: DockerSandboxPool,
                                                        registry: RewardRegistry) -> None:
    spec = RewardSpec(network=["web:8000"], setup="import urllib.request", tests=[
        "assert urllib.request.urlopen('http://web:8000/t', timeout=5).read() == b'web /t'"])
    code = "```python\nimport urllib.request\ntry:\n    urllib.request.urlopen('http://other:8000/', timeout=5)\n" \
           "except Exception:\n    pass\n```"
    evaluation = await evaluate(egress_pool, registry, spec, code, "egress-audit")
    assert evaluation.scored.reward == 1.0, evaluation.scored.execution
    audit = audit_record(evaluation, egress_pool.limits, "r/1", 0.0)
    assert sorted((c.host, c.verdict) for c in audit.connections) == [("other", "denied"), ("web", "allowed")]


async def test_a_task_without_network_still_has_none(egress_pool: DockerSandboxPool) -> None:
    result = await egress_pool.execute(Job(job_id="plain", trust="in_process", code=PROBE + """
out['egress'] = os.path.exists('/egress')
out['relay'] = raw('127.0.0.1', 3128)
print(json.dumps(out))"""))
    seen = json.loads(result.stdout_tail.strip().splitlines()[-1])
    assert seen == {"proxy_env": None, "interfaces": ["lo"], "egress": False, "relay": "ConnectionRefusedError"}
    assert result.connections == []


async def test_the_outside_network_tasks_pass_with_their_references_and_fail_with_wrong_code(
        egress_pool: DockerSandboxPool, registry: RewardRegistry) -> None:
    from rollstream.tasks.outside import network_tasks

    await check_references(egress_pool, registry, network_tasks())


async def test_a_flood_of_connections_is_capped_and_the_next_job_is_served(egress_pool: DockerSandboxPool) -> None:
    seen, connections = await run(egress_pool, ["web:8000"], """
held = []
for _ in range(200):
    try:
        held.append(socket.create_connection(('127.0.0.1', 3128), timeout=2))
    except OSError:
        break
out['opened'] = len(held)
out['then'] = get('http://web:8000/after')
""", "egress-flood")
    assert seen["then"] != "web /after"  # past the relay's cap (32 at once): refused
    assert len(connections) <= 32 and all(c["verdict"] == "denied" for c in connections)  # none asked anything
    following, _ = await run(egress_pool, ["web:8000"], "out['got'] = get('http://web:8000/next')", "egress-next")
    assert following["got"] == "web /next"  # the job's end closed them all: the container serves on


FLOOD = """
import os, socket, time
def flood(seconds):
    held, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        s = socket.socket(socket.AF_UNIX)
        try:  # straight at the proxy's sockets, without a token: the names it can guess
            s.setblocking(False)
            s.connect('/egress/sock/proxy.sock')
            held.append(s)
        except OSError:
            s.close()
        try:  # through the relay: connections that never ask anything, opened as fast as it can
            held.append(socket.create_connection(('127.0.0.1', 3128), timeout=0.5))
        except OSError:
            pass
        while len(held) > 24:
            held.pop(0).close()
pids = []
for _ in range(12):
    pid = os.fork()
    if pid == 0:
        flood(4.0)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
out['flooded'] = True
"""


@pytest.fixture
async def egress_pair(executor_config: ExecutorConfig, hosts: dict[str, Any]) -> AsyncIterator[DockerSandboxPool]:
    """A keyed pool of two sandboxes sharing one egress proxy, two jobs at once."""
    config = msgspec.structs.replace(executor_config, egress_network=hosts["network"], keyed_pool_size=2,
                                     concurrency=2, egress_allowed=["web:8000"], egress_private=True)
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        yield pool


async def test_a_flood_from_one_sandbox_costs_the_other_sandboxs_job_nothing(egress_pair: DockerSandboxPool) -> None:
    """Issue 52: one job flooding the proxy from many processes (its socket directly, the relay)
    while honest jobs of the same task run on the pool's other container: each honest job passes,
    with its connection its own; the flood's connections are the flooding job's record alone."""
    hostile = asyncio.create_task(run(egress_pair, ["web:8000"], FLOOD, "egress-flooder"))
    honest, sandboxes = 0, set()
    while not hostile.done():
        result = await egress_pair.execute(Job(job_id=f"egress-honest-{honest}", trust="in_process", timeout_s=10.0,
                                               network=["web:8000"], code=PROBE + (
            "out['got'] = get('http://web:8000/honest')\nprint(json.dumps(out))")))
        seen = json.loads(result.stdout_tail.strip().splitlines()[-1])
        assert seen["got"] == "web /honest", (honest, seen)
        assert [(c["host"], c["verdict"]) for c in result.connections] == [("web", "allowed")], result.connections
        honest += 1
        sandboxes.add(result.sandbox_id)
    flooded, connections = await hostile
    assert flooded["flooded"] and honest >= 1
    assert connections and all(c["verdict"] == "denied" for c in connections)  # none asked anything
    assert len(connections) <= 1000


async def test_by_default_only_public_addresses_are_reached(executor_config: ExecutorConfig, hosts: dict) -> None:
    """The test's hosts live on a private network, like the host's and the gateway's services: an
    allowed name that resolves there is refused unless the operator says executor.egress_private."""
    config = msgspec.structs.replace(executor_config, egress_network=hosts["network"], keyed_pool_size=1,
                                     egress_allowed=["web:8000", f"{hosts['gateway']}:80"])
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        seen, connections = await run(pool, ["web:8000", f"{hosts['gateway']}:80"], f"""
out['web'] = get('http://web:8000/')
out['gateway'] = get('http://{hosts["gateway"]}:80/')
""", "egress-public-only")
    assert seen["web"] == seen["gateway"] == "HTTP 403"
    assert [c["verdict"] for c in connections] == ["denied", "denied"]
    assert all("not a public address" in c["reason"] for c in connections)
