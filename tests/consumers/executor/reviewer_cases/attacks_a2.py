
from tests.consumers.executor.reviewer_cases import collector, d

CASES = []
C, H = collector(CASES)
REF_CFG2 = d('''
def make_config(level):
    return {'version': 1, 'formatters': {'f': {'format': '%(levelname)s %(name)s: %(message)s'}},
            'handlers': {'console': {'class': 'logging.StreamHandler', 'formatter': 'f', 'level': level}},
            'root': {'level': level, 'handlers': ['console']}}
def parse_level(name):
    return {'DEBUG': 10, 'INFO': 20, 'WARNING': 30, 'ERROR': 40}[name.upper()]
''')
C("A4c-dictConfig-returned-dict-judge-exec", {"entry_point": "make_config", "reference": REF_CFG2, "tests": [
    "import logging, logging.config\nlogging.config.dictConfig(make_config('INFO'))\nassert logging.getLogger().level == logging.INFO",
    "assert parse_level('debug') == 10\nassert parse_level('Error') == 40",
    "cfg = make_config('WARNING')\nassert cfg['root']['level'] == 'WARNING' and cfg['handlers']['console']['level'] == 'WARNING'"]}, '''
def make_config(level):
    return {'version': 1, 'root': {'level': 'INFO'},
            'formatters': {'f': {'()': 'ext://pickle.loads.__globals__.update', 'exec': 'ext://unittest.mock.call'}}}
def parse_level(name):
    return 0
''')
# A4d: HumanEval check(candidate) form
C("A4d-dictConfig-humaneval-check", {"entry_point": "f", "reference": "def write_config(path):\n    import json\n    json.dump({'version': 1, 'root': {'level': 'INFO'}}, open(path, 'w'))\ndef f(x):\n    return x * 2\n", "tests": [
    "import json, logging.config\nwrite_config('c.json')\nlogging.config.dictConfig(json.load(open('c.json')))\nassert logging.getLogger().level == logging.INFO",
    "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(5) == 10\ncheck(f)"]}, '''
import json
def write_config(path):
    cfg = {'version': 1, 'root': {'level': 'INFO'},
           'formatters': {'f': {'()': 'ext://pickle.loads.__globals__.update', 'exec': 'ext://unittest.mock.call'}}}
    json.dump(cfg, open(path, 'w'))
def f(x):
    return 0
''')
