"""The second sandbox image, with Debian's compilers (issue 54, item 1): the build plan per language
set (unit), what `rollstream sandbox doctor` lists from an image's labels (unit), and, where the
polyglot image has been built (`rollstream sandbox build --languages c,cpp,java,javascript,go,rust`:
.ci/install builds it), a hello world compiled and run in each language as the sandbox's
user, with no network, a read-only root and a tmpfs /tmp (sandbox).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from rollstream.consumers.executor.doctor import image_languages, render_images, report
from rollstream.consumers.executor.image import (
    _IMAGE_CHANGES,
    COMPILER_LABEL,
    DEFAULT_TAG,
    LANGUAGES,
    LANGUAGES_LABEL,
    POLYGLOT_TAG,
    PYTEST_LABEL,
    SANDBOX_PACKAGES,
    SANDBOX_UID,
    build_image,
    build_plan,
    image_tag,
    parse_languages,
)
from rollstream.errors import ConfigError
from tests.helpers import missing

ALL = ("c", "cpp", "java", "javascript", "go", "rust")


@pytest.mark.unit
def test_python_alone_is_todays_image_unchanged():
    for chosen in (None, "", "python", ["python"], " Python "):
        plan = build_plan(chosen)
        assert plan.languages == () and plan.tag == DEFAULT_TAG
        assert plan.packages == SANDBOX_PACKAGES == ("python3", "python3-pytest")
        assert plan.versions == {} and plan.changes({}) == _IMAGE_CHANGES


@pytest.mark.unit
def test_every_language_packages_and_labels():
    plan = build_plan("c,cpp,java,javascript,go,rust")
    assert plan.languages == ALL and plan.tag == POLYGLOT_TAG == "rollstream-sandbox-polyglot:latest"
    assert plan.packages == ("python3", "python3-pytest", "gcc", "libc6-dev", "g++", "openjdk-17-jdk-headless",
                             "nodejs", "golang-go", "rustc")
    assert list(plan.versions) == ["python", *ALL]
    assert plan.versions["java"] == ("javac", "-version") and plan.versions["go"] == ("go", "version")
    versions = {name: f"{name} 1.2 (Debian \"x\")" for name in plan.versions}
    changes = plan.changes(versions)
    # today's hardening and settings, in the same order, then the language labels, CMD last
    assert changes[:len(_IMAGE_CHANGES) - 1] == _IMAGE_CHANGES[:-1] and changes[-1] == _IMAGE_CHANGES[-1]
    assert f"USER {SANDBOX_UID}:{SANDBOX_UID}" in changes and "WORKDIR /work" in changes
    assert f"LABEL {PYTEST_LABEL}=1" in changes
    assert f"LABEL {LANGUAGES_LABEL}=python,c,cpp,java,javascript,go,rust" in changes
    assert f'LABEL {COMPILER_LABEL}cpp="cpp 1.2 (Debian \\"x\\")"' in changes


@pytest.mark.unit
def test_a_subset_in_canonical_order_once_each_with_its_own_tag():
    plan = build_plan(["Rust", "c", "python", "rust", " c "])
    assert plan.languages == ("c", "rust") and plan.tag == "rollstream-sandbox-c-rust:latest"
    # rustc brings gcc and libc6-dev itself; C names them, once
    assert plan.packages == ("python3", "python3-pytest", "gcc", "libc6-dev", "rustc")
    assert list(plan.versions) == ["python", "c", "rust"]
    assert build_plan("java").packages == ("python3", "python3-pytest", "openjdk-17-jdk-headless")
    assert build_plan("go,javascript").tag == "rollstream-sandbox-javascript-go:latest"
    assert build_plan(list(reversed(ALL))).tag == POLYGLOT_TAG
    assert build_plan("c", tag="mine:1").tag == "mine:1"
    assert image_tag(()) == DEFAULT_TAG and image_tag(("cpp",)) == "rollstream-sandbox-cpp:latest"
    assert tuple(LANGUAGES) == ALL


@pytest.mark.unit
def test_an_unknown_language_is_refused_listing_the_known_ones():
    for wrong in ("c,cobol", ["c++"], "js"):
        with pytest.raises(ConfigError) as caught:
            parse_languages(wrong)
        assert "unknown language" in str(caught.value)
        assert "known: python, c, cpp, java, javascript, go, rust" in str(caught.value)
    with pytest.raises(ConfigError, match="'fortran'"):
        build_image(offline=True, languages="fortran")  # refused before anything is built


@pytest.mark.unit
def test_a_language_build_never_takes_the_python_images_tag(monkeypatch: pytest.MonkeyPatch):
    import rollstream.consumers.executor.image as image

    built = []
    monkeypatch.setattr(image, "_build_languages", lambda plan, mirror: built.append(plan) or "id")
    monkeypatch.setattr(image, "_build_offline", lambda tag, mirror: built.append(tag) or "id")
    build_image(offline=True, languages="go")
    build_image(offline=True, languages=["python"])
    build_image(True, "mine:2", languages="rust,c")
    assert [built[0].tag, built[1], built[2].tag] == ["rollstream-sandbox-go:latest", DEFAULT_TAG, "mine:2"]
    assert built[2].packages[-3:] == ("gcc", "libc6-dev", "rustc")


@pytest.mark.unit
def test_the_command_refuses_an_unknown_language(capsys: pytest.CaptureFixture[str]):
    from rollstream.cli.main import main

    assert main(["sandbox", "build", "--languages", "c,cobol"]) == 2
    assert "unknown language 'cobol' for the sandbox image; known: python, c, cpp" in capsys.readouterr().err


@pytest.mark.unit
def test_doctor_lists_each_images_languages_and_compilers():
    python = image_languages(["rollstream-sandbox:latest"], {"rollstream.sandbox.image": "1", PYTEST_LABEL: "1"})
    assert python.languages == ["python"] and python.compilers == {}
    labels = {"rollstream.sandbox.image": "1", LANGUAGES_LABEL: "python,c,go",
              COMPILER_LABEL + "python": "Python 3.11.2", COMPILER_LABEL + "c": "gcc (Debian 12.2.0-14) 12.2.0",
              COMPILER_LABEL + "go": "go version go1.19.8 linux/amd64"}
    poly = image_languages(["rollstream-sandbox-c-go:latest"], labels)
    assert poly.languages == ["python", "c", "go"]
    assert poly.compilers == {"python": "Python 3.11.2", "c": "gcc (Debian 12.2.0-14) 12.2.0",
                              "go": "go version go1.19.8 linux/amd64"}
    text = render_images([python, poly])
    assert "rollstream-sandbox:latest: python" in text
    assert "rollstream-sandbox-c-go:latest: python, c, go" in text and "    c: gcc (Debian 12.2.0-14) 12.2.0" in text
    body = json.loads(report([], "runc", True, [python, poly])[0])
    assert body["images"][1]["compilers"]["go"] == "go version go1.19.8 linux/amd64"
    assert "sandbox images" not in report([], "runc", False)[0]  # without images: the table as before
    assert "none: rollstream sandbox build" in render_images([])


# -- the built image (sandbox tier) -------------------------------------------------------------

HELLO = {
    "c": ("hello.c", '#include <stdio.h>\nint main(void) { printf("hello from c\\n"); return 0; }\n'),
    "cpp": ("hello.cpp", "#include <iostream>\n#include <optional>\n#include <string_view>\n"
                         "int main() { std::optional<std::string_view> s{\"hello from cpp\"};\n"
                         "  if (auto [a, b] = std::pair{1, 2}; a < b) std::cout << *s << '\\n'; }\n"),
    "java": ("Main.java", 'public class Main { public static void main(String[] a) {\n'
                          '  var s = "hello from java"; System.out.println(s); } }\n'),
    "javascript": ("hello.js", 'const s = `hello from ${"javascript"}`;\nconsole.log(s);\n'),
    "go": ("hello.go", 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello from go") }\n'),
    "rust": ("hello.rs", 'fn main() { let s = String::from("hello from rust"); println!("{}", s); }\n'),
}
# The JVM's reservations bounded, as under the runner's address-space limit (docs/executor.md)
JVM = ("-Xmx64m -Xss1m -XX:ReservedCodeCacheSize=32m -XX:CompressedClassSpaceSize=32m -XX:MaxMetaspaceSize=96m "
       "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData -Xshare:auto")
# How each is compiled and run, with the environment each needs on a read-only root (docs/executor.md,
# "Building the image": the compile step's environment).
BUILD = {
    "c": "gcc -O2 -o hello hello.c && ./hello",
    "cpp": "g++ -std=c++17 -O2 -o hello hello.cpp && ./hello",
    "java": f"javac {' '.join('-J' + flag for flag in JVM.split())} Main.java && java {JVM} Main",
    "javascript": "node hello.js",
    "go": "go build -o hello hello.go && ./hello",
    "rust": "rustc --edition 2021 -O -o hello hello.rs && ./hello",
}
ENV = {"HOME": "/tmp", "TMPDIR": "/tmp", "GOCACHE": "/tmp/go-cache", "GOPATH": "/tmp/go", "CGO_ENABLED": "0"}


def polyglot_image() -> str:
    try:
        found = subprocess.run(["docker", "image", "inspect", POLYGLOT_TAG], capture_output=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        missing("docker", f"no docker client or daemon: {exc}")
    if found.returncode != 0:
        if b"No such image" not in found.stderr and b"No such object" not in found.stderr:
            missing("docker", found.stderr.decode(errors="replace")[-300:])
        pytest.skip(f"{POLYGLOT_TAG} is not built (.ci/install builds it, and only warns when it cannot): "
                    "rollstream sandbox build --languages c,cpp,java,javascript,go,rust")
    return POLYGLOT_TAG


def sandboxed(image: str, script: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``script`` in a container hardened as the pool's: no network, read-only root, the sandbox's
    uid, no capabilities, a tmpfs /tmp (exec: the compiled binaries run from it)."""
    env = [arg for name, value in ENV.items() for arg in ("--env", f"{name}={value}")]
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--read-only", "--user", f"{SANDBOX_UID}:{SANDBOX_UID}",
         "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--pids-limit", "512", "--memory", "2g",
         "--tmpfs", "/tmp:rw,exec,nosuid,nodev,size=1g,mode=1777", "--workdir", "/tmp", *env, image,
         "sh", "-c", script], capture_output=True, text=True, timeout=timeout)


@pytest.mark.sandbox
def test_the_image_records_its_compilers_and_runs_them_as_the_sandbox_user():
    image = polyglot_image()
    inspected = json.loads(subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                                          check=True).stdout)[0]["Config"]
    labels = inspected["Labels"]
    assert labels[LANGUAGES_LABEL] == "python,c,cpp,java,javascript,go,rust" and labels[PYTEST_LABEL] == "1"
    assert inspected["User"] == f"{SANDBOX_UID}:{SANDBOX_UID}" and inspected["WorkingDir"] == "/work"
    done = sandboxed(image, "id -u; ls /sys/class/net; gcc --version; g++ -std=c++17 --version; javac -version; "
                            "java -version; node --version; go version; rustc --version; python3 --version")
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert out.splitlines()[:2] == [str(SANDBOX_UID), "lo"]  # the sandbox's uid; no interface but loopback
    for name in ("python", *ALL):
        assert labels[COMPILER_LABEL + name] in out, (name, labels[COMPILER_LABEL + name], out)


@pytest.mark.sandbox
@pytest.mark.parametrize("language", ALL)
def test_hello_world_compiles_and_runs_with_no_network(language: str):
    image = polyglot_image()
    name, source = HELLO[language]
    script = f"cat > {name} <<'EOF'\n{source}EOF\n{BUILD[language]}"
    done = sandboxed(image, script)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout == f"hello from {language}\n", (done.stdout, done.stderr)


PROBE = """import subprocess
def add(a, b):
    return a + b
with open("/work/hello.c", "w") as f:
    f.write('int main(void) { return 0; }\\n')
done = subprocess.run(["gcc", "-O2", "-o", "/work/hello", "/work/hello.c"], capture_output=True, text=True)
print("gcc", done.returncode, done.stderr[-300:])
"""


@pytest.mark.sandbox
async def test_the_pool_starts_it_as_it_starts_the_python_image(owner: str):
    """Today's pool, unchanged, on the polyglot image: a judged verdict as on the Python image, and a
    compiler runs inside under the pool's own limits (the runner's TMPDIR=/work)."""
    from rollstream.config import ExecutorConfig
    from rollstream.consumers.executor.pool import DockerSandboxPool
    from rollstream.consumers.executor.rewards import default_registry
    from rollstream.consumers.executor.score import evaluate
    from rollstream.schemas.events import RewardSpec

    image = polyglot_image()
    config = ExecutorConfig(image=image, owner=owner, pool_size=1, concurrency=1)
    spec = RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3", "assert add(2, 2) == 5"], timeout_s=20.0)
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        verdict = await evaluate(pool, default_registry(entry_points=[]), spec, f"```python\n{PROBE}```", "poly")
    execution = verdict.scored.execution
    assert (execution.tests_passed, execution.tests_total) == (1, 2), execution
    assert "gcc 0 " in execution.stdout_tail, execution.stdout_tail
