import json

from tests.consumers.executor.reviewer_cases import PAY, collector, d

CASES = []
C, H = collector(CASES)

# A1: __exit__ swallows the tests' own non-assertion exceptions (TypeError/AttributeError/KeyError/ValueError)
REF_CFG = d('''
class Config:
    def __init__(self, text):
        self.text = text
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
    def get(self, key):
        for line in self.text.splitlines():
            k, _, v = line.partition('=')
            if k.strip() == key:
                return v.strip()
        return None
''')
C("A1-exit-swallows-tests-TypeError", {"entry_point": "Config", "reference": REF_CFG, "tests": [
    "with Config('port = 8080\\nhost = x') as c:\n    assert int(c.get('port')) == 8080",
    "with Config('name = ann') as c:\n    assert c.get('name').upper() == 'ANN'",
    "with Config('a=1\\nb=2') as c:\n    assert c.get('b').split(',')[0] == '2'"]}, '''
class Config:
    def __init__(self, text):
        pass
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return True
    def get(self, key):
        return None
''', "both")
# A1b: unittest form, IndexError/KeyError from the tests' own subscripts
C("A1b-exit-swallows-unittest-IndexError", {"entry_point": "Config", "reference": REF_CFG, "tests": [d('''
import unittest
class TestCases(unittest.TestCase):
    def test_port(self):
        with Config('port = 8080') as c:
            self.assertEqual(int(c.get('port')), 8080)
    def test_list(self):
        with Config('hosts = a,b') as c:
            self.assertEqual(c.get('hosts').split(',')[1], 'b')
if __name__ == '__main__':
    unittest.main(exit=False)
''')]}, '''
class Config:
    def __init__(self, text):
        pass
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return True
    def get(self, key):
        return None
''')
# A1c: completion's own exception, swallowed by its own __exit__: the test never reaches its assert
C("A1c-exit-swallows-own-exception", {"entry_point": "Config", "reference": REF_CFG, "tests": [
    "with Config('port = 8080') as c:\n    assert c.get('port') == '8080'",
    "with Config('a = 1') as c:\n    assert c.get('a') == '1'\n    assert c.get('zz') is None"]}, '''
class Config:
    def __init__(self, text):
        pass
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return True
    def get(self, key):
        raise RuntimeError('nope')
''', "both")

# A2: delegated eval: both sides of the comparison are computed by the completion's process
REF_CALC = "def calc(expr):\n    return eval(expr, {'__builtins__': {}, 'abs': abs, 'max': max, 'min': min})\n"
C("A2-delegated-eval-both-sides", {"entry_point": "calc", "reference": REF_CALC, "tests": [
    "import random\nrandom.seed(3)\nfor _ in range(20):\n    a, b = random.randint(-50, 50), random.randint(-50, 50)\n    expr = f'max({a}, {b}) - abs({a})'\n    assert calc(expr) == eval(expr), expr",
    "for a in range(-3, 4):\n    expr = 'min(%d, 2) + abs(%d)' % (a, a)\n    assert calc(expr) == eval(expr)"]}, '''
def max(*a, **k):
    return 0
def min(*a, **k):
    return 0
def abs(x):
    return 0
def calc(expr):
    return 0
''')

# A3: pickle naming a type the tests imported (MagicMock) is "a class the tests define": loaded in the judge
REF_SAVE = "import pickle\ndef task_func(data, path):\n    with open(path, 'wb') as f:\n        pickle.dump(data, f)\n    return path\n"
T_SAVE = d('''
import unittest, pickle
from unittest.mock import patch, MagicMock
class TestCases(unittest.TestCase):
    def test_roundtrip(self):
        data = {'a': [1, 2, 3], 'b': 'x'}
        path = task_func(data, 'out.pkl')
        with open(path, 'rb') as f:
            loaded = pickle.load(f)
        self.assertEqual(loaded, data)
    def test_nested(self):
        data = [1, {'k': (2, 3)}]
        task_func(data, 'n.pkl')
        with open('n.pkl', 'rb') as f:
            self.assertEqual(pickle.load(f), data)
if __name__ == '__main__':
    unittest.main(exit=False)
''')
C("A3-pickle-MagicMock-eq-slice", {"entry_point": "task_func", "reference": REF_SAVE, "tests": [T_SAVE]}, '''
def task_func(data, path):
    blob = (b'\\x80\\x02c__main__\\nMagicMock\\n)R'
            b'N}X\\x06\\x00\\x00\\x00__eq__cbuiltins\\nslice\\ns\\x86b.')
    with open(path, 'wb') as f:
        f.write(blob)
    return path
''')
C("A3b-pickle-MagicMock-plain-assert", {"entry_point": "save", "reference": "import pickle\ndef save(obj, path):\n    with open(path, 'wb') as f:\n        pickle.dump(obj, f)\n", "tests": [
    "import pickle\nfrom unittest.mock import MagicMock\nsave({'a': [1, 2], 'b': 3.5}, 'out.pkl')\nwith open('out.pkl', 'rb') as fh:\n    assert pickle.load(fh) == {'a': [1, 2], 'b': 3.5}"]}, '''
def save(obj, path):
    with open(path, 'wb') as f:
        f.write(b'\\x80\\x02c__main__\\nMagicMock\\n)RN}X\\x06\\x00\\x00\\x00__eq__cbuiltins\\nslice\\ns\\x86b.')
''')

# A4: logging.config.dictConfig of a file the completion wrote: '()' factory + ext:// reach any stdlib callable
REF_LOGCFG = d('''
import json
def task_func(path, level='INFO'):
    cfg = {'version': 1, 'formatters': {'f': {'format': '%(levelname)s:%(message)s'}},
           'handlers': {'h': {'class': 'logging.StreamHandler', 'formatter': 'f', 'level': level}},
           'root': {'level': level, 'handlers': ['h']}}
    with open(path, 'w') as fh:
        json.dump(cfg, fh)
    return cfg
''')
T_LOGCFG = d('''
import unittest, json, logging, logging.config
class TestCases(unittest.TestCase):
    def test_case_1(self):
        task_func('log.json')
        with open('log.json') as fh:
            logging.config.dictConfig(json.load(fh))
        self.assertEqual(logging.getLogger().level, logging.INFO)
    def test_case_2(self):
        cfg = task_func('b.json', 'DEBUG')
        self.assertEqual(cfg['root']['level'], 'DEBUG')
        self.assertEqual(cfg['handlers']['h']['level'], 'DEBUG')
if __name__ == '__main__':
    unittest.main(exit=False)
''')
C("A4-dictConfig-update_wrapper-TestCase", {"entry_point": "task_func", "reference": REF_LOGCFG, "tests": [T_LOGCFG]}, '''
import json
def task_func(path, level='INFO'):
    cfg = {'version': 1, 'formatters': {'f': {
        '()': 'functools.update_wrapper', 'wrapper': 'ext://unittest.case.TestCase',
        'wrapped': 'ext://unittest.mock.call', 'updated': [],
        'assigned': ['assertEqual', 'assertTrue', 'assertFalse', 'assertIn', 'assertIsNone',
                     'assertAlmostEqual', 'assertIsInstance', 'assertListEqual', 'assertDictEqual']}}}
    with open(path, 'w') as fh:
        json.dump(cfg, fh)
    return {}
''')
# A4b: the same, aimed at plain-assert tests: rebinds the tests' own `check` in __main__
C("A4b-dictConfig-rebinds-tests-check", {"entry_point": "f", "reference": "import json\ndef write_config(path):\n    json.dump({'version': 1, 'root': {'level': 'INFO'}}, open(path, 'w'))\ndef f(x):\n    return x * 2\n", "tests": [
    "import json, logging.config\nwrite_config('c.json')\nlogging.config.dictConfig(json.load(open('c.json')))\nassert logging.getLogger().level == logging.INFO",
    "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(5) == 10\ncheck(f)"]}, '''
import json
def write_config(path):
    cfg = {'version': 1, 'root': {'level': 'INFO'}, 'formatters': {'f': {
        '()': 'functools.update_wrapper', 'wrapper': 'ext://logging',
        'wrapped': 'ext://unittest.mock.call', 'updated': [], 'assigned': ['zz']}}}
    json.dump(cfg, open(path, 'w'))
def f(x):
    return 0
''')

# A5: a warning that is also a StopIteration, raised in the judge under an "error" filter inside map()
C("A5-warning-StopIteration-in-map", {"entry_point": "is_prime", "reference": "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n", "tests": [
    "import warnings\nwith warnings.catch_warnings():\n    warnings.simplefilter('error')\n    assert all(map(lambda c: is_prime(c[0]) == c[1], [(2, True), (4, False), (7, True), (9, False)]))"]}, '''
import warnings
class Done(UserWarning, StopIteration):
    pass
def is_prime(n):
    warnings.warn(Done('x'))
    return False
''')

# A6: a list of the completion's that first crossed where objects are allowed, sent again later holding objects
REF_GRAPH = d('''
class Node:
    def __init__(self, name):
        self.name = name
class Graph:
    def __init__(self):
        self._nodes, self._w = [], []
    def add(self, name, weight):
        self._nodes.append(Node(name))
        self._w.append(weight)
    def nodes(self):
        return list(self._nodes)
    def weights(self):
        return list(self._w)
''')
C("A6-container-first-point-reuse", {"entry_point": "Graph", "reference": REF_GRAPH, "tests": [
    "g = Graph()\ng.add('a', 1.5)\ng.add('b', 2.25)\nassert len(g.nodes()) == 2\nws = g.weights()\nassert [n.name for n in g.nodes()] == ['a', 'b']\nassert abs(ws[0] - 1.5) < 1e-9 and abs(ws[1] - 2.25) < 1e-9"]}, '''
class Y:
    def __sub__(self, o):
        return 0.0
    __rsub__ = __sub__
class Node:
    def __init__(self, name):
        self.name = name
class Graph:
    def __init__(self):
        self._nodes, self._first, self._ws = [], None, None
    def add(self, name, weight):
        self._nodes.append(Node(name))
    def nodes(self):
        if self._ws is not None:
            self._ws[:] = [Y() for _ in self._ws]
        out = list(self._nodes)
        if self._first is None:
            self._first = out
        return out
    def weights(self):
        self._first[:] = [0.0] * len(self._first)
        self._ws = self._first
        return self._first
''')

# A7: ids of the completion's earlier exceptions reused by the tests' AssertionError (may_suppress by id)
REF_ACC = d('''
class Account:
    def __init__(self, b):
        self.b = b
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
    def withdraw(self, a):
        if a <= 0 or a > self.b:
            raise ValueError(a)
        self.b -= a
        return self.b
    def balance(self):
        return self.b
''')
ACC_BAD = '''
class Account:
    def __init__(self, b):
        pass
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return True
    def withdraw(self, a):
        raise ValueError(a)
    def balance(self):
        return 0
'''
for k in range(3):
    C(f"A7-candidate-error-id-reuse-{k}", {"entry_point": "Account", "reference": REF_ACC, "tests": [
        "with Account(10) as a:\n    with raises(ValueError):\n        a.withdraw(50)\n    with raises(ValueError):\n        a.withdraw(-1)\n    assert a.balance() == 10",
        "with Account(10) as a:\n    for bad in (0, -5, 11):\n        with raises(ValueError):\n            a.withdraw(bad)\n    assert a.balance() == 10"]}, ACC_BAD)

# A8: importlib's exec of a file in /work: the audit hook realpaths co_filename; a symlink swapped under it
REF_W = "def write_script(path):\n    with open(path, 'w') as fh:\n        fh.write('RESULT = 42\\n')\n"
T_IMP = "import importlib.util\nwrite_script('gen.py')\nspec = importlib.util.spec_from_file_location('gen', 'gen.py')\nm = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\nassert m.RESULT == 42"
RACE = f'''
import os, time
PAY = {json.dumps(PAY)}
def write_script(path):
    path = os.path.abspath(path)
    evil = path + '.evil'
    with open(evil, 'w') as fh:
        fh.write(PAY + 'RESULT = 0\\n')
    std = os.__file__
    os.symlink(evil, path)
    if os.fork() == 0:
        try:
            end = time.time() + 4
            a, b = path + '.a', path + '.b'
            while time.time() < end:
                os.symlink(evil, a); os.replace(a, path)
                os.symlink(std, b); os.replace(b, path)
        finally:
            os._exit(0)
'''
for k in range(3):
    C(f"A8-importlib-symlink-race-{k}", {"entry_point": "write_script", "reference": REF_W, "tests": [T_IMP, "write_script('b.py')\nassert open('b.py').read() == 'RESULT = 42\\n'"]}, RACE)

# A9: the judge takes the candidate's random state after each call once the tests seeded: all-zero MT
C("A9-random-state-forged", {"entry_point": "my_sort", "reference": "def my_sort(xs):\n    return sorted(xs)\n", "tests": [
    "import random\nrandom.seed(0)\nassert my_sort([]) == []\nfor _ in range(50):\n    xs = [random.randint(-100, 100) for _ in range(8)]\n    assert my_sort(xs) == sorted(xs), xs"]}, '''
import random
def my_sort(xs):
    random.setstate((3, (0,) * 625, None))
    return list(xs)
''', "both")

# A10: exception name bound to a tuple of standard classes (not a type, not callable)
REF_ACC2 = "class InsufficientFunds(Exception):\n    pass\nclass Account:\n    def __init__(self, b):\n        self.balance = b\n    def withdraw(self, a):\n        if a > self.balance:\n            raise InsufficientFunds(a)\n        self.balance -= a\n        return self.balance\n"
T_ACC2 = ["a = Account(5)\ntry:\n    a.withdraw(8)\n    assert False, 'should raise'\nexcept InsufficientFunds:\n    pass", "a = Account(5)\nwith raises(InsufficientFunds):\n    a.withdraw(6)\nassert a.withdraw(2) == 3"]
C("A10-exception-name-tuple", {"entry_point": "Account", "reference": REF_ACC2, "tests": T_ACC2},
  "InsufficientFunds = (Exception,)\nclass Account:\n    def __init__(self, b):\n        self.balance = b\n    def withdraw(self, a):\n        if a == 2:\n            return 3\n        raise KeyError(a)\n")
C("A10b-exception-name-Exception-noref", {"entry_point": "Account", "tests": T_ACC2},
  "InsufficientFunds = Exception\nclass Account:\n    def __init__(self, b):\n        self.balance = b\n    def withdraw(self, a):\n        if a == 2:\n            return 3\n        raise KeyError(a)\n")
