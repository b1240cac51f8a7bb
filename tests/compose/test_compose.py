"""The compose deployment (compose/, docs/compose.md): images built with no registry, the stack up
on the local broker with the simulated backends and two replicas of the generator and the
executor, Prometheus scraping every replica, and every query of the Grafana dashboard answered
by that Prometheus (issue 16).

The dashboard's structure and the scrape configuration are checked without Docker. The stack
test needs a Docker engine that builds (it skips, saying why, only when there is none), root and
debootstrap for the offline base image (made once, then reused, as are the other images' layers),
and docker-compose 1.x (`.ci/install` installs it). It takes the stack down with its volumes,
whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollstream.infra import free_port
from rollstream.schemas.stages import STAGES as PIPELINE
from tests.helpers import missing

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
FILES = ("docker-compose.yml", "docker-compose.local.yml", "docker-compose.sim.yml")
DASHBOARD = COMPOSE / "grafana" / "dashboards" / "rollstream.json"
DATASOURCES = COMPOSE / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROMETHEUS_CONFIG = COMPOSE / "prometheus" / "prometheus.yml"
STAGES = {spec.name: spec.section for spec in PIPELINE}  # compose service (= stage) -> config section
REPLICAS = {"sampler": 1, "generator": 2, "executor": 2, "stream": 1, "learner": 1, "archiver": 1}
# What the issue asks the dashboard to show, as words its panel titles must hold.
PANELS = ("records in", "records out", "dead-lettered", "consumer lag", "latency", "reward per task family",
          "pass rate per task family", "staleness", "sandbox verdicts", "weight sync", "loss", "kl",
          "entropy", "grad norm", "importance weights", "clip fractions", "tokens per second", "turns per episode",
          "staleness per task family")
FALLBACK = re.compile(r"\bor\b[^()]*\bvector\s*\(|\bor\s+on\s*\(\s*\)|absent\s*\(", re.IGNORECASE)


def panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def dashboard_queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]


# --- without Docker -------------------------------------------------------------------------------


@pytest.mark.unit
def test_dashboard_structure_and_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    [source] = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    uid = source["uid"]
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        xs, ys = range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
        here = {(x, y) for x in xs for y in ys}
        assert not here & cells, f"panel {panel['title']!r} overlaps another"
        cells |= here
    for panel in panels():
        assert panel["type"] in ("timeseries", "heatmap", "stat", "gauge"), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
            expr = target["expr"]
            assert expr.strip() and "$" not in expr, f"{panel['title']}: {expr}"  # runs as is in Prometheus
            assert not FALLBACK.search(expr), f"{panel['title']}: a fallback hides missing data: {expr}"
    titles = " | ".join(p["title"].lower() for p in panels())
    missing = [name for name in PANELS if name not in titles]
    assert not missing, f"the dashboard has no panel for {missing}"


@pytest.mark.unit
def test_prometheus_scrapes_each_stage_on_its_metrics_port() -> None:
    """One job per stage, found through Docker's DNS (every replica), on the port both compose
    configs give the stage."""
    jobs = {job["job_name"]: job for job in yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]}
    for config_file in ("rollstream.toml", "rollstream.sim.toml"):
        config = tomllib.loads((COMPOSE / config_file).read_text())
        for service, section in STAGES.items():  # the evaluator too (a service of the "eval" profile)
            [sd] = jobs[service]["dns_sd_configs"]
            assert sd["names"] == [service] and sd["type"] == "A", service
            assert sd["port"] == config[section]["metrics_port"], f"{config_file}: {service}"
    service = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"]["evaluator"]
    assert service["profiles"] == ["eval"] and service["command"] == ["evaluator"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in service["volumes"]  # its own sandboxes


@pytest.mark.unit
def test_the_compose_stages_are_the_pipelines_stages() -> None:
    """Every stage of schemas/stages.py is one compose service running ``rollstream STAGE``, and no
    service runs a stage the table does not declare; the stack test scales every stage but the
    evaluator (a profile of its own)."""
    from rollstream.cli.stages import STAGE_COMMANDS

    services = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"]
    runs = {name: svc["command"][0] for name, svc in services.items()
            if svc.get("command") and svc["command"][0] in STAGE_COMMANDS}
    assert runs == {name: name for name in STAGES}, runs
    assert set(REPLICAS) == set(STAGES) - {"evaluator"}


# --- the stack ------------------------------------------------------------------------------------


def docker_builds() -> str | None:
    """Why Docker cannot build here, or None."""
    if shutil.which("docker") is None:
        return "no docker client"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                          text=True, check=False)
    if info.returncode != 0:
        return f"no Docker engine answers: {info.stderr.strip()[:200]}"
    return None


class Stack:
    """One compose project (its own name, network and volumes) of the files in :data:`FILES`."""

    def __init__(self, prometheus_port: int) -> None:
        self.project = f"rstest{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "PROMETHEUS_PORT": str(prometheus_port),
                    "COMPOSE_PROJECT_NAME": self.project}
        self.url = f"http://127.0.0.1:{prometheus_port}"

    def compose(self, *args: str, timeout: float = 600,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["docker-compose", *(a for f in FILES for a in ("-f", f)), *args]
        done = subprocess.run(cmd, cwd=COMPOSE, env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        if check and done.returncode != 0:
            output = done.stdout[-3000:] + done.stderr[-3000:]
            raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{output}")
        return done

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "40", check=False).stdout[-20000:]

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as response:
            return json.load(response)["data"]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else float("nan")


def wait_for(what: str, check, stack: Stack, timeout_s: float, every_s: float = 3.0):
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:  # Prometheus not answering yet
            last = exc
        else:
            if last:
                return last
        time.sleep(every_s)
    raise AssertionError(f"{what} not within {timeout_s:.0f} s (last: {last!r})\n{stack.logs()}")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    why = docker_builds()
    if why is not None:
        missing("docker", f"Docker cannot build here: {why}")
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is not installed (apt-get install docker-compose; .ci/install does)")
    from rollstream.cli.compose_images import build_compose_images, host_pip_cert

    started = time.monotonic()
    built = build_compose_images(offline=True, root=ROOT, pip_cert=host_pip_cert())
    print(f"images built in {time.monotonic() - started:.0f} s: {built}")
    stack = Stack(free_port())
    try:
        started = time.monotonic()
        stack.compose("up", "-d", "--no-build", "--scale", "executor=2", "--scale", "generator=2")
        print(f"docker-compose up -d took {time.monotonic() - started:.0f} s")
        yield stack
    finally:
        started = time.monotonic()
        stack.compose("down", "-v", "--remove-orphans", "--timeout", "20", check=False)
        print(f"docker-compose down -v took {time.monotonic() - started:.0f} s")


@pytest.mark.e2e
@pytest.mark.timeout(1800)  # the first build of the stage image (torch, the project) takes most of it
def test_stack_runs_offline_and_every_dashboard_query_finds_data(stack: Stack) -> None:
    started = time.monotonic()
    steps = "max(rollstream_learner_steps_total)"
    wait_for("the learner's 2 steps", lambda: stack.value(steps) >= 2, stack, 420)
    print(f"learner at 2 steps {time.monotonic() - started:.0f} s after up")

    # Every replica of every stage is a target, and up.
    def targets_up() -> dict[str, int]:
        up = {r["metric"]["instance"]: (r["metric"]["job"], r["value"][1]) for r in stack.query("up")}
        counts = {job: sum(1 for j, v in up.values() if j == job and v == "1") for job in REPLICAS}
        return counts if counts == REPLICAS else {}

    wait_for(f"targets up per stage {REPLICAS}", targets_up, stack, 60)
    targets = stack.api("/api/v1/targets?state=active")["activeTargets"]
    down = [(t["labels"]["job"], t["scrapeUrl"], t["lastError"]) for t in targets if t["health"] != "up"]
    assert not down, down

    # A record no stage can decode: the generator dead-letters it and moves on (the dead-letter
    # panel's series, and its alert).
    stack.compose("exec", "-T", "sampler", "python", "-c", (
        "import asyncio\nfrom aiokafka import AIOKafkaProducer\n"
        "async def main():\n"
        "    p = AIOKafkaProducer(bootstrap_servers='kafka:9092')\n"
        "    await p.start()\n"
        "    await p.send_and_wait('rollstream.prompts', b'not an event', key=b'poison')\n"
        "    await p.stop()\n"
        "asyncio.run(main())\n"))

    # The replicas of a scaled stage split its partitions: each one consumes.
    for job, topic in (("generator", "prompts"), ("executor", "actions")):
        consuming = f'sum by (instance) (rollstream_records_in_total{{job="{job}", topic="{topic}"}}) > 0'
        wait_for(f"both {job} replicas consuming {topic}", lambda q=consuming: len(stack.query(q)) == 2,
                 stack, 180)

    # Every query of every panel, as Grafana sends it, finds series (a legitimately zero metric,
    # KL with kl_beta = 0, still has its series).
    # The held-out panels read the evaluator (rollstream run --eval-every N; not in this stack):
    # Prometheus must accept their queries; their data comes with an evaluator.
    queries = [(title, expr) for title, expr in dashboard_queries() if "held-out" not in title.lower()]
    for title, expr in dashboard_queries():
        if "held-out" in title.lower():
            stack.query(expr)  # raises on a query Prometheus refuses
    missing: list[tuple[str, str]] = []

    def all_found() -> bool:
        missing[:] = [(title, expr) for title, expr in queries if not stack.query(expr)]
        return not missing

    try:
        wait_for("data for every dashboard query", all_found, stack, 120, every_s=5)
    except AssertionError:
        raise AssertionError(f"dashboard queries with no data: {missing}\n{stack.logs()}") from None
    assert stack.value("max(rollstream_learner_kl)") == 0.0  # the sim learner's KL: zero, and there

    # The alert rules loaded and evaluate; the poison record fires DeadLetters.
    groups = stack.api("/api/v1/rules")["groups"]
    rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert {"StageDown", "StageMissing", "ConsumerLagGrowing", "DeadLetters", "StaleDropsHigh",
            "SandboxTamper", "FamilyForgetting", "DomainForgetting"} <= set(rules), sorted(rules)
    unhealthy = [(name, rule.get("lastError")) for name, rule in rules.items() if rule["health"] != "ok"]
    assert not unhealthy, unhealthy
    wait_for("the DeadLetters alert", lambda: any(
        a["labels"]["alertname"] == "DeadLetters" and a["labels"].get("stage") == "generator"
        for a in stack.api("/api/v1/alerts")["alerts"]), stack, 60)

    # No stage crashed on the way (restart: on-failure would hide it).
    ids = stack.compose("ps", "-q", *REPLICAS).stdout.split()
    inspect = subprocess.run(["docker", "inspect", "--format", "{{.Name}} {{.RestartCount}}", *ids],
                             capture_output=True, text=True, check=True).stdout.split("\n")
    restarted = [line for line in inspect if line.strip() and not line.endswith(" 0")]
    assert len(ids) == sum(REPLICAS.values()) and not restarted, (ids, restarted)
    print(f"checks done {time.monotonic() - started:.0f} s after up")
