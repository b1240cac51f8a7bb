"""``math_answer``: a completion's final answer compared with the task's gold answer (docs/tasks.md,
"Math answers"). No sandbox: the answer is read here with linear-time string rules, and compared by
math-verify (sympy) in the executor's answer pool (:class:`MathPool`), worker processes under a
wall-clock and a memory limit per answer; never in the stage's own process, never by ``eval``.

Reading (``RewardSpec.answer_format``), after dropping every fenced code block (an answer inside
``` fences is not an answer):

* ``boxed``: the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced (``\\{`` is a literal);
* ``gsm8k``: the last line ``#### n``;
* ``the_answer_is``: the last "the (final) answer is ..." (to the end of its line, a final period off);
* ``regex``: the task's ``answer_pattern`` (group ``answer``, else group 1, else the match), searched
  in the pool (a pattern that backtracks forever is the pool's timeout).

Several answers that differ (``\\boxed{1} or \\boxed{2}``) are a hedge: wrong. An answer over
:data:`MAX_ANSWER_CHARS` or nested deeper than :data:`MAX_NESTING` is ``too_large`` (as is one whose
check exceeds the worker's memory); one that takes longer than the task's ``timeout_s`` is
``timeout`` (``timeout_reward``; the worker is killed and replaced). TeX macro definitions, characters
outside ASCII (look-alike digits; a few typographic symbols are mapped: − × ÷ π √ ∞ ≤ ≥ ≠), chains of
equations and equations between numbers are not read as answers: wrong.

Components: ``answer`` (1 when equal), ``format`` (1 when one answer was found where the task says),
``length`` (as for code); the reward is the weighted sum (default weights ``{"answer": 1.0}``). The
record's ``answer_check`` says what was read, what it was compared with, what the CAS made of both
and why they matched or not; its one ``test_results`` entry says the same for the tools that read
per-test results.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import select
import subprocess
import sys
import time
import unicodedata
from collections import deque
from typing import Any

import msgspec

from rollstream.consumers.executor.mathworker import frame, read_frame
from rollstream.consumers.executor.rewards import (
    _FENCE,
    AnswerKind,
    Scored,
    length_component,
    weighted_reward,
)
from rollstream.schemas.events import AnswerVerdict, ErrorKind, ExecutionRecord, RewardSpec, TestResult

log = logging.getLogger(__name__)
MATH_KIND = "math_answer"
MAX_ANSWER_CHARS = 2000  # characters of an extracted answer (and of the gold answer read from the task)
MAX_NESTING = 10  # levels of {...}, (...), [...] in an answer: \frac bombs parse in exponential time
MAX_CHECK_S = 10.0  # wall-clock seconds of one answer's check at most, whatever the task's timeout_s
MAX_REPLY = 256 << 10
SHOWN = 500  # characters of an answer in the verdict
MEMORY_MB = 1024  # what a worker may map beyond the CAS it starts with
# Typographic symbols read as their LaTeX; any other character outside ASCII is not read (look-alikes)
TYPOGRAPHY = {"\u2212": "-", "\u2013": "-", "\u00d7": "\\times ", "\u00f7": "\\div ", "\u00b7": "\\cdot ",
              "\u22c5": "\\cdot ", "\u03c0": "\\pi ", "\u221a": "\\sqrt", "\u221e": "\\infty ",
              "\u2264": "\\le ", "\u2265": "\\ge ", "\u2260": "\\ne ", "\u00b0": "^\\circ", "\u00a0": " "}
_MACROS = re.compile(r"\\(?:def|gdef|edef|xdef|let|futurelet|newcommand|renewcommand|providecommand|"
                     r"DeclareMathOperator|catcode|mathcode|char|csname|expandafter|input|include|usepackage|"
                     r"makeatletter|begingroup|endgroup|string|scantokens|detokenize|uppercase|lowercase)(?![A-Za-z])")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM8K = re.compile(r"^[ \t]*####[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_THE_ANSWER = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\b[ \t:]*(.*)", re.IGNORECASE)
_EQUALS = re.compile(r"(?<![<>!:=\\])=(?!=)")


def without_fences(text: str) -> str:
    """``text`` with every fenced code block (closed or not) left out."""
    kept, position = [], 0
    fences = list(_FENCE.finditer(text))
    index = 0
    while index < len(fences):
        opening = fences[index]
        marker = opening.group(1)
        closing = next((f for f in fences[index + 1:] if f.group(1)[0] == marker[0]
                        and len(f.group(1)) >= len(marker) and not f.group(2)), None)
        kept.append(text[position:opening.start()])
        if closing is None:
            return "".join(kept)
        position = closing.end()
        index = fences.index(closing) + 1
    kept.append(text[position:])
    return "".join(kept)


def boxed(text: str) -> list[str]:
    """The contents of every outermost ``\\boxed{...}``/``\\fbox{...}`` whose braces close, in order (one
    pass: a box inside a box stays in its content)."""
    found: list[str] = []
    starts = {m.end() - 1: m.end() for m in _BOX.finditer(text)}  # the box's "{" -> where its content starts
    if not starts:
        return found
    stack: list[int | None] = []  # per open brace: a box's content start, or None
    depth_of_box: int | None = None
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n and text[i + 1] in "{}":
                i += 2
                continue
            i += 1
            continue
        if c == "{":
            start = starts.get(i)
            if start is not None and depth_of_box is None:
                depth_of_box = len(stack)
                stack.append(start)
            else:
                stack.append(None)
        elif c == "}" and stack:
            start = stack.pop()
            if start is not None and depth_of_box == len(stack):
                found.append(text[start:i])
                depth_of_box = None
        i += 1
    return found


def unbox(answer: str) -> str:
    """An answer written as ``\\boxed{\\boxed{x}}`` is ``x``."""
    while True:
        inner = boxed(answer)
        stripped = answer.strip()
        if len(inner) == 1 and _BOX.match(stripped) and stripped.endswith("}") and \
                len(stripped) - len(inner[0]) <= len("\\boxed{}") + 8:
            answer = inner[0]
            continue
        return answer


def _clean(answer: str) -> str:
    answer = answer.strip()
    answer = re.sub(r"^\*\*|\*\*$", "", answer).strip()  # markdown bold around it
    if answer.startswith("\\(") and answer.endswith("\\)"):
        answer = answer[2:-2]
    if answer.startswith("\\[") and answer.endswith("\\]"):
        answer = answer[2:-2]
    answer = answer.strip().strip("$").strip()
    return answer


def read_answers(text: str, answer_format: str) -> list[str]:
    """Every answer ``text`` states by the rule ``answer_format`` (not ``regex``: the pool reads that)."""
    if answer_format == "boxed":
        return [_clean(unbox(b)) for b in boxed(text)]
    if answer_format == "gsm8k":
        return [_clean(m.group(1)) for m in _GSM8K.finditer(text)]
    if answer_format == "the_answer_is":
        answers = []
        for match in _THE_ANSWER.finditer(text):
            said = match.group(1).strip()
            boxes = boxed(said)
            said = boxes[-1] if boxes else said.rstrip(".").rstrip()
            answers.append(_clean(said))
        return answers
    raise ValueError(f"answer_format {answer_format!r} is read in the pool")


def gold_answer(answer: str) -> str:
    """The gold answer as the dataset gives it, read: what follows the last ``####`` (GSM8K), else the last
    ``\\boxed{}`` (a MATH solution), else the whole text."""
    if "####" in answer:
        return _clean(answer.rsplit("####", 1)[1])
    boxes = boxed(answer)
    if boxes:
        return _clean(unbox(boxes[-1]))
    return _clean(answer)


def typography(answer: str, allowed: str = "") -> tuple[str, str | None]:
    """The answer with its typographic symbols as LaTeX, and the first character outside ASCII left
    (not in ``allowed``: the gold answer's own), named, or None."""
    out = "".join(TYPOGRAPHY.get(c, c) for c in answer)
    for c in out:
        if ord(c) > 127 and c not in allowed:
            name = unicodedata.name(c, "unnamed")
            return out, f"U+{ord(c):04X} {name}"
    return out, None


def nesting(answer: str) -> int:
    depth = deepest = 0
    for c in answer:
        if c in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "})]":
            depth = max(0, depth - 1)
    return deepest


def refusal(answer: str) -> str | None:
    """Why ``answer`` is not read as an answer (a wrong one), or None."""
    macro = _MACROS.search(answer)
    if macro:
        return f"a TeX macro ({macro.group(0)}) is not an answer"
    equals = [m.start() for m in _EQUALS.finditer(answer)]
    if len(equals) > 1:
        return "a chain of equations is not one answer"
    if equals and not re.search(r"[A-Za-z]", answer[: equals[0]].replace("\\", "")):
        return "an equation between numbers is not an answer"
    return None


class PoolError(Exception):
    """A check the pool could not complete: ``kind`` timeout (killed), died or memory."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Worker:
    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process


class MathPool:
    """Worker processes that parse and compare answers (``python -m rollstream.consumers.executor.mathworker``),
    started on first use (up to ``workers``), each loading the CAS once. Each answer's check has a
    wall-clock limit (the worker is killed and replaced past it) and each worker an address-space limit
    of ``memory_mb`` beyond what it maps once loaded. A worker never runs in the caller's process; one
    whose executor is gone reads EOF and exits."""

    def __init__(self, workers: int | None = None, memory_mb: int = MEMORY_MB, start_timeout_s: float = 120.0) -> None:
        self.size = max(1, workers or min(4, os.cpu_count() or 1))
        self.memory_mb = memory_mb
        self.start_timeout_s = start_timeout_s
        self._idle: list[_Worker] = []
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = self.killed = 0  # workers started; workers killed (past their limit, or dead)

    def _spawn(self) -> _Worker:
        """Start a worker and wait until its CAS is loaded (in a thread: this blocks)."""
        process = subprocess.Popen(
            [sys.executable, "-m", "rollstream.consumers.executor.mathworker", str(self.memory_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
            bufsize=0)  # unbuffered: nothing of a reply waits in a buffer the loop's reader cannot see
        worker = _Worker(process)
        ready, _, _ = select.select([process.stdout], [], [], self.start_timeout_s)
        reply = read_frame(process.stdout) if ready else None
        if reply is None or msgspec.json.decode(reply) != {"ready": True}:
            self._kill(worker)
            raise PoolError("died", f"a math worker did not start (exit code {process.poll()}): is math-verify "
                            "installed? (pip install 'math-verify[antlr4_13_2]')")
        self.started += 1
        return worker

    async def _take(self) -> _Worker:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # another event loop (a new asyncio.run): its waiters are gone
            self._loop, self._waiters = loop, deque()
        while True:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.poll() is None:
                    return worker
                self._drop(worker)
            if self._count < self.size:
                self._count += 1
                spawn = asyncio.ensure_future(asyncio.to_thread(self._spawn))
                try:
                    return await asyncio.shield(spawn)
                except asyncio.CancelledError:
                    spawn.add_done_callback(self._adopt)  # the worker it starts waits idle for the next
                    raise
                except BaseException:
                    self._count -= 1
                    self._wake()
                    raise
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the turn on
                raise

    def _adopt(self, spawn: asyncio.Future[_Worker]) -> None:
        if spawn.cancelled() or spawn.exception() is not None:
            self._count -= 1
        else:
            self._idle.append(spawn.result())
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    @staticmethod
    def _kill(worker: _Worker) -> None:
        process = worker.process
        if process.poll() is None:
            try:
                process.kill()
            except OSError:
                pass
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(5)  # SIGKILL: at once
        except subprocess.TimeoutExpired:
            log.warning("math worker %d did not end after SIGKILL", process.pid)

    def _drop(self, worker: _Worker) -> None:
        """Kill a worker and let another start in its place."""
        self._count -= 1
        self.killed += 1
        self._kill(worker)
        self._wake()

    async def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """One request's reply; PoolError("timeout") past ``timeout_s`` (the worker killed), ("died") when
        the worker ended under it, ("memory") when it ran out of memory (then it is replaced)."""
        payload = frame(msgspec.json.encode(request))
        worker = await self._take()
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        stdin, stdout = worker.process.stdin, worker.process.stdout
        assert stdin is not None and stdout is not None
        fd = stdout.fileno()
        loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
        keep = False
        try:
            try:
                if len(payload) > 32768:  # the worker reads it as it comes; a big one is written off the loop
                    await asyncio.to_thread(self._send, stdin, payload)
                else:
                    self._send(stdin, payload)
            except OSError as exc:
                raise PoolError("died", f"the check's worker was gone ({type(exc).__name__})") from None
            try:
                await asyncio.wait_for(ready, timeout_s)
            except TimeoutError:
                raise PoolError("timeout", f"the check took over {timeout_s:g}s (its worker was killed)") from None
            data = read_frame(stdout)  # written at once by the worker: here already, or arriving
            if data is None or len(data) > MAX_REPLY:
                try:
                    code = worker.process.wait(1)
                except subprocess.TimeoutExpired:
                    code = None
                raise PoolError("died", f"the check's worker ended under it (exit code {code})")
            try:
                reply = msgspec.json.decode(data)
            except msgspec.DecodeError:
                raise PoolError("died", "the check's worker answered nonsense") from None
            if reply.get("error") == "memory":
                raise PoolError("memory", f"the check went over the worker's memory limit ({self.memory_mb} MB)")
            keep = True
            return reply
        finally:
            loop.remove_reader(fd)
            if keep:
                self._idle.append(worker)
                self._wake()
            else:
                self._drop(worker)

    @staticmethod
    def _send(stream: Any, payload: bytes) -> None:
        view = memoryview(payload)
        while view:
            view = view[stream.write(view):]

    def close(self) -> None:
        """End every idle worker (EOF ends it; a kill makes sure); those in a check end with it."""
        idle, self._idle = self._idle, []
        for worker in idle:
            self._count -= 1
            try:
                worker.process.stdin.close()
                worker.process.wait(2)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._kill(worker)


class MathAnswer(AnswerKind):
    """``math_answer``: see the module docstring."""

    components = frozenset({"answer", "format", "length"})

    def __init__(self, pool: MathPool | None = None) -> None:
        self.pool = pool if pool is not None else MathPool()

    def close(self) -> None:
        self.pool.close()

    async def check(self, spec: RewardSpec, completion: str) -> Scored:
        started = time.monotonic()
        rule = spec.answer_format
        timeout_s = min(spec.timeout_s, MAX_CHECK_S)
        gold = gold_answer(spec.answer)[:MAX_ANSWER_CHARS]

        def verdict(kind: ErrorKind, *, answer: float = 0.0, found: bool = True, extracted: str = "",
                    reason: str, parsed: dict[str, Any] | None = None, error_type: str = "") -> Scored:
            parsed = parsed or {}
            matched = answer == 1.0
            check = AnswerVerdict(rule=rule, extracted=extracted[:SHOWN], gold=gold[:SHOWN],
                                  extracted_parsed=str(parsed.get("answer_parsed", ""))[:SHOWN],
                                  gold_parsed=str(parsed.get("gold_parsed", ""))[:SHOWN], matched=matched,
                                  reason=reason[:1000])
            said = (f"read {extracted[:200]!r} ({rule}), gold {gold[:200]!r}: {reason}" if found
                    else f"no answer ({rule}): {reason}")
            result = TestResult(index=0, outcome="passed" if matched else "failed",
                                error_type="" if matched else error_type or "Mismatch",
                                message="" if matched else said[:500], duration_s=time.monotonic() - started)
            record = ExecutionRecord(
                sandbox_id="", exit_code=None, duration_s=time.monotonic() - started, error_kind=kind,
                error_message="" if kind == "none" else said[:4096], timed_out=kind == "timeout",
                tests_passed=int(matched), tests_total=1, test_results=[result], answer_check=check)
            if kind == "timeout":
                return Scored(reward=spec.timeout_reward, components={"penalty": spec.timeout_reward},
                              execution=record)
            components = {"answer": answer, "format": 1.0 if found else 0.0,
                          "length": length_component(completion, spec.max_length_chars)}
            return Scored(reward=weighted_reward(spec.weights, components), components=components, execution=record)

        text = without_fences(completion)
        try:
            if rule == "regex":
                answers = [_clean(a) for a in (await self.pool.call(
                    {"op": "find", "text": text, "pattern": spec.answer_pattern}, timeout_s)).get("found", [])]
            else:
                answers = read_answers(text, rule)
        except PoolError as exc:
            return self._failed(verdict, exc, "")
        answers = [a for a in answers if a]
        if not answers:
            return verdict("none", found=False, reason="none found where the task says", error_type="NoAnswer")
        distinct = list(dict.fromkeys(" ".join(a.split()) for a in answers))
        if len(distinct) > 1:
            shown = ", ".join(repr(a[:40]) for a in distinct[:5]) + (", ..." if len(distinct) > 5 else "")
            return verdict("none", found=False, extracted=answers[-1],
                           reason=f"{len(distinct)} different answers ({shown}): a hedge is wrong", error_type="Hedge")
        extracted = answers[-1]
        if len(extracted) > MAX_ANSWER_CHARS:
            return verdict("too_large", extracted=extracted,
                           reason=f"an answer of {len(extracted)} characters (over {MAX_ANSWER_CHARS})",
                           error_type="TooLarge")
        if nesting(extracted) > MAX_NESTING:
            return verdict("too_large", extracted=extracted, reason=f"nested over {MAX_NESTING} levels",
                           error_type="TooLarge")
        answer, foreign = typography(extracted, allowed="".join(c for c in gold if ord(c) > 127))
        if foreign is not None:
            return verdict("none", extracted=extracted, reason=f"a character outside ASCII ({foreign}) is not read",
                           error_type="Unreadable")
        why = refusal(answer)
        if why is not None:
            return verdict("none", extracted=extracted, reason=why, error_type="Unreadable")
        gold_text = typography(gold)[0]
        try:
            reply = await self.pool.call({"op": "check", "answer": answer, "gold": gold_text,
                                          "tolerance": spec.answer_tolerance}, timeout_s)
        except PoolError as exc:
            return self._failed(verdict, exc, extracted)
        if "error" in reply:
            if reply["error"] == "depth":
                return verdict("too_large", extracted=extracted, reason="nested too deep for the CAS",
                               error_type="TooLarge")
            return verdict("none", extracted=extracted, reason=f"the CAS could not read it ({reply.get('message')})",
                           error_type="Unreadable")
        matched = reply.get("matched") is True
        return verdict("none", answer=1.0 if matched else 0.0, extracted=extracted, reason=str(reply.get("reason")),
                       parsed=reply)

    @staticmethod
    def _failed(verdict: Any, exc: PoolError, extracted: str) -> Scored:
        if exc.kind == "timeout":
            return verdict("timeout", extracted=extracted, reason=str(exc), error_type="Timeout")
        return verdict("too_large", extracted=extracted, reason=str(exc), error_type="TooLarge")
