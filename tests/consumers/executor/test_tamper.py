"""Attacks on the verdict, through the real Docker sandbox.

Each attack is a completion whose function is wrong (it returns None or nonsense) plus an
exploit. Under the judge (the default ``trust = "judge"``) every one scores below the task's
full reward, with the verdict kind named here. The exploits that fooled the old in-process
harness are also run with ``trust = "in_process"``, where they still score a full 1.0: that is
what makes them real attacks, and what the judge stops.
"""

from __future__ import annotations

import uuid

import msgspec
import pytest

from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.rewards import RewardRegistry
from rollstream.consumers.executor.score import Evaluation, evaluate
from rollstream.schemas.events import RewardSpec

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]  # containment: again under runsc in CI

ADD = RewardSpec(
    entry_point="add",
    tests=["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"],
    timeout_s=5.0,
)
WRONG = "def add(a, b):\n    return None\n"
FRAME = (  # one framed message on the candidate's reply pipe (fd 4), as the honest code sends it
    "import json, os\n"
    "def frame(obj):\n"
    "    data = json.dumps(obj).encode()\n"
    "    return len(data).to_bytes(4, 'big') + data\n"
)

# (id, code, verdict under the judge, tamper kind, spec, fools the in-process harness)
ATTACKS = [
    ("builtin-exec",
     "import builtins\nbuiltins.exec = lambda *a, **k: None\n" + WRONG, "none", "", ADD, True),
    ("frame-globals-shadow",
     "import sys\nf = sys._getframe()\nwhile f is not None:\n"
     "    if 'harness' in f.f_globals:\n        f.f_globals['exec'] = lambda *a, **k: None\n"
     "    f = f.f_back\n" + WRONG, "none", "", ADD, True),
    ("frame-reporter",
     "import os, sys\nf = sys._getframe()\nwhile f is not None:\n"
     "    report = f.f_locals.get('report')\n"
     "    if callable(report):\n"
     "        for i in range(3):\n            report({'e': 'test', 'i': i, 'ok': True})\n"
     "        report({'e': 'done'})\n        os._exit(0)\n"
     "    f = f.f_back\n" + WRONG, "none", "", ADD, True),
    ("gc-reporter",
     "import gc, os\nfor obj in gc.get_objects():\n"
     "    if callable(obj) and getattr(obj, '__name__', '') == 'report':\n"
     "        try:\n"
     "            for i in range(3):\n                obj({'e': 'test', 'i': i, 'ok': True})\n"
     "            obj({'e': 'done'})\n"
     "        except Exception:\n            continue\n"
     "        os._exit(0)\n" + WRONG, "none", "", ADD, True),
    ("always-equal",
     "class Eq:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
     "def add(a, b):\n    return Eq()\n", "none", "", ADD, True),
    ("int-subclass-eq",
     "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
     "def add(a, b):\n    return I(0)\n", "none", "", ADD, True),
    ("class-property-disguise",
     "class Fake:\n    @property\n    def __class__(self):\n        return int\n"
     "    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
     "def add(a, b):\n    return Fake()\n", "none", "", ADD, True),
    ("descriptor-eq",
     "class Yes:\n    def __get__(self, obj, owner=None):\n        return lambda other: True\n"
     "class Liar:\n    __eq__ = Yes()\n    __hash__ = object.__hash__\n"
     "def add(a, b):\n    return Liar()\n", "none", "", ADD, True),
    ("shadow-setup-helper",  # HumanEval-style: the check trusts a helper the task defines
     "def expected(a, b):\n    return None\n" + WRONG, "none", "",
     RewardSpec(entry_point="add", setup="def expected(a, b):\n    return a + b\n",
                tests=["assert add(1, 2) == expected(1, 2)", "assert add(5, 5) == expected(5, 5)"]), True),
    ("shadow-builtins-the-tests-use",
     "len = lambda x: 2\nsorted = lambda x: [(1, 2)]\ndef pairs(items):\n    return None\n", "none", "",
     RewardSpec(entry_point="pairs", tests=["assert len(pairs([1, 2, 3, 4])) == 2",
                                            "assert sorted(pairs([2, 1])) == [(1, 2)]"]), True),
    ("search-own-memory",  # the expected value, wherever the tests' process keeps it
     "import re\n"
     "def secret():\n"
     "    pattern = re.compile(b'UNIQ' + b'MARK-[0-9a-f]{16}')\n"
     "    found = []\n"
     "    with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:\n"
     "        for line in maps:\n"
     "            span, perms = line.split()[:2]\n"
     "            start, end = (int(x, 16) for x in span.split('-'))\n"
     "            if 'r' not in perms or end - start > 1 << 28:\n"
     "                continue\n"
     "            try:\n"
     "                mem.seek(start)\n"
     "                found += pattern.findall(mem.read(end - start))\n"
     "            except (OSError, ValueError, OverflowError):\n"
     "                pass\n"
     "    return found[0].decode() if found else None\n",
     "none", "", RewardSpec(entry_point="secret", tests=["assert secret() == 'UNIQ' 'MARK-3f9a0c1d5e7b2a46'"]), True),
    ("ctypes-write-judge-memory",
     "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "buf = ctypes.create_string_buffer(b'x' * 64)\n"
     "class IoVec(ctypes.Structure):\n    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
     "local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 64)\n"
     "for address in range(0x400000, 0x400000 + 64 * 4096, 4096):\n"
     "    remote = IoVec(address, 64)\n"
     "    libc.process_vm_writev(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)\n"
     "try:\n    open('/proc/1/mem', 'r+b').write(b'x')\nexcept OSError:\n    pass\n" + WRONG,
     "none", "", ADD, False),
    ("signal-the-judge",
     "import os, signal\n"
     "for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):\n"
     "    try:\n        os.kill(1, sig)\n    except OSError:\n        pass\n" + WRONG, "none", "", ADD, False),
    ("exit-mid-test-with-forged-output",
     "import os, sys\n"
     "def add(a, b):\n"
     "    print('{\"e\": \"test\", \"i\": 0, \"ok\": true}\\n{\"e\": \"done\"}\\nPASSED 3/3')\n"
     "    sys.stdout.flush()\n    os._exit(0)\n", "runtime", "", ADD, False),
    ("exit-where-an-exception-is-expected",
     "import os\ndef add(a, b):\n    os._exit(0)\n", "runtime", "",
     RewardSpec(entry_point="add", tests=["with raises(Exception):\n    add(None, 1)",
                                          "try:\n    add(None, 1)\nexcept BaseException:\n    pass"]), False),
    ("recursion-limit",
     "import sys\nsys.setrecursionlimit(40)\n"
     "def add(a, b):\n    x = []\n    for _ in range(200):\n        x = [x]\n    return x\n", "none", "", ADD, False),
    ("huge-return-value",
     "def add(a, b):\n    return 'x' * (48 << 20)\n", "none", "", ADD, False),
    ("cyclic-return-value",
     "def add(a, b):\n    x = []\n    x.append(x)\n    return x\n", "none", "", ADD, False),
    ("generator-return-value",
     "def add(a, b):\n    yield a + b\n", "none", "", ADD, False),
    ("forged-reply-before-asked",
     FRAME + "for seq in range(1, 4):\n    os.write(4, frame([seq, 'ok', seq + 2, '', []]))\n" + WRONG,
     "tamper", "protocol", ADD, False),
    ("non-data-object-on-the-wire",  # its own serving code patched to answer with an object
     "import json, sys\n"
     "sys.modules['__main__'].dumps = lambda message: json.dumps(\n"
     "    ['a', message[1], 'ok', [{'object': 'AlwaysEqual'}], [], [], None, '', '', None]).encode()\n" + WRONG,
     "tamper", "protocol", ADD, False),
    ("names-it-was-not-asked-for",
     FRAME + "os.write(4, frame(['ready', 'ok', [['add', 'v', 3], ['exec', 'v', None]]]))\n"
     "import time\ntime.sleep(2)\n" + WRONG, "tamper", "protocol", ADD, False),
    ("execve-a-forged-responder",
     FRAME.replace("import json, os\n", "") +
     "import json, os, sys\n"
     "responder = '''\n"
     "import json, os\n"
     "def frame(obj):\n"
     "    data = json.dumps(obj).encode()\n"
     "    return len(data).to_bytes(4, 'big') + data\n"
     "os.write(4, frame(['ready', 'ok', [['add', 'v', {'h': 0}]]]))\n"
     "while True:\n"
     "    head = os.read(3, 4)\n"
     "    if not head:\n"
     "        break\n"
     "    request = json.loads(os.read(3, int.from_bytes(head, 'big')))\n"
     "    os.write(4, frame([request[1], 'ok', True, '', []]))\n"
     "'''\n"
     "os.execv(sys.executable, [sys.executable, '-c', responder])\n", "tamper", "protocol", ADD, False),
    ("kill-the-zygote",
     "import os\nos.kill(os.getppid(), 9)\n" + WRONG, "violation", "", ADD, False),
]


async def score(pool: DockerSandboxPool, registry: RewardRegistry, code: str, spec: RewardSpec) -> Evaluation:
    return await evaluate(pool, registry, spec, f"```python\n{code}```", f"tamper/{uuid.uuid4().hex[:6]}")


@pytest.mark.parametrize(
    "code, verdict, tamper, spec", [a[1:5] for a in ATTACKS], ids=[a[0] for a in ATTACKS]
)
async def test_the_judge_is_not_fooled(pool, registry, code, verdict, tamper, spec, sandbox_runtime):
    evaluation = await score(pool, registry, code, spec)
    record = evaluation.scored.execution
    assert evaluation.scored.reward < 1.0, record
    if sandbox_runtime == "runsc" and "os.kill(os.getppid(), 9)\n" in code:
        verdict = "runtime"  # the zygote is another uid's there: the kill raises PermissionError
    if sandbox_runtime == "runsc" and "(48 << 20)" in code and record.error_kind == "timeout":
        verdict = "timeout"  # 48 MiB through gVisor's pipes may outlast the 5 s bound on a loaded machine (CI, stop 61)
    assert (record.error_kind, record.tamper, record.trust) == (verdict, tamper, "judge"), record
    assert record.tests_passed < record.tests_total
    if verdict == "tamper":
        assert evaluation.scored.reward == spec.crash_reward


@pytest.mark.parametrize(
    "code, spec", [(a[1], a[4]) for a in ATTACKS if a[5]], ids=[a[0] for a in ATTACKS if a[5]]
)
async def test_the_same_attack_fools_an_in_process_harness(pool, registry, code, spec):
    """The control: with the tests in the completion's own process the exploit works."""
    evaluation = await score(pool, registry, code, msgspec.structs.replace(spec, trust="in_process"))
    assert evaluation.scored.reward == 1.0, evaluation.scored.execution
    assert evaluation.scored.execution.trust == "in_process"


async def test_no_expected_value_reaches_a_later_candidate(pool, registry):
    """The memory search, again and again in the same container, after in-process and judged
    runs of the same task: no earlier job leaves its expected values where a candidate looks."""
    _, code, _, _, spec, _ = next(a for a in ATTACKS if a[0] == "search-own-memory")
    sandboxes = set()
    for trust in ("in_process", "judge", "in_process", "judge", "judge"):
        evaluation = await score(pool, registry, code, msgspec.structs.replace(spec, trust=trust))
        sandboxes.add(evaluation.result.sandbox_id)
        assert evaluation.scored.reward == (1.0 if trust == "in_process" else 0.0)
    assert len(sandboxes) == 1  # one container served them all


async def test_an_honest_solution_still_passes_after_every_attack(pool, registry):
    for _, code, _, _, spec, _ in ATTACKS:
        await score(pool, registry, code, spec)
    honest = await score(pool, registry, "def add(a, b):\n    return a + b\n", ADD)
    assert honest.scored.reward == 1.0, honest.scored.execution
