"""Personal data and secrets in text: found (task intake) and replaced by typed placeholders
(the executor's scrubbing of what leaves a sandbox).

The detectors are maintained libraries, used without any downloaded model:

* ``presidio-analyzer``'s pattern recognisers: e-mail addresses (``EMAIL``), phone numbers
  (``PHONE``, through Google's libphonenumber with strict grouping), IP addresses
  (``IP_ADDRESS``) and credit-card numbers (``CREDIT_CARD``, Luhn-checked). presidio's package
  imports its NLP engines on import; torch and transformers are kept out of that import (they
  are not needed for pattern recognisers and cost ~8 s and ~300 MB), spaCy is imported but no
  model is ever loaded.
* ``detect-secrets``' plugins (``SECRET``): AWS, GitHub, GitLab, Slack, Stripe, OpenAI, npm,
  PyPI, SendGrid, Twilio, Discord, Telegram, Mailchimp, Azure, Artifactory tokens, JWTs,
  passwords in URLs and private-key blocks (the whole PEM block is replaced), plus two key
  shapes its plugins miss (``sk-proj-...`` style keys, Google API keys).

What counts, so that test data of ordinary tasks is not "personal": an IP address only when it
is globally routable (``ipaddress``: not private, loopback, reserved, documentation or
unspecified: ``192.168.0.1`` and ``0.0.0.0`` of a parsing task are not anyone's) and is not a
version (a dotted run of more than four parts, one with a pre-release or build suffix, or one
after ``v``, a version operator such as ``==`` or the word version / release on its line:
``__version__ = "1.2.3.4"``, ``pkg==2.0.1.3``, ``parse_version("1.10.2.3")``); a phone number only
with at least 9 digits and some grouping: a leading ``+``, or a space, dash, dot or parenthesis
*between* two of its digit groups. Code's own punctuation is not grouping: the parenthesis of a
call or a tuple around one long digit literal (``f(4155552671)``) leaves it one group, and
programs print bare digit runs all the time.

:func:`maybe_sensitive` is the cheap prefilter: one compiled regex that every finding needs
to match (an ``@``, a run of 7+ digits with separators, a dotted quad or an IPv6 group, a known
key prefix, a long token, ``PRIVATE KEY``). Text it rejects is returned as it is without
calling a recogniser; on mostly clean program output that is nearly all of it.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec

KINDS = ("EMAIL", "PHONE", "IP_ADDRESS", "CREDIT_CARD", "SECRET")
PLACEHOLDER = {kind: f"<{kind}>" for kind in KINDS}
MAX_SCAN_CHARS = 1 << 20  # longer text is scanned in its first MiB only (tails are 4000 chars)

# Every finding matches this (it is deliberately loose: it only decides whether to look closer).
_PREFILTER = re.compile(
    r"@|\d[\d ()./+-]{6,}\d|\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}|[0-9a-fA-F]{0,4}::?[0-9a-fA-F]{1,4}:"
    r"|PRIVATE KEY|PuTTY|AKIA|ASIA|ABIA|ACCA|A3T|gh[pousr]_|glpat|xox|hooks\.slack|sk_live|rk_live|sk-|eyJ|npm_"
    r"|pypi-|SG\.|AIza|AccountKey|://[^\s/]+:[^\s/]+@|[A-Za-z0-9_+/=-]{32,}"
)
_EXTRA_SECRETS = (
    re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{32,}"),  # API keys of the sk- family
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),  # Google API keys
)
_PEM = re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?(?:-----END[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)",
                  re.DOTALL)


_TOKEN_END = re.compile(r"[A-Za-z0-9_\-.+/=]*")


class Finding(msgspec.Struct, frozen=True):
    kind: str  # one of KINDS
    start: int
    end: int
    text: str


def maybe_sensitive(text: str) -> bool:
    """The cheap prefilter: False means ``text`` holds no finding."""
    return _PREFILTER.search(text) is not None


@functools.lru_cache(maxsize=1)
def _presidio() -> tuple[Any, ...]:
    """presidio's pattern recognisers, built once per process (imported lazily: ~1.5 s)."""
    logging.getLogger("presidio-analyzer").setLevel(logging.WARNING)  # it logs each recogniser it loads
    blocked = [name for name in ("torch", "transformers") if name not in sys.modules]
    for name in blocked:  # an ImportError for presidio's optional NLP engines; removed right after
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        from presidio_analyzer.predefined_recognizers import (
            CreditCardRecognizer,
            EmailRecognizer,
            IpRecognizer,
            PhoneRecognizer,
        )
    finally:
        for name in blocked:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]

    class OfflineEmailRecognizer(EmailRecognizer):
        """presidio validates an address's domain with tldextract, whose default fetches the
        public suffix list over the network: use the snapshot tldextract ships instead."""

        def validate_result(self, pattern_text: str) -> bool:
            return bool(_tld_extract()(pattern_text.rsplit("@", 1)[-1]).suffix)

    return (("EMAIL", OfflineEmailRecognizer()), ("PHONE", PhoneRecognizer(leniency=2)), ("IP_ADDRESS", IpRecognizer()),
            ("CREDIT_CARD", CreditCardRecognizer()))


@functools.lru_cache(maxsize=1)
def _tld_extract() -> Any:
    import tldextract

    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


@functools.lru_cache(maxsize=1)
def _secret_patterns() -> tuple[tuple[re.Pattern[str], bool], ...]:
    """(pattern, replace only its first group) of every secret detector."""
    from detect_secrets.plugins.artifactory import ArtifactoryDetector
    from detect_secrets.plugins.aws import AWSKeyDetector
    from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
    from detect_secrets.plugins.basic_auth import BasicAuthDetector
    from detect_secrets.plugins.discord import DiscordBotTokenDetector
    from detect_secrets.plugins.github_token import GitHubTokenDetector
    from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
    from detect_secrets.plugins.jwt import JwtTokenDetector
    from detect_secrets.plugins.mailchimp import MailchimpDetector
    from detect_secrets.plugins.npm import NpmDetector
    from detect_secrets.plugins.openai import OpenAIDetector
    from detect_secrets.plugins.pypi_token import PypiTokenDetector
    from detect_secrets.plugins.sendgrid import SendGridDetector
    from detect_secrets.plugins.slack import SlackDetector
    from detect_secrets.plugins.stripe import StripeDetector
    from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
    from detect_secrets.plugins.twilio import TwilioKeyDetector

    plugins = (ArtifactoryDetector, AWSKeyDetector, AzureStorageKeyDetector, BasicAuthDetector, DiscordBotTokenDetector,
               GitHubTokenDetector, GitLabTokenDetector, JwtTokenDetector, MailchimpDetector, NpmDetector,
               OpenAIDetector, PypiTokenDetector, SendGridDetector, SlackDetector, StripeDetector,
               TelegramBotTokenDetector, TwilioKeyDetector)
    # a password in a URL: only the password (its group); every other pattern: the whole match
    patterns = [(p, plugin is BasicAuthDetector) for plugin in plugins for p in plugin.denylist]
    return tuple(patterns) + tuple((p, False) for p in _EXTRA_SECRETS)


_DIGIT_GROUPS = re.compile(r"\d+")
# What a version string sits right behind, never an address: "v", a version operator (pip's ==,
# >=, ~=, ...), or a word naming a version followed by nothing but punctuation (``__version__ = "``,
# ``parse_version("``, ``"version": "``, ``release ``).
_VERSION_BEFORE = re.compile(r"(?:\b[vV]|[=<>~!]=|(?:version|release|\bver|semver|requires)\w*[\s\"'=:(\[,]*)"
                             r"[\s\"'(\[]*$", re.IGNORECASE)
_VERSION_AFTER = re.compile(r"\.\d|[-+]?(?:a|b|rc|dev|post|alpha|beta|pre|final)\d*\b|[-+][0-9A-Za-z]", re.IGNORECASE)


def _is_version(text: str, start: int, end: int) -> bool:
    """Whether the dotted quad ``text[start:end]`` is a version (module docstring)."""
    if start >= 2 and text[start - 1] == "." and text[start - 2].isdigit():
        return True  # the tail of a longer dotted run
    if _VERSION_AFTER.match(text, end):
        return True
    return bool(_VERSION_BEFORE.search(text, max(0, start - 40), start))


def _personal(kind: str, value: str, text: str = "", start: int = 0, end: int = 0) -> bool:
    """Whether a recogniser's match (``value`` = ``text[start:end]``) is personal data by the rules
    of the module docstring."""
    if kind == "IP_ADDRESS":
        try:
            routable = ipaddress.ip_address(value.strip("[]")).is_global
        except ValueError:
            return False
        return routable and not (text and _is_version(text, start, end))
    if kind == "PHONE":
        digits = sum(c.isdigit() for c in value)
        grouped = value.lstrip().startswith("+") or len(_DIGIT_GROUPS.findall(value)) >= 2
        return digits >= 9 and grouped
    return True


def find(text: str) -> list[Finding]:
    """Every finding in ``text``, left to right, overlaps resolved in favour of the longer."""
    text = text[:MAX_SCAN_CHARS]
    if not maybe_sensitive(text):
        return []
    found: list[Finding] = []
    for kind, recogniser in _presidio():
        for result in recogniser.analyze(text, entities=recogniser.supported_entities, nlp_artifacts=None):
            value = text[result.start:result.end]
            if result.score >= 0.3 and _personal(kind, value, text, result.start, result.end):
                found.append(Finding(kind, result.start, result.end, value))
    for match in _PEM.finditer(text):
        found.append(Finding("SECRET", match.start(), match.end(), match.group(0)))
    for pattern, grouped in _secret_patterns():
        for match in pattern.finditer(text):
            start, end = match.span(1) if grouped and match.group(1) else match.span()
            if not grouped:  # some patterns stop early (a JWT's signature): to the token's end
                end = _TOKEN_END.match(text, end).end()
            if end > start:
                found.append(Finding("SECRET", start, end, text[start:end]))
    return _without_overlaps(found)


def _without_overlaps(found: list[Finding]) -> list[Finding]:
    kept: list[Finding] = []
    # from the left; where two start together a secret wins (a URL's password looks like an
    # e-mail address), then the longer
    for finding in sorted(found, key=lambda f: (f.start, f.kind != "SECRET", -(f.end - f.start))):
        if kept and finding.start < kept[-1].end:
            continue  # inside (or overlapping) one kept before
        kept.append(finding)
    return kept


class Scrubbed(msgspec.Struct, frozen=True):
    text: str
    counts: dict[str, int]  # kind -> replacements


def scrub(text: str, exempt: Iterable[str] = ()) -> Scrubbed:
    """``text`` with every finding replaced by its placeholder (``<EMAIL>``, ``<SECRET>``, ...),
    except findings whose value occurs in one of ``exempt`` (the task's own text)."""
    if not text or not maybe_sensitive(text):
        return Scrubbed(text, {})
    findings = find(text)
    exempt = tuple(exempt)
    counts: Counter[str] = Counter()
    out, last = [], 0
    for finding in findings:
        if any(finding.text in source for source in exempt):
            continue
        out.append(text[last:finding.start])
        out.append(PLACEHOLDER[finding.kind])
        last = finding.end
        counts[finding.kind] += 1
    if not counts:
        return Scrubbed(text, {})
    out.append(text[last:])
    return Scrubbed("".join(out), dict(counts))
