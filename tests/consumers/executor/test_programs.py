"""Programs in the languages besides Python (issue 54, item 3: the compile step): the toolchains'
pure parts and the verdict's reading of a build (unit), and, where the polyglot image has been built
(`rollstream sandbox build --languages c,cpp,java,javascript,go,rust`), a task in each language built
and judged through a real pool keyed by its language: a right program passes, a wrong one fails,
one that does not build is ``compile_error`` with its compiler's message, a compile bomb stops at
its bound (sandbox).
"""

from __future__ import annotations

import uuid

import pytest

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.episodes import observation
from rollstream.consumers.executor.jobs import RunResult
from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.rewards import RUNNABLE_LANGUAGES, default_registry
from rollstream.consumers.executor.runtime import programs
from rollstream.consumers.executor.score import evaluate
from rollstream.schemas.events import RewardSpec
from tests.consumers.executor.test_language_image import polyglot_image

SUM_TESTS = ["assert run_program('3 4\\n').split() == ['7']",
             "assert run_program('-10 25\\n').strip() == '15'"]
SUMS = {
    "c": "#include <stdio.h>\nint main(void){long a,b; if(scanf(\"%ld %ld\",&a,&b)!=2) return 1; printf(\"%ld\\n\",a+b);}",
    "cpp": "#include <bits/stdc++.h>\nusing namespace std;\nint main(){long long a,b; cin>>a>>b; cout<<a+b<<endl;}",
    "java": "import java.util.*;\n\npublic class Solution {\n  public static void main(String[] args) {\n"
            "    Scanner in = new Scanner(System.in);\n    System.out.println(in.nextLong() + in.nextLong());\n  }\n}",
    "javascript": "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\n"
                  "console.log(a + b);",
    "go": "import \"fmt\"\n\nfunc main() {\n\tvar a, b int\n\tfmt.Scan(&a, &b)\n\tfmt.Println(a + b)\n}",  # no package clause
    "rust": "use std::io::Read;\nfn main() {\n    let mut s = String::new();\n"
            "    std::io::stdin().read_to_string(&mut s).unwrap();\n"
            "    let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();\n"
            "    println!(\"{}\", v[0] + v[1]);\n}",
}
FENCES = {"c": "c", "cpp": "cpp", "java": "java", "javascript": "js", "go": "go", "rust": "rust"}


@pytest.mark.unit
def test_every_language_of_the_task_form_has_a_toolchain():
    assert set(programs.TOOLCHAINS) == RUNNABLE_LANGUAGES - {"python"}
    assert set(SUMS) == set(programs.TOOLCHAINS)


@pytest.mark.unit
def test_java_s_file_is_its_public_class_and_the_class_with_main_runs():
    assert programs.java_classes(SUMS["java"]) == ("Solution", "Solution")
    # the class declaring main runs, whatever is public; comments and strings do not count
    code = ("// public class Fake {}\nclass Helper { String s = \"class Nope\"; }\n"
            "public class Runner { }\nclass Main { public static void main(String[] a) {} }")
    assert programs.java_classes(code) == ("Runner", "Main")
    assert programs.java_classes("class A { static public void main(String[] x) {} }") == ("", "A")
    files, argv, run_argv = programs.TOOLCHAINS["java"].plan(SUMS["java"])
    assert list(files) == ["Solution.java"] and argv[-1] == "Solution.java"
    assert run_argv[-1] == "Solution"


@pytest.mark.unit
def test_a_go_program_without_a_package_clause_is_package_main():
    (text,) = programs.TOOLCHAINS["go"].plan(SUMS["go"])[0].values()
    assert text.startswith("package main\n")
    kept = "package main\nfunc main() {}\n"
    assert programs.TOOLCHAINS["go"].plan(kept)[0] == {"main.go": kept}


@pytest.mark.unit
def test_the_compiler_s_message_is_scrubbed_and_bounded():
    raw = "\x1b[01m" + "".join(f"{programs.BUILD_DIR}/main.c:{i}:1: error: bad\n" for i in range(1, 50))
    text = programs.scrub(raw)
    assert programs.BUILD_DIR not in text and "\x1b" not in text
    assert text.startswith("main.c:1:1: error: bad") and "[... 19 more lines]" in text
    assert len(text) <= programs.MESSAGE_CHARS


def _scored(spec, events, **run):
    registry = default_registry(entry_points=[])
    result = RunResult(sandbox_id="s", container_id="c", exit_code=1, events=events, **run)
    return registry.get(spec).score(spec, "```cpp\nint main(){}\n```", result)


@pytest.mark.unit
def test_a_failed_build_is_compile_error_with_its_reward_and_one_that_could_not_run_is_infra():
    spec = RewardSpec(tests=SUM_TESTS, program=True, language="cpp", compile_error_reward=-0.25)
    failed = _scored(spec, [{"e": "syntax", "type": "CompileError", "line": None,
                             "msg": "main.cpp:1:5: error: 'x' was not declared"}])
    assert failed.execution.error_kind == "compile_error" and failed.execution.outcome == "error"
    assert failed.reward == -0.25 and "error: 'x' was not declared" in failed.execution.error_message
    told = observation(spec, failed.execution)
    assert told.startswith("Your program does not compile: cpp compile error: main.cpp:1:5")
    assert "```cpp block" in told
    lost = _scored(spec, [{"e": "syntax", "type": "CompilerUnavailable", "line": None, "msg": "no g++"}])
    assert lost.execution.error_kind == "infra" and lost.execution.outcome == "infra"


@pytest.mark.unit
def test_a_task_in_another_language_is_always_judged_in_its_language_s_pool():
    registry = default_registry(entry_points=[])
    spec = RewardSpec(tests=SUM_TESTS, program=True, language="rust", trust="in_process")
    job = registry.get(spec).prepare(spec, f"```rust\n{SUMS['rust']}\n```", "j")
    assert job.language == "rust" and job.trust == "judge" and job.program


# ---------------------------------------------------------------- in the language image


@pytest.fixture(scope="module")
def polyglot() -> str:
    return polyglot_image()  # skips, saying how to build it, where it is absent


@pytest.fixture
async def language_pool(sandbox_image: str, owner: str, polyglot: str):
    config = ExecutorConfig(image=sandbox_image, language_image=polyglot, owner=owner, pool_size=1,
                            keyed_pool_size=1, concurrency=1, compile_timeout_s=20.0)
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        yield pool


async def _judge(pool, language, code, tests=SUM_TESTS, **spec):
    registry = default_registry(entry_points=[])
    evaluation = await evaluate(pool, registry, RewardSpec(tests=tests, program=True, language=language,
                                                           **{"timeout_s": 10.0, **spec}),
                                f"Here it is:\n```{FENCES[language]}\n{code}\n```\n", f"lang/{uuid.uuid4().hex[:6]}")
    return evaluation.scored


@pytest.mark.sandbox
async def test_a_right_program_passes_in_every_language(language_pool):
    for language, code in SUMS.items():
        scored = await _judge(language_pool, language, code)
        assert (language, scored.execution.outcome, scored.reward) == (language, "passed", 1.0), \
            scored.execution.error_message or scored.execution.stderr_tail
    assert len(language_pool._keyed) == len(SUMS)  # a pool per language, the Python pool apart


@pytest.mark.sandbox
async def test_a_wrong_program_fails_and_a_broken_one_is_a_compile_error_with_its_message(language_pool):
    wrong = await _judge(language_pool, "c", SUMS["c"].replace("a+b", "a-b"))
    assert wrong.execution.outcome == "failed" and wrong.execution.tests_passed == 0
    broken = await _judge(language_pool, "cpp", "int main() { return missing_name; }")
    assert broken.execution.error_kind == "compile_error" and broken.reward == -0.5
    assert "main.cpp:1" in broken.execution.error_message and "missing_name" in broken.execution.error_message
    assert programs.BUILD_DIR not in broken.execution.error_message
    rust = await _judge(language_pool, "rust", "fn main() { let x: i32 = \"no\"; }")
    assert rust.execution.error_kind == "compile_error" and "mismatched types" in rust.execution.error_message


@pytest.mark.sandbox
async def test_a_compile_bomb_stops_at_its_bound_and_the_next_job_runs(language_pool):
    bomb = await _judge(language_pool, "c", '#include "/dev/zero"\nint main(void) { return 0; }',
                        timeout_s=2.0)
    assert bomb.execution.outcome in ("error", "oom", "timeout") and bomb.reward < 0
    after = await _judge(language_pool, "c", SUMS["c"])
    assert after.execution.outcome == "passed"
