"""Personal details out of participants' texts: a planted corpus (generated here, with known e-mails, phones,
URLs, IPs, card numbers, IBANs and the participant's names in varied forms) must lose >= 99 % of each type;
precision over the same corpus plus look-alikes (versions, dates, prices, order numbers) is recorded."""

from __future__ import annotations

import ipaddress
import json
import random
import string
from collections import Counter

import phonenumbers
import pytest
from stdnum import iban as stdnum_iban
from stdnum import luhn

from sense7.data.conversations import Conversation, Message
from sense7.privacy.pii import Identifiers, Numbering, RedactionReport, Scrubber, scrub_conversations
from sense7.readers.formats import FormatError, read_identifier_list

FIRST = ["Maria", "José", "Aoife", "Oluwaseun", "Katarzyna", "Jean-Luc", "Priya", "Björn", "Mei", "Tomasz"]
LAST = ["Gonzalez", "Müller", "O'Brien", "Okafor", "Nowak", "Picard", "Raghunathan", "Lindqvist", "Chen", "Kowalski"]
DOMAINS = ["example.org", "mail.example.com", "uni-bonn.example.de", "corp.example.co.uk"]
FILLER = ["Thanks, that helps.", "Can you rewrite this more politely?", "Here is the draft:", "Please check it.",
          "I was told to send it to", "Reach me at", "Our server is", "Pay to", "My card", "See"]
LOOKALIKES = ["Python 3.11.4 fixed it", "on 2024-05-01 at 10:30", "it costs $1,299.99", "order #48213 shipped",
              "ISBN 978-3-16-148410-0", "population 8,336,817", "ticket 1234567812345678 (not a card)",
              "between 2019 and 2023", "page 12 of 340", "commit 3f9a2c1 broke it", "ratio 16:9", "room B-204",
              "serial 4000-1234-5678-9011 is invalid", "call it v2.0", "about 30 % faster", "a 10x10 grid",
              "the year 1999", "release 20240501.1", "latitude 52.5200", "SKU 00012345678905"]


def _email(rng, first, last) -> str:
    local = rng.choice([f"{first}.{last}", f"{first[0]}{last}", f"{first}_{last}{rng.randint(1, 99)}",
                        f"{first}+news", f"{last}.{first}"])
    local = "".join(c for c in local.lower() if c.isascii() and (c.isalnum() or c in "._+-"))
    address = f"{local}@{rng.choice(DOMAINS)}"
    return address.upper() if rng.random() < 0.1 else address


def _phone(rng) -> str:
    region = rng.choice(["US", "US", "US", "GB", "DE", "FR", "IN"])
    while True:
        example = phonenumbers.example_number_for_type(region, rng.choice([phonenumbers.PhoneNumberType.MOBILE,
                                                                           phonenumbers.PhoneNumberType.FIXED_LINE]))
        national = str(example.national_number)
        digits = national[:3] + "".join(rng.choice(string.digits) for _ in national[3:])
        number = phonenumbers.parse(f"+{example.country_code}{digits}")
        if phonenumbers.is_valid_number(number):
            break
    if region == "US":
        style = rng.choice(["national", "dashes", "dots", "international", "e164"])
    else:
        style = rng.choice(["international", "e164"])
    if style == "national":
        return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL)
    if style == "dashes":
        return f"{digits[:3]}-{digits[3:6]}-{digits[6:]}"
    if style == "dots":
        return f"{digits[:3]}.{digits[3:6]}.{digits[6:]}"
    if style == "e164":
        return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.INTERNATIONAL)


def _url(rng) -> str:
    host = rng.choice(["docs.example.com", "www.example.org", "intranet.example.net", "example.io"])
    path = "/".join(rng.choice(["a", "report", "2024", "q3-plan", "view"]) for _ in range(rng.randint(0, 3)))
    query = rng.choice(["", "?id=42", "?user=jd&tab=2", "#section-3"])
    scheme = rng.choice(["https://", "http://", "https://", "www."])
    if scheme == "www.":
        host = host.removeprefix("www.")
    return f"{scheme}{host}/{path}{query}"


def _ip(rng) -> str:
    if rng.random() < 0.7:
        return str(ipaddress.IPv4Address(rng.randint(0x01000000, 0xDFFFFFFF)))
    address = ipaddress.IPv6Address(rng.getrandbits(128))
    return address.compressed if rng.random() < 0.5 else address.exploded


def _card(rng) -> str:
    prefix, length = rng.choice([("4", 16), ("51", 16), ("55", 16), ("37", 15), ("6011", 16)])
    body = prefix + "".join(rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    number = body + luhn.calc_check_digit(body)
    style = rng.choice(["spaces", "dashes", "plain"])
    if style == "plain":
        return number
    groups = [number[i:i + 4] for i in range(0, len(number), 4)]
    return (" " if style == "spaces" else "-").join(groups)


def _iban(rng) -> str:
    while True:
        country, bban = rng.choice([
            ("DE", lambda: "".join(rng.choice(string.digits) for _ in range(18))),
            ("GB", lambda: "".join(rng.choice(string.ascii_uppercase) for _ in range(4))
             + "".join(rng.choice(string.digits) for _ in range(14))),
            ("NL", lambda: "".join(rng.choice(string.ascii_uppercase) for _ in range(4))
             + "".join(rng.choice(string.digits) for _ in range(10))),
        ])
        bban = bban()
        number = country + stdnum_iban.calc_check_digits(country + "00" + bban) + bban
        if stdnum_iban.is_valid(number):
            break
    if rng.random() < 0.5:
        return " ".join(number[i:i + 4] for i in range(0, len(number), 4))
    return number


def _name_form(rng, first, last) -> str:
    form = rng.choice([f"{first} {last}", first, last, f"{last}, {first}", f"{first}'s", f"{first.upper()}",
                       f"{first.lower()} {last.lower()}", f"{first} Q. {last}", f"Dr. {last}"])
    if rng.random() < 0.15:  # typed without accents
        form = form.translate(str.maketrans("éüöÖÉ", "euoOE"))
    return form


# Look-alikes no pattern can tell apart (a four-part version is an IPv4 address, a Luhn-valid order number
# a card number, ten digits a US phone number): they cost precision; the figure with them is recorded too.
HARD_LOOKALIKES = ["firmware 10.0.12.4 is out", "order number 4539578763621486", "invoice 2125551234",
                   "ISBN 9780306406157", "tracking 1Z999AA10123456784", "mac 00:1A:2B:3C:4D:5E", "date 12/05/2024",
                   "SSN-like 123-45-6789", "hash deadbeef::cafe", "timestamp 1700000000123"]

PLANTERS = {"EMAIL": None, "PHONE": _phone, "URL": _url, "IP": _ip, "CARD": _card, "IBAN": _iban, "PERSON": None}


def planted_corpus(n_conversations: int = 300, seed: int = 27, lookalikes=LOOKALIKES):
    """[(conversation, identifiers, [(message index, start, end, type)])]: every planted value's span."""
    rng = random.Random(seed)
    corpus = []
    for number in range(n_conversations):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        ids = Identifiers(names=(f"{first} {last}",))
        messages, spans = [], []
        for index in range(4):
            pieces, offset, text = [], 0, ""
            for _ in range(rng.randint(2, 4)):
                kind = rng.choice(list(PLANTERS))
                value = (_email(rng, first, last) if kind == "EMAIL" else _name_form(rng, first, last)
                         if kind == "PERSON" else PLANTERS[kind](rng))
                before = f"{rng.choice(FILLER)} {rng.choice(lookalikes)}, and "
                text += before
                start = len(text)
                text += value
                spans.append((index, start, start + len(value), kind))
                text += rng.choice([". ", ", ", " ", "! ", ") ", "\n"])
            text += rng.choice(lookalikes) + "."
            messages.append(Message("user" if index % 2 == 0 else "assistant", text))
        corpus.append((Conversation(f"p{number}", "r1", messages), ids, spans))
    return corpus


def _score(corpus, phone_region="US"):
    """Per type: planted, found (recall numerator), detections, correct detections (precision numerator)."""
    planted, found, detections, correct = Counter(), Counter(), Counter(), Counter()
    for conv, ids, spans in corpus:
        scrubber = Scrubber(ids, phone_region)
        hits = {i: scrubber.find(m.content) for i, m in enumerate(conv.messages)}
        for index, start, end, kind in spans:
            planted[kind] += 1
            covered = sum(max(0, min(end, s.end) - max(start, s.start)) for s in hits[index] if s.kind == kind)
            # The value is gone when its characters are covered (a possessive "'s" or "Dr." may stay).
            value = conv.messages[index].content[start:end]
            essential = len(value.removesuffix("'s").removeprefix("Dr. "))
            found[kind] += covered >= essential
        for index, found_spans in hits.items():
            mine = [(s, e, k) for i, s, e, k in spans if i == index]
            for span in found_spans:
                detections[span.kind] += 1
                correct[span.kind] += any(k == span.kind and span.start < e and span.end > s for s, e, k in mine)
    return planted, found, detections, correct


@pytest.fixture(scope="module")
def scores():
    planted, found, detections, correct = _score(planted_corpus())
    figures = {kind: {"planted": planted[kind], "recall": round(found[kind] / planted[kind], 4),
                      "detections": detections[kind],
                      "precision": round(correct[kind] / detections[kind], 4) if detections[kind] else None}
               for kind in PLANTERS}
    print("\nPII planted corpus (300 conversations, seed 27):", json.dumps(figures))
    planted, found, detections, correct = _score(planted_corpus(lookalikes=LOOKALIKES + HARD_LOOKALIKES))
    hard = {kind: {"recall": round(found[kind] / planted[kind], 4),
                   "precision": round(correct[kind] / detections[kind], 4)} for kind in PLANTERS}
    print("With the hard look-alikes too (recorded, not asserted):", json.dumps(hard))
    return figures


@pytest.mark.parametrize("kind", list(PLANTERS))
def test_planted_corpus_recall_per_type_is_at_least_99_percent(scores, kind):
    assert scores[kind]["planted"] >= 100
    assert scores[kind]["recall"] >= 0.99, scores[kind]


def test_precision_over_the_corpus_with_lookalikes_is_recorded(scores):
    # Recorded in docs (the figures print with -s); a floor catches a detector gone wild on look-alikes.
    for kind, figure in scores.items():
        assert figure["precision"] is not None and figure["precision"] >= 0.9, (kind, figure)


def test_placeholders_are_typed_and_consistent_within_a_conversation_and_restart_in_the_next():
    ids = Identifiers(names=("Jane Q. Doe",), terms=("Acme Corp",), emails=("jd@home.example",),
                      phones=("+1 415 555 0132",))
    conv = Conversation("c1", "r1", [
        Message("user", "I am Jane Doe, mail jane@work.example or jd@home.example; call (415) 555-0132."),
        Message("assistant", "Hi Jane! I will write to JANE@WORK.EXAMPLE and 415.555.0132 about Acme Corp."),
        Message("user", "Also bob@other.example. Doe, Jane signing off.")], {"title": "Jane's letter"})
    other = Conversation("c2", "r1", [Message("user", "bob@other.example here"), Message("assistant", "ok")])
    (clean, clean2), report = scrub_conversations([conv, other], {"r1": ids})
    assert clean.messages[0].content == "I am [PERSON_1], mail [EMAIL_1] or [EMAIL_2]; call [PHONE_1]."
    assert clean.messages[1].content == "Hi [PERSON_1]! I will write to [EMAIL_1] and [PHONE_1] about [TERM_1]."
    assert clean.messages[2].content == "Also [EMAIL_3]. [PERSON_1] signing off."
    assert clean.context["title"] == "[PERSON_1]'s letter"
    assert clean2.messages[0].content == "[EMAIL_1] here"  # numbering is per conversation
    assert report.as_dict()["replaced"]["EMAIL"] == 5 and report.conversations_changed == 2
    blob = json.dumps(report.as_dict()) + report.summary()
    assert "@" not in blob and "Jane" not in blob and "415" not in blob  # counts only, never a value


def test_lookalikes_alone_are_left_alone():
    text = " ".join(LOOKALIKES)
    found = Scrubber().find(text)
    assert [text[s.start:s.end] for s in found] == [], found


def test_unknown_phone_region_and_identifier_list(tmp_path):
    with pytest.raises(ValueError, match="unknown phone region 'XX'"):
        Scrubber(phone_region="XX")
    path = tmp_path / "ids.txt"
    path.write_text("# my list\nJane Doe\nterm: Acme Corp\nemail: jd@x.example\nphone: +44 20 7946 0958\n\n")
    assert read_identifier_list(path) == Identifiers(("Jane Doe",), ("Acme Corp",), ("jd@x.example",),
                                                     ("+44 20 7946 0958",))
    path.write_text("name:\n")
    with pytest.raises(FormatError, match=r"ids\.txt:1: name: empty"):
        read_identifier_list(path)


def test_report_counts_conversations_without_findings():
    report = RedactionReport()
    report.add(Counter())
    report.add(Counter({"EMAIL": 2}))
    assert report.summary() == "1 of 2 conversation(s) had personal details replaced (EMAIL 2)"
    assert Numbering().placeholder("IP", "x") == "[IP_1]"
