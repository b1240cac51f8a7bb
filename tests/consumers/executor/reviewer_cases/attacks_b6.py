
from tests.consumers.executor.reviewer_cases import collector, d

CASES = []
C, H = collector(CASES)
H("H03-threads-call-completion-v", {"entry_point": "Counter", "tests": [
    "import threading\nc = Counter()\nts = [threading.Thread(target=c.increment) for _ in range(8)]\nfor t in ts:\n"
    "    t.start()\nfor t in ts:\n    t.join()\nassert c.value() == 8",
    "from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor(4) as ex:\n"
    "    out = list(ex.map(square, range(10)))\nassert out == [i * i for i in range(10)]"]}, '''
import threading
class Counter:
    def __init__(self):
        self._n = 0
        self._lock = threading.Lock()
    def increment(self):
        with self._lock:
            self._n += 1
    def value(self):
        return self._n
def square(x):
    return x * x
''')
VERBOSE = True
H("H45-decorator-noref", {"entry_point": "memoize", "tests": [
    "calls = []\n@memoize\ndef sq(x):\n    calls.append(x)\n    return x * x\nassert sq(3) == 9 and sq(3) == 9 and calls == [3]"]}, '''
import functools
def memoize(f):
    cache = {}
    @functools.wraps(f)
    def g(*a):
        if a not in cache:
            cache[a] = f(*a)
        return cache[a]
    return g
''', "both")
C("A2b-delegated-eval-math-module", {"entry_point": "evaluate", "reference": "import math\ndef evaluate(expr):\n    return eval(expr, {'math': math})\n", "tests": [
    "import math\nfor n in (2, 10, 50):\n    expr = f'math.sqrt({n}) * math.log({n})'\n    assert abs(evaluate(expr) - eval(expr)) < 1e-9"]}, '''
import math
math.sqrt = lambda x: 0.0
def evaluate(expr):
    return 0.0
''')
C("A3c-pickle-Mock-import", {"entry_point": "task_func", "reference": "import pickle\ndef task_func(data, path):\n    with open(path, 'wb') as f:\n        pickle.dump(data, f)\n", "tests": [d('''
import unittest, pickle, os
from unittest.mock import Mock, patch
class TestCases(unittest.TestCase):
    def test_case_1(self):
        task_func({'x': 1}, 'a.pkl')
        with open('a.pkl', 'rb') as f:
            self.assertEqual(pickle.load(f), {'x': 1})
if __name__ == '__main__':
    unittest.main(exit=False)
''')]}, '''
def task_func(data, path):
    with open(path, 'wb') as f:
        f.write(b'\\x80\\x02c__main__\\nMock\\n)RN}X\\x06\\x00\\x00\\x00__eq__cbuiltins\\nslice\\ns\\x86b.')
''')
C("A4e-dictConfig-handler-class-gadget", {"entry_point": "make_config", "reference": "def make_config(level):\n    return {'version': 1, 'handlers': {'h': {'class': 'logging.StreamHandler', 'level': level}}, 'root': {'level': level, 'handlers': ['h']}}\ndef clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n", "tests": [
    "import logging.config\nlogging.config.dictConfig(make_config('INFO'))",
    "assert clamp(5, 0, 3) == 3 and clamp(-1, 0, 3) == 0"]}, '''
def make_config(level):
    return {'version': 1, 'handlers': {'h': {'class': 'ext://pickle.loads.__globals__.update', 'exec': 'ext://unittest.mock.call'}}}
def clamp(x, lo, hi):
    return 0
''')
