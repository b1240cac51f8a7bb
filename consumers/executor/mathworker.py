"""The math answer worker: one process of the executor's answer pool (consumers/executor/answers.py
``MathPool``), never the stage's own. It parses untrusted answers with a CAS (math-verify over sympy),
so it lives under a memory limit (RLIMIT_AS) and is killed and replaced by the pool when an answer
takes longer than its wall-clock limit. Nothing here evaluates model text: math-verify's LaTeX parser
(ANTLR) builds sympy objects from tokens (its plain-expression reader, sympy's ``parse_expr``, is an
``eval`` and is not used; the eval inside sympy's string parser is held to sympy constructors of
literals: number tokens, sympy's own constants); a
task's regex is compiled and searched, never executed as code.

Started as ``python -m rollstream.consumers.executor.mathworker MEMORY_MB`` (no multiprocessing: nothing of the
executor's main module runs here). Protocol (JSON frames on stdin/stdout, one request at a time; a
``{"ready": true}`` frame once the CAS is loaded): ``{"op": "check", "answer", "gold", "tolerance"}``
-> ``{"matched", "answer_parsed", "gold_parsed", "reason"}``; ``{"op": "find", "text", "pattern"}`` ->
``{"found": [...]}``; any failure -> ``{"error": "memory" | "depth" | "exception", "message"}`` (after
``memory`` the worker exits: the pool starts another). EOF on stdin (the executor gone) ends it.

Imports stay light at module level (the executor imports :func:`read_frame`/:func:`frame`); the CAS is
loaded in the worker only.
"""

from __future__ import annotations

import io
import logging
import os
import re
import resource
import sys
import tokenize
from functools import lru_cache
from typing import Any

MAX_FOUND = 16  # matches of a task's regex returned (each cut at FOUND_CHARS)
FOUND_CHARS = 2100  # over the executor's MAX_ANSWER_CHARS: a longer answer is still seen as too large
CUT = 500  # characters of a parsed form in the reply
_CAS: Any = None


# What sympy's string parser may evaluate here (its parse_expr ends in an eval; the LaTeX parser's number
# tokens reach it through sympy.Number(text), sympy's own modules through sympify of their constants):
# names of sympy's expression classes, number and plain string literals, arithmetic, calls. No attribute,
# subscript, keyword, builtin (open, eval, getattr, ...) or name with an underscore in front.
_OPERATORS = frozenset({"+", "-", "*", "/", "**", "(", ")", ","})
_LAYOUT = frozenset({tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER})
_NAMES: frozenset[str] | None = None


def plain_code(code: Any, names: frozenset[str]) -> bool:
    """Whether ``code`` (what sympy's parse_expr would eval) is only sympy constructors of literals."""
    if not isinstance(code, str) or len(code) > 100_000:
        return False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    for token in tokens:
        kind, text = token.type, token.string
        if kind == tokenize.NAME:
            if text not in names:
                return False
        elif kind == tokenize.OP:
            if text not in _OPERATORS:
                return False
        elif kind == tokenize.STRING:
            if text[0] not in "'\"":  # no f-, b-, r-strings
                return False
        elif kind != tokenize.NUMBER and kind not in _LAYOUT:
            return False
    return True


def expression_classes(sympy: Any) -> frozenset[str]:
    """sympy's public names that are expression classes (Symbol, Integer, Float, Pow, sin, Eq, ...) or
    constants (E, pi, I, oo)."""
    names = set()
    for name in dir(sympy):
        value = getattr(sympy, name, None)
        if not name.startswith("_") and (isinstance(value, sympy.Basic)  # constants: E, pi, I, oo
                                         or isinstance(value, type) and issubclass(value, sympy.Basic)):
            names.add(name)
    return frozenset(names)


def _plain_only(evaluate: Any, names: frozenset[str]) -> Any:
    def eval_expr(code: Any, local_dict: Any, global_dict: Any) -> Any:
        if not plain_code(code, names):
            raise ValueError("sympy's string parser evaluates sympy constructors of literals only here")
        return evaluate(code, local_dict, global_dict)

    return eval_expr


def cas() -> Any:
    """math_verify's parse/verify and its configs (imported once per process). LaTeX extraction only: its
    expression reader (ExprExtractionConfig) is sympy's parse_expr, an ``eval`` of the text; and the eval
    inside sympy's string parser is held to sympy constructors of literals (:func:`plain_code`)."""
    global _CAS
    if _CAS is None:
        logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeouts are ours (the pool's)
        import sympy
        from sympy.parsing import sympy_parser

        sympy_parser.eval_expr = _plain_only(sympy_parser.eval_expr, expression_classes(sympy))
        import math_verify

        configs = [math_verify.LatexExtractionConfig()]
        _CAS = (math_verify.parse, math_verify.verify, configs, sympy)
    return _CAS


def warm() -> None:
    """Load the CAS and its LaTeX grammar (the fork server does this once for every worker)."""
    check({"answer": "\\frac{1}{2}", "gold": "0.5", "tolerance": None})


def _wrap(text: str) -> str:
    return "$" + re.sub(r"(?<!\\)\$", "", text) + "$"


def _parse(text: str) -> list:
    """What the CAS reads ``text`` as ([] when it cannot); out of memory or too deep: raised."""
    parse, _, configs, _ = cas()
    try:
        return parse(_wrap(text), configs, parsing_timeout=None, raise_on_error=True)
    except (MemoryError, RecursionError):
        raise
    except Exception:
        return []


@lru_cache(maxsize=1024)
def _parse_gold(gold: str) -> tuple:
    return tuple(_parse(gold))


def _close(a: Any, b: Any, tolerance: float, sympy: Any) -> bool:
    """Two real numbers within ``tolerance`` of max(1, |b|)."""
    if not (isinstance(a, sympy.Basic) and isinstance(b, sympy.Basic) and a.is_number and b.is_number):
        return False
    try:
        x, y = complex(sympy.N(a, 30)), complex(sympy.N(b, 30))
    except (TypeError, ValueError, ArithmeticError):
        return False
    if x.imag or y.imag or x != x or y != y:
        return False
    return abs(x.real - y.real) <= tolerance * max(1.0, abs(y.real))


def check(request: dict) -> dict:
    """Whether ``answer`` equals ``gold`` (both as the task and the completion wrote them)."""
    _, verify, _, sympy = cas()
    answer, gold, tolerance = str(request["answer"]), str(request["gold"]), request.get("tolerance")
    golds = list(_parse_gold(gold))
    answers = _parse(answer)
    parsed = [a for a in answers if not isinstance(a, str)]
    gold_parsed = [g for g in golds if not isinstance(g, str)]
    shown = {"answer_parsed": str(parsed[0])[:CUT] if parsed else "",
             "gold_parsed": str(gold_parsed[0])[:CUT] if gold_parsed else ""}
    if not parsed:
        return {"matched": False, "reason": "the answer does not read as mathematics", **shown}
    if not gold_parsed:  # the task's answer is no expression: it is compared as text
        same = " ".join(answer.split()) == " ".join(gold.split())
        return {"matched": same, "reason": "the gold answer does not parse: compared as text, "
                + ("the same" if same else "different"), **shown}
    failures = []
    for g in gold_parsed:
        for a in parsed:
            try:
                if verify(g, a, timeout_seconds=None, raise_on_error=True):
                    return {"matched": True, "reason": "equal", **shown}
            except (MemoryError, RecursionError):
                raise
            except Exception as exc:  # the CAS could not compare these two forms: not equal
                failures.append(type(exc).__name__)
            if tolerance is not None and _close(a, g, float(tolerance), sympy):
                return {"matched": True, "reason": f"within the tolerance {tolerance:g}", **shown}
    reason = "not equal" + (f" (the CAS failed comparing some forms: {', '.join(sorted(set(failures)))})"
                            if failures else "")
    return {"matched": False, "reason": reason, **shown}


def find(request: dict) -> dict:
    """The answers a task's regex finds in a completion: group ``answer``, else group 1, else the match."""
    pattern = re.compile(str(request["pattern"]))
    found = []
    for match in pattern.finditer(str(request["text"])):
        if "answer" in pattern.groupindex:
            value = match.group("answer")
        elif pattern.groups:
            value = match.group(1)
        else:
            value = match.group(0)
        found.append((value or "")[:FOUND_CHARS])
        if len(found) >= MAX_FOUND:
            break
    return {"found": found}


def limit_memory(memory_mb: int) -> None:
    """RLIMIT_AS at what this process maps now plus ``memory_mb``: an answer that needs more raises
    MemoryError here (the pool's ``too_large``), never in the executor."""
    try:
        with open("/proc/self/status") as status:
            mapped_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        mapped_kb = 0
    limit = mapped_kb * 1024 + memory_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def read_frame(stream: Any) -> bytes | None:
    """One frame (4-byte big-endian length, then the bytes), or None at EOF."""
    header = _read_exactly(stream, 4)
    if header is None:
        return None
    return _read_exactly(stream, int.from_bytes(header, "big"))


def _read_exactly(stream: Any, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def serve(memory_mb: int) -> None:
    """The worker's loop: one request at a time from stdin, one reply each on stdout, until EOF."""
    import msgspec

    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything printed goes to stderr, never into the replies
    sys.setrecursionlimit(4000)
    warm()
    limit_memory(memory_mb)
    replies.write(frame(b'{"ready":true}'))
    handlers = {"check": check, "find": find}
    while True:
        try:
            data = read_frame(requests)
            if data is None:
                return
            request = msgspec.json.decode(data)
        except (OSError, msgspec.DecodeError):
            return
        fatal = False
        try:
            reply = handlers[request["op"]](request)
        except MemoryError:
            reply, fatal = {"error": "memory", "message": "over the worker's memory limit"}, True
        except RecursionError:
            reply = {"error": "depth", "message": "nested too deep"}
        except Exception as exc:
            reply = {"error": "exception", "message": type(exc).__name__}
        try:
            replies.write(frame(msgspec.json.encode(reply)))
        except (OSError, MemoryError):
            return
        if fatal:
            os._exit(0)


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 1024)
