"""The second review's cases, as the reviewer wrote them: each module's ``CASES`` holds
``(name, RewardSpec fields, completion code, mode)``; attacks are named A..., honest forms H..."""

import textwrap

PAY = ("import sys\nfr = sys._getframe()\nwhile fr.f_code.co_name != 'run_test':\n    fr = fr.f_back\n"
       "fr.f_globals['_failure'] = lambda i, e: {'e': 'test', 'i': i, 'ok': True}\n")


def d(s):
    return textwrap.dedent(s).lstrip("\n")


def collector(cases):
    """``C`` adds an attack (its spec as given), ``H`` an honest form (its code as its own reference)."""
    def C(name, spec, code, mode="refonly"):
        cases.append((name, spec, d(code), mode))

    def H(name, spec, code, mode="refonly"):
        spec = dict(spec)
        code = d(code)
        spec.setdefault("reference", code)
        cases.append((name, spec, code, mode))

    return C, H
