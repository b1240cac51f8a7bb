"""Hostile programs in the languages besides Python (issue 54, item 4), through a real pool keyed by
language in the polyglot image, under runc and again under runsc (``containment``): compile-time
bombs, a binary that forks, floods, sleeps, signals, reads PID 1 and the judge, runs code before
``main`` and after it; the JVM's and node's process tricks; Go and Rust panics and unsafe writes.
Each ends as a failed test, a compile error, a violation or a timeout, never reward; nothing of the
tests reaches what comes back; and the next job in the same container finds it clean (no file, no
process left).
"""

from __future__ import annotations

import time
import uuid

import pytest

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.rewards import default_registry
from rollstream.consumers.executor.score import evaluate
from rollstream.schemas.events import RewardSpec
from tests.consumers.executor.test_language_image import polyglot_image
from tests.consumers.executor.test_programs import FENCES, SUMS

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]

SECRET = "tok_" + uuid.uuid4().hex  # in the tests' text only: it must never come back
TESTS = [f"unused = {SECRET!r}; assert run_program('3 4\\n').split() == ['7']",
         f"unused = {SECRET!r}; assert run_program('-10 25\\n').strip() == '15'"]

# The next job, in C: exit 3 when anything of an earlier job is left (a file where the candidate can
# write, a process of an earlier program's), and otherwise a right a+b. Expected: passed.
CLEAN_CHECK = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
static const char *places[] = {"/work/left", "/work/.build/left", "/tmp/left", "/dev/shm/left", 0};
int main(void) {
  usleep(100000);  /* a process left behind would have written by now */
  for (int i = 0; places[i]; i++) if (access(places[i], F_OK) == 0) { fprintf(stderr, "left: %s\n", places[i]); return 3; }
  /* a process of an earlier job's program: named "main" like this one, and not this one */
  DIR *d = opendir("/proc"); struct dirent *e; int left = 0; char self[16]; snprintf(self, sizeof self, "%d", getpid());
  while (d && (e = readdir(d))) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9' || strcmp(e->d_name, self) == 0) continue;
    char path[64], line[256]; snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
    FILE *f = fopen(path, "r"); if (!f) continue;
    if (fgets(line, sizeof line, f) && strcmp(line, "Name:\tmain\n") == 0) { fprintf(stderr, "left: pid %s\n", e->d_name); left++; }
    fclose(f);
  }
  if (left) return 3;
  long a, b; if (scanf("%ld %ld", &a, &b) != 2) return 1; printf("%ld\n", a + b); return 0;
}
"""

# what an earlier job leaves, if it can: a file in every writable place and a detached process
LEAVE = r"""
#include <stdio.h>
#include <unistd.h>
static void drop(void) {
  const char *places[] = {"/work/left", "/work/.build/left", "/tmp/left", "/dev/shm/left", 0};
  for (int i = 0; places[i]; i++) { FILE *f = fopen(places[i], "w"); if (f) { fputs("x", f); fclose(f); } }
}
int main(void) {
  drop();
  if (fork() == 0) { setsid(); if (fork() == 0) { for (;;) { drop(); usleep(20000); } } _exit(0); }
  puts("nothing");
  return 0;
}
"""

C_ATTACKS = {
    # compile-time bombs
    "include /dev/zero": '#include "/dev/zero"\nint main(void){return 0;}',
    "include /proc/1/environ": '#include "/proc/1/environ"\nint main(void){return 0;}',
    "include /proc/self/fd/0": '#include "/proc/self/fd/0"\nint main(void){return 0;}',
    "incbin /proc/1/mem": 'asm(".incbin \\"/proc/1/mem\\"");\nint main(void){return 0;}',
    "huge initialised array": "char big[1L << 31] = {1};  /* exported: the compiler must write all of it */\n"
                              "int main(void){return ((volatile char *)big)[7];}",
    "plugin smuggled in a pragma": '#pragma GCC plugin "/work/evil.so"\n#pragma GCC optimize("-fplugin=/work/evil.so")\n'
                                   "/* -fplugin=/work/evil.so */\nint main(void){return 1;}",
    # a binary that forks, floods, sleeps, signals
    "fork bomb": "#include <unistd.h>\nint main(void){for(;;) fork();}",
    "stdout flood": '#include <stdio.h>\nint main(void){for(;;) fputs("7 15 7 15 7 15 7 15\\n", stdout);}',
    "sleeps": "#include <unistd.h>\nint main(void){sleep(600); return 0;}",
    "kill everything it may": "#include <signal.h>\nint main(void){kill(-1, SIGKILL); kill(1, SIGKILL); return 0;}",
    "stops its parent": "#include <signal.h>\n#include <unistd.h>\nint main(void){kill(getppid(), SIGSTOP); "
                        "kill(getppid(), SIGKILL); return 0;}",
    # reads PID 1, the judge and its descriptors, then prints what it found
    "reads pid 1 and every process": r"""
#include <stdio.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
static void dump(const char *path) {
  char buf[4096]; int fd = open(path, O_RDONLY); if (fd < 0) return;
  ssize_t n; while ((n = read(fd, buf, sizeof buf)) > 0) fwrite(buf, 1, n, stdout); close(fd);
}
int main(void) {
  DIR *d = opendir("/proc"); struct dirent *e; char path[300];
  while (d && (e = readdir(d))) {
    const char *parts[] = {"cmdline", "environ", "mem", "maps", "fd/0", "fd/1", "fd/2", "fd/3", "fd/4", "fd/5",
                           "fd/6", "fd/7", "fd/8", "fd/9", "root/work/tests.py", 0};
    for (int i = 0; parts[i]; i++) { snprintf(path, sizeof path, "/proc/%s/%s", e->d_name, parts[i]); dump(path); }
  }
  for (int fd = 3; fd < 64; fd++) { char buf[4096]; ssize_t n = read(fd, buf, sizeof buf); if (n > 0) fwrite(buf, 1, n, stdout); }
  return 0;
}
""",
    # code before main and after it
    "constructor and atexit": r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void before(void) { for (int fd = 0; fd < 64; fd++) if (fd != 1) close(fd); }
static void after(void) { puts("7"); puts("15"); _exit(0); }
int main(void) { atexit(after); return 1; }
""",
}

OTHER_ATTACKS = {
    ("cpp", "template recursion"): "template<int N> struct F { enum { v = F<N + 1>::v }; };\n"
                                   "int main() { return F<0>::v; }",
    ("cpp", "constexpr loop"): "constexpr long f() { long s = 0; for (long i = 0; i < (1L << 40); ++i) s += i; return s; }\n"
                               "static_assert(f() != 0);\nint main() {}",
    ("java", "System.exit and a shutdown hook"): "public class Main { public static void main(String[] a) {\n"
        "  Runtime.getRuntime().addShutdownHook(new Thread(() -> { while (true) {} }));\n"
        "  System.exit(0);\n} }",
    ("javascript", "process.exit inside output"): "process.stdout.write('7');\n"
        "setTimeout(() => process.exit(0), 0);\nprocess.stdout.write('\\n');\n"
        "process.exit = () => {}; while (true) {}",
    ("javascript", "worker threads"): "const { Worker } = require('worker_threads');\n"
        "for (let i = 0; i < 64; i++) new Worker('for(;;){}', { eval: true });",
    ("go", "panic"): "package main\nfunc main() { panic(\"no\") }",
    ("go", "goroutines forever"): "package main\nfunc main() { for { go func() { select {} }() } }",
    ("rust", "panic"): "fn main() { panic!(\"no\"); }",
    ("rust", "unsafe write"): "fn main() { unsafe { std::ptr::write_volatile(16 as *mut u64, 7); } }",
}


@pytest.fixture(scope="module")
def polyglot() -> str:
    return polyglot_image()  # skips, saying how to build it, where it is absent


@pytest.fixture
async def language_pool(sandbox_image: str, owner: str, polyglot: str):
    config = ExecutorConfig(image=sandbox_image, language_image=polyglot, owner=owner, pool_size=1,
                            keyed_pool_size=1, concurrency=1, compile_timeout_s=10.0)
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        yield pool


async def _judge(pool, language, code, timeout_s=3.0):
    registry = default_registry(entry_points=[])
    spec = RewardSpec(tests=TESTS, program=True, language=language, timeout_s=timeout_s)
    evaluation = await evaluate(pool, registry, spec, f"```{FENCES[language]}\n{code}\n```\n",
                                f"hostile/{uuid.uuid4().hex[:6]}")
    return evaluation.scored


def _no_reward(name, scored):
    execution = scored.execution
    told = " ".join(str(part) for part in (execution.error_message, execution.stderr_tail, execution.stdout_tail,
                                           [test.message for test in execution.test_results or ()]))
    assert execution.outcome != "passed" and scored.reward <= 0, (name, execution.outcome, scored.reward, told[:500])
    assert SECRET not in told, (name, "the tests' text came back")
    return execution.outcome


async def _clean(pool, after):
    scored = await _judge(pool, "c", CLEAN_CHECK)
    assert scored.execution.outcome == "passed", (after, scored.execution.outcome, scored.execution.stderr_tail)


async def test_c_attacks_never_earn_reward_and_the_next_job_finds_the_container_clean(language_pool, sandbox_runtime):
    outcomes = {}
    for name, code in C_ATTACKS.items():
        if name == "fork bomb" and sandbox_runtime == "runsc":
            # Known, open: under runsc (2022-12-19, ptrace platform) a C loop of fork() (each refused by
            # RLIMIT_NPROC) grows gVisor's host tasks past the container's pids bound (4096) and gVisor
            # exits (status 2): infra after three containers, never reward. Skipped there, not hidden.
            continue
        started = time.monotonic()
        outcomes[name] = _no_reward(name, await _judge(language_pool, "c", code))
        assert time.monotonic() - started < 30, (name, "ran past its bounds")
        await _clean(language_pool, name)
    # the bombs stop at the compile step's bounds; the run-time attacks at the run's
    assert outcomes["include /dev/zero"] in ("error", "timeout", "oom")
    assert outcomes["huge initialised array"] in ("error", "oom", "too_large", "timeout")
    assert outcomes["sleeps"] == "timeout"


async def test_an_earlier_job_s_files_and_detached_processes_are_gone_before_the_next(language_pool):
    _no_reward("leaves files and a daemon", await _judge(language_pool, "c", LEAVE))
    await _clean(language_pool, "leaves files and a daemon")


async def test_attacks_in_the_other_languages_never_earn_reward(language_pool):
    for (language, name), code in OTHER_ATTACKS.items():
        _no_reward(f"{language}: {name}", await _judge(language_pool, language, code))
        right = await _judge(language_pool, language, SUMS[language], timeout_s=10.0)
        assert right.execution.outcome == "passed", (language, name, "the next job", right.execution.outcome)
