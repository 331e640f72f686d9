"""Personal details out of participants' texts before anything leaves the import.

Offline detectors, each a well-kept library where one exists: phone numbers (`phonenumbers`, Google's
libphonenumber metadata), card numbers (Luhn check of `python-stdnum`), IBANs (`stdnum.iban`: country
length and mod-97 check); e-mail addresses, URLs and IP addresses (a candidate pattern, IPs validated by
`ipaddress`); and the participant's own identifiers (their name, e-mail and phone from the export's account
file, plus a per-participant list of names and terms). No named-entity model: a name the participant did
not list is not found (docs/DESIGN.md says so).

Each detected value becomes a typed placeholder, consistent within one conversation: the same e-mail is
`[EMAIL_1]` wherever it appears, another one `[EMAIL_2]`; the participant's first name, surname and full
name are all the same `[PERSON_1]`. A `RedactionReport` counts replacements per type and never holds a value.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field, replace

import phonenumbers
from stdnum import iban as stdnum_iban
from stdnum import luhn

from sense7.data.conversations import Conversation, Message

# Placeholder types, in the order a tie between overlapping spans of the same length is broken.
TYPES = ("EMAIL", "URL", "IBAN", "CARD", "IP", "PHONE", "PERSON", "TERM")
PLACEHOLDER = re.compile(r"\[(?:%s)_\d+\]" % "|".join(TYPES))

# Letters and digits of any script ([^\W_]): internationalized addresses (jörg.müller@beispiel.de, RFC 6531)
# are addresses too.
EMAIL = re.compile(r"(?<![\w.+-])[^\W_][\w.%+-]*@[^\W_](?:[\w-]*[^\W_])?"
                   r"(?:\.[^\W_](?:[\w-]*[^\W_])?)*\.[^\W\d_]{2,}\b")
URL = re.compile(r"\b(?:(?:https?|ftp)://|www\.)[^\s<>\"'`\]\[)(]+", re.IGNORECASE)
IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.]*\d)")
IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
# Compact ("DE89370400440532013000") or in groups of four; a candidate that runs into the next word is
# shortened group by group until stdnum accepts it (or nothing is left).
IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:[A-Z0-9]{11,30}\b|(?: [A-Z0-9]{1,4}){3,8}\b)", re.IGNORECASE)
DIGIT = re.compile(r"\d")
TRAILING_PUNCTUATION = ".,;:!?'\""
MIN_NAME_PART = 3  # name parts shorter than this ("Al", "Q.") are matched only inside the full name


@dataclass(frozen=True)
class Identifiers:
    """What identifies one participant: their names (each name's parts count too) and other terms (employer,
    project, street), their e-mail addresses and phone numbers. From the export's account file and/or a
    per-participant list (see read_identifier_list)."""

    names: tuple[str, ...] = ()
    terms: tuple[str, ...] = ()
    emails: tuple[str, ...] = ()
    phones: tuple[str, ...] = ()

    def merged(self, other: "Identifiers") -> "Identifiers":
        return Identifiers(*(tuple(dict.fromkeys(a + b)) for a, b in
                             ((self.names, other.names), (self.terms, other.terms),
                              (self.emails, other.emails), (self.phones, other.phones))))


@dataclass
class RedactionReport:
    """Counts only: replacements per type, conversations touched, texts seen. Never a detected value."""

    counts: Counter = field(default_factory=Counter)
    conversations: int = 0
    conversations_changed: int = 0

    def add(self, counts: Counter) -> None:
        self.conversations += 1
        self.conversations_changed += bool(counts)
        self.counts.update(counts)

    def as_dict(self) -> dict:
        return {"conversations": self.conversations, "conversations_changed": self.conversations_changed,
                "replaced": {t: int(self.counts.get(t, 0)) for t in TYPES}}

    def summary(self) -> str:
        found = ", ".join(f"{t} {self.counts[t]}" for t in TYPES if self.counts.get(t))
        return (f"{self.conversations_changed} of {self.conversations} conversation(s) had personal details "
                f"replaced ({found or 'none found'})")


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: str
    key: str  # what makes two mentions the same value (normalised), for consistent numbering


@functools.lru_cache(maxsize=4096)
def _fold_char(ch: str) -> str:
    base = "".join(c for c in unicodedata.normalize("NFKD", ch) if not unicodedata.combining(c)) or ch
    return base[0].lower()[:1] or ch


def _fold(text: str) -> str:
    """Case- and accent-insensitive form, same length as the input (so spans map back)."""
    if text.isascii():
        return text.lower()
    return "".join(map(_fold_char, text))


def _strip_trailing(text: str, start: int, end: int) -> int:
    while end > start and text[end - 1] in TRAILING_PUNCTUATION:
        end -= 1
    return end


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


class Scrubber:
    """Finds personal details in text and replaces them with typed placeholders.

    `identifiers`: the participant's own (Identifiers). `phone_region`: the region whose national
    numbers (without +country code) are recognised, as ISO 3166 alpha-2 ("US", "GB", "DE")."""

    def __init__(self, identifiers: Identifiers | None = None, phone_region: str = "US"):
        self.identifiers = identifiers or Identifiers()
        self.phone_region = phone_region.upper()
        if self.phone_region not in phonenumbers.SUPPORTED_REGIONS:
            raise ValueError(f"unknown phone region {phone_region!r} (expected an ISO 3166 code such as US, GB, DE)")
        self._own = self._own_patterns(self.identifiers)

    @staticmethod
    def _own_patterns(ids: Identifiers) -> list[tuple[re.Pattern, str, str]]:
        """(pattern on folded text, kind, key): full names and terms first, then name parts."""
        out = []
        for number, name in enumerate(ids.names):
            folded = _fold(" ".join(name.split()))
            if not folded:
                continue
            key = f"person-{number}"
            parts = [p for p in re.split(r"[\s,]+", folded) if p]
            forms = {folded}
            if len(parts) > 1:  # "Jane Q. Doe" is also "Jane Doe", "Doe Jane" and "Doe, Jane"
                first, last = parts[0], parts[-1]
                forms |= {" ".join(parts), f"{first} {last}", f"{last} {first}", f"{last}, {first}"}
            for form in sorted(forms, key=len, reverse=True):
                out.append((re.compile(r"(?<!\w)" + re.escape(form).replace(r"\ ", r"[\s,]+") + r"(?!\w)"),
                            "PERSON", key))
            if len(parts) > 1:  # with middle names or initials the list did not give: "Jane Q. Doe", "Jane A B Doe"
                out.append((re.compile(r"(?<!\w)" + re.escape(parts[0]) + r"(?:\s+\w{1,12}\.?){1,2}\s+"
                                       + re.escape(parts[-1]) + r"(?!\w)"), "PERSON", key))
            for part in parts:
                part = part.strip(".")
                if len(part) >= MIN_NAME_PART:
                    out.append((re.compile(r"(?<!\w)" + re.escape(part) + r"(?!\w)"), "PERSON", key))
        for number, term in enumerate(ids.terms):
            folded = _fold(" ".join(term.split()))
            if folded:
                out.append((re.compile(r"(?<!\w)" + re.escape(folded).replace(r"\ ", r"\s+") + r"(?!\w)"),
                            "TERM", f"term-{number}"))
        for email in ids.emails:
            if email.strip():
                out.append((re.compile(re.escape(_fold(email.strip()))), "EMAIL", email.strip().lower()))
        for phone in ids.phones:
            digits = _digits(phone)
            if len(digits) >= 6:
                # The account's number in any spacing, with or without its country code's digits.
                tail = digits[-9:]
                pattern = r"(?<!\d)(?:\+?\d{1,3}[\s.()-]*)?" + r"[\s.()-]*".join(tail) + r"(?!\d)"
                out.append((re.compile(pattern), "PHONE", f"own-phone-{tail}"))
        return out

    def find(self, text: str) -> list[Span]:
        """Every detected span, overlaps resolved (the longer span wins; then TYPES order)."""
        spans: list[Span] = []
        # Cheap tests first: most texts hold no "@", no "://" and no digit, and skip those detectors.
        if "@" in text:
            for m in EMAIL.finditer(text):
                spans.append(Span(m.start(), m.end(), "EMAIL", m.group().lower()))
        if "://" in text or "www." in text.lower():
            for m in URL.finditer(text):
                end = _strip_trailing(text, m.start(), m.end())
                spans.append(Span(m.start(), end, "URL", text[m.start():end].lower()))
        if DIGIT.search(text) or "::" in text:
            spans += self._numbers(text)
        if self._own:
            folded = _fold(text)
            for pattern, kind, key in self._own:
                for m in pattern.finditer(folded):
                    spans.append(Span(m.start(), m.end(), kind, key))
        return _resolve(spans)

    def _numbers(self, text: str) -> list[Span]:
        """IBANs, card numbers, IP addresses and phone numbers: each holds a digit."""
        spans: list[Span] = []
        for m in IBAN.finditer(text):
            groups = m.group().split(" ")
            for n in range(len(groups), 0, -1):
                compact = "".join(groups[:n]).upper()
                if len(compact) >= 15 and stdnum_iban.is_valid(compact):
                    spans.append(Span(m.start(), m.start() + len(" ".join(groups[:n])), "IBAN", compact))
                    break
        for m in CARD.finditer(text):
            digits = _digits(m.group())
            if 13 <= len(digits) <= 19 and luhn.is_valid(digits) and len(set(digits)) > 1:
                spans.append(Span(m.start(), m.end(), "CARD", digits))
        for m in IPV4.finditer(text):
            try:
                ipaddress.IPv4Address(m.group())
            except ValueError:
                continue
            spans.append(Span(m.start(), m.end(), "IP", m.group()))
        if ":" in text:
            for m in IPV6.finditer(text):
                candidate = m.group()
                if candidate.count(":") < 2 or not re.search(r"[0-9A-Fa-f]", candidate):
                    continue
                try:
                    address = ipaddress.IPv6Address(candidate)
                except ValueError:
                    continue
                spans.append(Span(m.start(), m.end(), "IP", address.compressed))
        for match in phonenumbers.PhoneNumberMatcher(text, self.phone_region, leniency=phonenumbers.Leniency.VALID):
            key = phonenumbers.format_number(match.number, phonenumbers.PhoneNumberFormat.E164)
            spans.append(Span(match.start, match.end, "PHONE", key))
        return spans

    def scrub(self, text: str, numbering: "Numbering") -> tuple[str, Counter]:
        """The text with every span replaced by its placeholder; counts per type."""
        counts: Counter = Counter()
        out, last = [], 0
        for span in self.find(text):
            out.append(text[last:span.start])
            out.append(numbering.placeholder(span.kind, span.key))
            counts[span.kind] += 1
            last = span.end
        out.append(text[last:])
        return "".join(out), counts

    def scrub_conversation(self, conv: Conversation) -> tuple[Conversation, Counter]:
        """A copy with every message and every text of its context scrubbed (one numbering per conversation)."""
        numbering = Numbering()
        counts: Counter = Counter()
        messages = []
        for msg in conv.messages:
            text, found = self.scrub(msg.content, numbering)
            counts.update(found)
            messages.append(Message(msg.role, text))
        context = {}
        for key, value in conv.context.items():
            if isinstance(value, str) and key in SCRUBBED_CONTEXT_KEYS:
                value, found = self.scrub(value, numbering)
                counts.update(found)
            context[key] = value
        return replace(conv, messages=messages, context=context), counts


# Free text a participant wrote that import keeps as context (the conversation's title).
SCRUBBED_CONTEXT_KEYS = ("title",)


class Numbering:
    """Placeholder numbers of one conversation: the same (type, value) always gets the same number."""

    def __init__(self):
        self.numbers: dict[tuple[str, str], int] = {}
        self.per_type: Counter = Counter()

    def placeholder(self, kind: str, key: str) -> str:
        if (kind, key) not in self.numbers:
            self.per_type[kind] += 1
            self.numbers[(kind, key)] = self.per_type[kind]
        return f"[{kind}_{self.numbers[(kind, key)]}]"


def _resolve(spans: list[Span]) -> list[Span]:
    """Non-overlapping spans, left to right: of overlapping ones the longest wins, then TYPES order."""
    rank = {kind: i for i, kind in enumerate(TYPES)}
    chosen: list[Span] = []
    for span in sorted(spans, key=lambda s: (-(s.end - s.start), rank[s.kind], s.start)):
        if span.end <= span.start:
            continue
        if all(span.end <= c.start or span.start >= c.end for c in chosen):
            chosen.append(span)
    return sorted(chosen, key=lambda s: s.start)


def scrub_conversations(conversations: list[Conversation], identifiers_by_rater: dict[str, Identifiers] | None = None,
                        phone_region: str = "US") -> tuple[list[Conversation], RedactionReport]:
    """Scrub a batch; each conversation with its own rater's identifiers. Returns the copies and the report."""
    identifiers_by_rater = identifiers_by_rater or {}
    scrubbers: dict[str, Scrubber] = {}
    report = RedactionReport()
    out = []
    for conv in conversations:
        if conv.rater_id not in scrubbers:
            scrubbers[conv.rater_id] = Scrubber(identifiers_by_rater.get(conv.rater_id), phone_region)
        clean, counts = scrubbers[conv.rater_id].scrub_conversation(conv)
        report.add(counts)
        out.append(clean)
    return out, report
