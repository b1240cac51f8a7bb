"""Attacks on the judge a security review found, each scoring below
what the wrong code would need, through the real sandbox with the task's reference checked as the
executor checks it (tests/consumers/executor/test_crossing.py holds the classes both ways). Each is
wrong code written against tests of the forms real datasets use:

* code from data run in the judge: doctest examples of the completion's docstring, annotations
  evaluated by ``typing``/``inspect``, ``runpy``/``importlib``/``logging.config`` on files the
  completion wrote (``payload`` rewires the judge's reporting, were it ever run there);
* the tests' computations handed to the completion's process: ``eval``/``exec`` of strings it made,
  pickles and marshal data it wrote or the tests made;
* autospec mocks rewired; warnings that are skips, stops or exits, or carry objects; names the
  reference binds to standard-library objects or module aliases; ``__exit__`` swallowing the
  tests' assertion; objects slipped into a position the reference fills with plain data; copy
  hooks of value subclasses; a ``cached_property`` filled in by hand; strict-mode names the tests
  bind and in-place operators.

Two forms keep Python's own meaning and are not here (docs/executor.md): a task whose entry point
is a builtin's name scores a program that defines nothing as Python would, and a test that
computes its expectation from an argument after the call sees what the call did to it.
"""

from __future__ import annotations

import json
import uuid

import pytest

from rollstream.consumers.executor.reference import ReferenceChecks
from rollstream.consumers.executor.score import evaluate
from rollstream.schemas.events import RewardSpec
from tests.consumers.executor.test_verdicts import PROBE_SPY

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]  # containment: again under runsc in CI

PAY = ("import sys\nfr = sys._getframe()\nwhile fr.f_code.co_name != 'run_test':\n    fr = fr.f_back\n"
       "fr.f_globals['_failure'] = lambda i, e: {'e': 'test', 'i': i, 'ok': True}\n")
P = json.dumps(PAY)
ANN = "exec(" + P + ") or int"
R_ADD = "def f(x):\n    return x + 1\n"
F01 = ("F01-doctest-run-docstring-examples", {"entry_point": "f", "reference": R_ADD, "tests": ["import doctest\ndoctest.run_docstring_examples(f, {})\nassert f(0) == 1", "assert f(1) == 2", "assert f(2) == 3"]},
       "def f(x):\n    r'''\n    >>> exec(" + P + ")\n    '''\n    return 0\n")
F02 = ("F02-doctest-testmod", {"entry_point": "Acc", "reference": "class Acc:\n    def __init__(self):\n        self.t = 0\n    def add(self, x):\n        self.t += x\n        return self.t\n",
       "tests": ["import doctest\nassert doctest.testmod().failed == 0", "a = Acc()\na.add(2)\nassert a.add(3) == 5"]},
       "class Acc:\n    r'''\n    >>> import sys\n    >>> fr = sys._getframe()\n    >>> while fr.f_code.co_name != 'run_test': fr = fr.f_back\n    >>> fr.f_globals['_failure'] = lambda i, e: {'e': 'test', 'i': i, 'ok': True}\n    '''\n    __module__ = '__main__'\n    def add(self, x):\n        return -1\n")
F03 = ("F03-typing-get-type-hints", {"entry_point": "f", "reference": "def f(x: int) -> int:\n    return x + 1\n", "tests": ["from typing import get_type_hints\nassert get_type_hints(f) == {'x': int, 'return': int}", "assert f(1) == 2", "assert f(2) == 3"]},
       "class _F:\n    __globals__ = {}\n    __annotations__ = {'x': " + json.dumps(ANN) + ", 'return': 'int'}\n    def __call__(self, x):\n        return 0\nf = _F()\n")
F04 = ("F04-inspect-get-annotations-eval-str", {"entry_point": "f", "reference": "def f(x: int) -> int:\n    return x + 1\n", "tests": ["import inspect\nassert inspect.get_annotations(f, eval_str=True) == {'x': int, 'return': int}", "assert f(1) == 2"]}, F03[2])
W = "def write_script(path):\n    with open(path, 'w') as fh:\n        fh.write(" + json.dumps(PAY + "RESULT = 0\n") + ")\n"
REF_W = "def write_script(path):\n    with open(path, 'w') as fh:\n        fh.write('RESULT = 42\\n')\n"
F05 = ("F05-runpy-run-path", {"entry_point": "write_script", "reference": REF_W, "tests": ["import runpy\nwrite_script('gen.py')\nassert runpy.run_path('gen.py')['RESULT'] == 42", "write_script('b.py')\nassert open('b.py').read() == 'RESULT = 42\\n'"]}, W)
F06 = ("F06-importlib-spec-from-file", {"entry_point": "write_script", "reference": REF_W, "tests": ["import importlib.util\nwrite_script('gen.py')\nspec = importlib.util.spec_from_file_location('gen', 'gen.py')\nm = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\nassert m.RESULT == 42", "write_script('b.py')\nassert open('b.py').read() == 'RESULT = 42\\n'"]}, W)
LOGCFG = ("[loggers]\nkeys=root\n[handlers]\nkeys=h\n[formatters]\nkeys=\n[logger_root]\nlevel=INFO\nhandlers=h\n[handler_h]\nclass=StreamHandler\nlevel=INFO\nargs=(__import__('builtins').exec(" + P + ") or __import__('sys').stderr,)\n")
F07 = ("F07-logging-config-fileconfig", {"entry_point": "write_config", "reference": "def write_config(path):\n    open(path, 'w').write('[loggers]\\nkeys=root\\n[handlers]\\nkeys=h\\n[formatters]\\nkeys=\\n[logger_root]\\nlevel=INFO\\nhandlers=h\\n[handler_h]\\nclass=StreamHandler\\nlevel=INFO\\nargs=(sys.stderr,)\\n')\ndef level_name(n):\n    return {10: 'DEBUG'}[n]\n",
       "tests": ["import logging, logging.config\nwrite_config('log.ini')\nlogging.config.fileConfig('log.ini')\nassert logging.getLogger().level == logging.INFO", "assert level_name(10) == 'DEBUG'"]},
       "def level_name(n):\n    return 'nope'\ndef write_config(path):\n    open(path, 'w').write(" + json.dumps(LOGCFG) + ")\n")
F08 = ("F08-eval-of-computed-expected", {"entry_point": "calc", "reference": "def calc(expr):\n    return eval(expr, {'__builtins__': {}})\n",
       "tests": ["import random\nrandom.seed(0)\nfor _ in range(20):\n    a, b = random.randint(1, 99), random.randint(1, 99)\n    expr = f'{a}{random.choice(\"+-*\")}{b}'\n    assert calc(expr) == eval(expr), expr", "for e in '''1+2\n3*4'''.splitlines():\n    assert calc(e) == eval(e)"]},
       "import builtins\nbuiltins.eval = lambda *a, **k: 0\ndef calc(expr):\n    return 0\n")
F09 = ("F09-eval-repr-roundtrip", {"entry_point": "to_literal", "reference": "def to_literal(x):\n    return repr(x)\n", "tests": ["assert eval(to_literal([1, 'a', (2, 3)])) == [1, 'a', (2, 3)]", "assert eval(to_literal({'k': None})) == {'k': None}"]},
       "import builtins\n_seen = {}\n_real = builtins.eval\ndef to_literal(x):\n    _seen['junk%d' % len(_seen)] = x\n    return 'junk%d' % (len(_seen) - 1)\nbuiltins.eval = lambda s, *a, **k: _seen[s] if s in _seen else _real(s, *a, **k)\n")
F10 = ("F10-exec-generated-code", {"entry_point": "make_setter", "reference": "def make_setter(name, value):\n    return f'{name} = {value!r}'\n", "tests": ["ns = {}\nsrc = make_setter('x', 5)\nexec(src, ns)\nassert ns['x'] == 5 and src.startswith('x =')"]},
       "import builtins\ndef _x(src, g=None, l=None):\n    g['x'] = 5\nbuiltins.exec = _x\ndef make_setter(name, value):\n    return 'x = oops('\n")
F11 = ("F11-pickle-load-of-written-file", {"entry_point": "save", "reference": "import pickle\ndef save(obj, path):\n    with open(path, 'wb') as f:\n        pickle.dump(obj, f)\n",
       "tests": ["import pickle\nsave({'a': [1, 2], 'b': 3.5}, 'out.pkl')\nwith open('out.pkl', 'rb') as fh:\n    assert pickle.load(fh) == {'a': [1, 2], 'b': 3.5}"]},
       "import pickle\n_last = []\ndef save(obj, path):\n    _last.append(obj)\n    open(path, 'wb').write(b'not a pickle')\npickle.loads = lambda data, **k: _last[-1]\n")
F12 = ("F12-tests-own-marshal-and-pickler-bytes", {"entry_point": "decode", "reference": "import marshal, pickle\ndef decode(b):\n    return marshal.loads(b)\ndef unpickle(b):\n    return pickle.loads(b)\n",
       "tests": ["import marshal\nraw = marshal.dumps({'k': [1, 2]})\nassert decode(raw) == marshal.loads(raw)", "import pickle, io\nbuf = io.BytesIO()\npickle.Pickler(buf).dump({'a': 1})\nassert unpickle(buf.getvalue()) == pickle.loads(buf.getvalue())"]},
       "import marshal, pickle\nmarshal.loads = lambda *a, **k: 0\npickle.loads = lambda *a, **k: 0\ndef decode(b):\n    return 0\ndef unpickle(b):\n    return 0\n")
F13 = ("F13-exec-with-tests-globals", {"entry_point": "area", "reference": "def snippet(n):\n    return f'{n} = 3'\ndef area(r):\n    return 3.14159 * r * r\n",
       "tests": ["exec(snippet('y'), globals())\nassert y == 3", "assert abs(area(2) - 12.566) < 0.01"]},
       "import builtins\ndef _x(src, g=None, l=None):\n    g['y'] = 3\n    g['__builtins__']['abs'] = int\nbuiltins.exec = _x\ndef snippet(n):\n    return 'pass'\ndef area(r):\n    return 12\n")
PURGE = "import shutil\ndef purge(dirs, dry_run=False):\n    done = []\n    for d in dirs:\n        if not dry_run:\n            shutil.rmtree(d)\n        done.append(d)\n    return done\n"
F14 = ("F14-autospec-reset-mock-closure", {"entry_point": "purge", "reference": PURGE, "tests": ["from unittest import mock\nwith mock.patch('shutil.rmtree', autospec=True) as rm:\n    assert purge(['a', 'b'], dry_run=True) == ['a', 'b']\nrm.assert_not_called()",
       "from unittest import mock\nwith mock.patch('shutil.rmtree', autospec=True) as rm:\n    assert purge(['a'], dry_run=False) == ['a']\nrm.assert_called_once_with('a')"]},
       "import shutil\ndef purge(dirs, dry_run=False):\n    for d in dirs:\n        shutil.rmtree(d)\n    if dry_run:\n        shutil.rmtree.reset_mock()\n    return list(dirs)\n")
F15 = ("F15-autospec-calllist-fabricated", {"entry_point": "purge", "reference": PURGE, "tests": ["from unittest import mock\nwith mock.patch('shutil.rmtree', autospec=True) as rm:\n    assert purge(['a', 'b']) == ['a', 'b']\nrm.assert_has_calls([mock.call('a'), mock.call('b')])"]},
       "import shutil\ndef purge(dirs, dry_run=False):\n    for d in dirs:\n        shutil.rmtree.mock_calls.append(('', (d,), {}))\n    return list(dirs)\n")
F16 = ("F16-create-autospec-callback-reset", {"entry_point": "notify", "reference": "def notify(users, send, muted=()):\n    for u in users:\n        if u not in muted:\n            send(u)\n",
       "tests": ["from unittest import mock\ndef _send(msg):\n    pass\nsend = mock.create_autospec(_send)\nnotify(['a', 'b'], send, muted={'b'})\nsend.assert_called_once_with('a')"]},
       "def notify(users, send, muted=()):\n    for u in users:\n        send(u)\n    send.reset_mock()\n    for u in users:\n        if u not in muted:\n            send(u)\n")
F17 = ("F17-warning-systemexit-under-error-filter", {"entry_point": "f", "reference": R_ADD, "tests": ["import warnings\nwith warnings.catch_warnings():\n    warnings.simplefilter('error')\n    assert f(1) == 2", "import warnings\nwith warnings.catch_warnings():\n    warnings.simplefilter('error')\n    assert f(5) == 6"]},
       "import warnings\nclass Done(UserWarning, SystemExit):\n    pass\ndef f(x):\n    warnings.warn(Done('x'))\n    return 0\n")
F18 = ("F18-warning-skiptest-under-error-filter", {"entry_point": "f", "tests": ["import unittest, warnings\nclass T(unittest.TestCase):\n    def test_f(self):\n        with warnings.catch_warnings():\n            warnings.simplefilter('error')\n            self.assertEqual(f(1), 2)\nunittest.main()", "assert f(0) == 1"]},
       "import warnings, unittest\nclass Later(UserWarning, unittest.SkipTest):\n    pass\ndef f(x):\n    if x:\n        warnings.warn(Later('x'))\n    return x + 1\n")
F19 = ("F19-warning-args-carry-objects", {"entry_point": "old", "reference": "import warnings\ndef old(x):\n    warnings.warn('old is deprecated', DeprecationWarning)\n    return x\n",
       "tests": ["import warnings\nwith warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n    assert old(1) == 1\nassert len(w) == 1 and 'deprecated' in w[0].message.args[0]"]},
       "import warnings\nclass Yes:\n    def __contains__(self, x):\n        return True\ndef old(x):\n    warnings.warn(DeprecationWarning(Yes()))\n    return x\n")
F20 = ("F20-object-names-from-import", {"entry_point": "root", "reference": "from math import isclose, sqrt\ndef root(x):\n    return sqrt(x)\n", "tests": ["assert isclose(root(2), 1.41421356, rel_tol=1e-6)", "assert isclose(root(9), 3.0)"]},
       "def isclose(*a, **k):\n    return True\ndef root(x):\n    return 0\n")
F21 = ("F21-module-alias-name", {"entry_point": "next_day", "reference": "import datetime as dt\ndef next_day(d):\n    return d + dt.timedelta(days=1)\n", "tests": ["assert next_day(dt.date(2020, 2, 28)) == dt.date(2020, 2, 29)"]},
       "class dt:\n    @staticmethod\n    def date(*a):\n        return 0\ndef next_day(d):\n    return 0\n")
F22 = ("F22-builtin-named-entry-point", {"entry_point": "divmod", "reference": "def divmod(a, b):\n    q = a // b\n    return (q, a - q * b)\n", "tests": ["assert divmod(7, 2) == (3, 1)", "assert divmod(-7, 2) == (-4, 1)"]},
       "print('no function at all')\n")
F23 = ("F23-exception-name-bound-to-Exception", {"entry_point": "Account", "reference": "class InsufficientFunds(Exception):\n    pass\nclass Account:\n    def __init__(self, b):\n        self.balance = b\n    def withdraw(self, a):\n        if a > self.balance:\n            raise InsufficientFunds(a)\n        self.balance -= a\n        return self.balance\n",
       "tests": ["a = Account(5)\ntry:\n    a.withdraw(8)\n    assert False, 'should raise'\nexcept InsufficientFunds:\n    pass"]},
       "InsufficientFunds = Exception\nclass Account:\n    def __init__(self, b):\n        self.balance = b\n    def withdraw(self, a):\n        return 0\n")
F24 = ("F24-exit-swallows-tests-assert", {"entry_point": "Resource", "reference": "class Resource:\n    def __init__(self, name):\n        self.name = name\n    def __enter__(self):\n        return self\n    def __exit__(self, *exc):\n        return False\n    def read(self):\n        return {'a.txt': 'hello'}[self.name]\n",
       "tests": ["with Resource('a.txt') as r:\n    assert r.read() == 'hello'"]},
       "class Resource:\n    def __init__(self, name):\n        pass\n    def __enter__(self):\n        return self\n    def __exit__(self, *exc):\n        return True\n    def read(self):\n        return ''\n")
Y = "class Y:\n    def __sub__(self, o):\n        return 0.0\n    __rsub__ = __sub__\n"
F25 = ("F25-container-point-aliasing", {"entry_point": "add_score", "reference": "class Tag:\n    def __init__(self, n):\n        self.n = n\ndef add_tag(bucket, n):\n    bucket.append(Tag(n))\ndef add_score(bucket, s):\n    bucket.append(s)\n",
       "tests": ["b = []\nadd_tag(b, 'x')\nadd_score(b, 1.5)\nassert b[0].n == 'x' and abs(b[1] - 1.5) < 1e-9"]},
       Y + "class Tag:\n    def __init__(self, n):\n        self.n = n\ndef add_tag(bucket, n):\n    bucket.append(Tag(n))\ndef add_score(bucket, s):\n    bucket.append(Y())\n")
F26 = ("F26-mixed-point-object-and-float", {"entry_point": "farthest", "reference": "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\ndef farthest(points):\n    best = max(points, key=lambda p: p[0] ** 2 + p[1] ** 2)\n    return Point(*best), (best[0] ** 2 + best[1] ** 2) ** 0.5\n",
       "tests": ["p, d = farthest([(1, 0), (3, 4)])\nassert (p.x, p.y) == (3, 4) and abs(d - 5.0) < 1e-9"]},
       Y + "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\ndef farthest(points):\n    best = max(points, key=lambda p: p[0] ** 2 + p[1] ** 2)\n    return Point(*best), Y()\n")
F27 = ("F27-value-subclass-copy-hooks", {"entry_point": "f", "reference": "def f():\n    return 'abc'\n", "tests": ["import copy\nassert copy.copy(f()) == 'abc' and copy.deepcopy([f()]) == ['abc']"]},
       "class S(str):\n    def __copy__(self):\n        return 'abc'\n    def __deepcopy__(self, memo):\n        return 'abc'\ndef f():\n    return S('zzz')\n")
F28 = ("F28-setup-cached-property-shadow", {"entry_point": "make_circle", "setup": "import functools\nclass Circle:\n    def __init__(self, r):\n        self.r = r\n    @functools.cached_property\n    def area(self):\n        return 3.14159 * self.r ** 2\n",
       "reference": "def make_circle(r):\n    return Circle(r)\n", "tests": ["c = make_circle(2)\nassert c.r == 2 or abs(c.area - 12.566) < 0.01", "assert abs(make_circle(2).area - 12.566) < 0.01"]},
       "def make_circle(r):\n    c = Circle(0)\n    c.__dict__['area'] = 3.14159 * r * r\n    return c\n")
F29 = ("F29-strict-name-assigned-in-try", {"entry_point": "parse", "tests": ["try:\n    result = parse('12')\nexcept ValueError:\n    pass\nassert result == 12"]},
       "result = 12\ndef parse(s):\n    raise ValueError(s)\n")
F30 = ("F30-strict-inplace-op-plain", {"entry_point": "Total", "tests": ["t = Total()\nt += 10\nassert t == 10"]},
       "class Total:\n    def __iadd__(self, other):\n        return 10\n")
F31 = ("F31-mutate-input-before-expected", {"entry_point": "my_sort", "reference": "def my_sort(xs):\n    return sorted(xs)\n", "tests": ["lst = [3, 1, 2]\nassert my_sort(lst) == sorted(lst)"]},
       "def my_sort(xs):\n    xs.clear()\n    return []\n")


ATTACKS = [F01, F02, F03, F04, F05, F06, F07, F08, F09, F10, F11, F12, F13, F14, F15, F16, F17, F18, F19, F20, F21,
           F23, F24, F25, F26, F27, F28, F29, F30]
DESERVED = {"F18-warning-skiptest-under-error-filter": 0.5}  # one of its two tests is right


@pytest.mark.parametrize("name, spec, code", [pytest.param(*a, id=a[0]) for a in ATTACKS])
async def test_attack_scores_below_full(pool, registry, name, spec, code) -> None:
    spec = RewardSpec(**{"timeout_s": 10.0, **spec})
    references = ReferenceChecks(pool) if spec.reference else None
    evaluation = await evaluate(pool, registry, spec, f"```python\n{code}```", f"attack/{uuid.uuid4().hex[:6]}",
                                references=references)
    record = evaluation.scored.execution
    events = [e for e in evaluation.result.events if e.get("e") in ("test", "tamper")] if evaluation.result else []
    assert evaluation.scored.reward <= DESERVED.get(name, 0.0), (record, events)
    probe = await evaluate(pool, registry, RewardSpec(tests=["assert spy() == []"], entry_point="spy"), PROBE_SPY,
                           "attack/probe")
    assert probe.scored.reward == 1.0, probe.result.events  # nothing reached the next job


def test_the_payload_is_valid_python() -> None:
    compile(PAY, "<payload>", "exec")
    assert json.loads(P) == PAY
