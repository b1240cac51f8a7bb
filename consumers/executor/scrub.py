"""Scrubbing what leaves a sandbox: personal data and secrets out of the executor's records.

What a completion prints, and what its errors say, goes into ``RewardScored`` (stdout/stderr
tails, the error message, each test's result's message), ``SandboxAudit`` (violations) and, for
a multi-turn episode, the observation fed back to the model; from there into the run archive.
With ``intake.scrub`` (on by default) every e-mail address, phone number, IP address, credit-card
number and secret (API keys, tokens, private keys) in those fields is replaced by a typed placeholder
(``<EMAIL>``, ``<SECRET>``, ...: rollstream/tasks/pii.py) before the records are produced,
and counted per kind in ``rollstream_executor_scrubbed_total{kind}``.

* Text of the task itself is exempt: a value that also appears in the task's setup, tests or
  reference (the IP addresses a parsing task prints back) is kept.
* The completion is never rewritten (``ActionGenerated`` and the assistant turns of a
  continuation stay as the model wrote them), so replay re-scores exactly what it wrote.
* A cheap prefilter (one regex) skips clean text; on mostly clean output that is nearly all of it.
  What it passes is scrubbed off the stage's event loop, in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from rollstream.metrics import StageMetrics
from rollstream.schemas.events import (
    Message,
    PromptIssued,
    RewardScored,
    RewardSpec,
    SandboxAudit,
    TestResult,
)
from rollstream.tasks import pii


def task_text(spec: RewardSpec) -> tuple[str, ...]:
    """The task's own text (exempt from scrubbing)."""
    steps = [part for s in spec.subtasks for part in (s.instruction, *s.tests, s.reference or "")]
    return (spec.setup, *spec.tests, spec.reference, *steps)


class Scrubber:
    """Scrubs the executor's outgoing records; counts what it replaced."""

    def __init__(self, metrics: StageMetrics | None = None, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.counts = (metrics.counter("executor_scrubbed", "Personal data and secrets replaced in what left a "
                                       "sandbox (tails, messages, audit records, observations), by kind", ("kind",))
                       if metrics is not None else None)

    @staticmethod
    def warm() -> None:
        """Load the detectors (about 1.5 s, once per process), so that the first hit does not wait."""
        pii.find("warm-up: someone@example.com")

    async def outgoing(self, reward: RewardScored, audits: list[SandboxAudit], spec: RewardSpec
                       ) -> tuple[RewardScored, list[SandboxAudit]]:
        """:meth:`reward` and :meth:`audit` of one execution's records. Text the prefilter passes is
        scrubbed in a worker thread: crafted output (4000 characters of phone-like digit groups) costs
        the recognisers up to ~0.3 s, which must not stall the stage's loop."""
        execution = reward.execution
        texts = [execution.stdout_tail, execution.stderr_tail, execution.error_message,
                 *(r.message for r in execution.test_results), *(v for a in audits for v in a.violations)]
        if not self.enabled or not any(t and pii.maybe_sensitive(t) for t in texts):
            return reward, audits
        return await asyncio.to_thread(lambda: (self.reward(reward, spec), [self.audit(a, spec) for a in audits]))

    async def outgoing_prompt(self, prompt: PromptIssued, spec: RewardSpec) -> PromptIssued:
        """:meth:`prompt`, in a worker thread when the prefilter passes some of its text."""
        texts = [m.content for m in prompt.messages if m.role != "assistant"]
        if prompt.continuation is not None:
            texts.append(prompt.continuation.observation)
        if not self.enabled or not any(t and pii.maybe_sensitive(t) for t in texts):
            return prompt
        return await asyncio.to_thread(self.prompt, prompt, spec)

    def text(self, text: str, exempt: Sequence[str]) -> str:
        if not self.enabled or not text or not pii.maybe_sensitive(text):
            return text
        scrubbed = pii.scrub(text, exempt)
        if self.counts is not None:
            for kind, count in scrubbed.counts.items():
                self.counts.labels(kind).inc(count)
        return scrubbed.text

    def reward(self, reward: RewardScored, spec: RewardSpec) -> RewardScored:
        execution = reward.execution
        exempt = task_text(spec)
        fields = {name: self.text(getattr(execution, name), exempt)
                  for name in ("stdout_tail", "stderr_tail", "error_message")}
        results = [self._result(r, exempt) for r in execution.test_results]
        changed = {name: text for name, text in fields.items() if text is not getattr(execution, name)}
        if any(a is not b for a, b in zip(results, execution.test_results)):
            changed["test_results"] = results
        if not changed:
            return reward
        return msgspec.structs.replace(reward, execution=msgspec.structs.replace(execution, **changed))

    def _result(self, result: TestResult, exempt: Sequence[str]) -> TestResult:
        """A test's result with its message scrubbed (a failing assert's sides are the data it compared)."""
        message = self.text(result.message, exempt)
        return result if message is result.message else msgspec.structs.replace(result, message=message)

    def audit(self, audit: SandboxAudit, spec: RewardSpec) -> SandboxAudit:
        exempt = task_text(spec)
        violations = [self.text(v, exempt) for v in audit.violations]
        if all(a is b for a, b in zip(violations, audit.violations)):
            return audit
        return msgspec.structs.replace(audit, violations=violations)

    def prompt(self, prompt: PromptIssued, spec: RewardSpec) -> PromptIssued:
        """A continuation: its observation and the user turns (never the model's own turns)."""
        exempt = task_text(spec)
        messages = [self._message(m, exempt) for m in prompt.messages]
        continuation = prompt.continuation
        if continuation is not None:
            continuation = msgspec.structs.replace(
                continuation, observation=self.text(continuation.observation, exempt),
                messages=[self._message(m, exempt) for m in continuation.messages])
        return msgspec.structs.replace(prompt, messages=messages, continuation=continuation)

    def _message(self, message: Message, exempt: Sequence[str]) -> Message:
        if message.role == "assistant":
            return message
        content = self.text(message.content, exempt)
        return message if content is message.content else Message(role=message.role, content=content)
