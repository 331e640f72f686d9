"""Timing of a donated export's import before Label Studio: read a ChatGPT export ZIP, scrub personal details.

    .venv/bin/python scripts/bench_pii.py                        # 10,000 conversations (issue 27's figure)
    .venv/bin/python scripts/bench_pii.py --conversations 200    # a quick look

Builds a ChatGPT-shaped export (mapping trees with a regenerated answer per conversation, 3 exchanges of
realistic length, e-mails, phones, URLs, IPs, card numbers and IBANs planted in one message in four) in a
temporary folder, then times `sense7.readers.exports.read_export` and `sense7.privacy.pii.scrub_conversations`
separately, as `sense7 import` runs them; creating the Label Studio tasks is `scripts/bench_import.py`'s.
Prints one JSON object: sizes, seconds per phase, conversations per second, peak RSS.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from sense7.privacy.pii import Identifiers, scrub_conversations
from sense7.readers.exports import read_export

PLANTED = ["write to jane.doe@mailbox.example", "call (415) 555-0132", "see https://intranet.example.com/hr?id=4",
           "my server 203.0.113.7", "card 4111 1111 1111 1111", "IBAN DE89 3704 0044 0532 0130 00",
           "Jane Doe here", "ping +44 20 7946 0958"]
SENTENCE = ("The quarterly report needs a clearer summary of the budget, the risks and the next steps for the "
            "team, and I would like it to sound calm but firm. ")


def _conversation(rng: random.Random, number: int) -> dict:
    cid = f"conv-{number:06d}"
    mapping, last = {}, None

    def node(node_id, parent, role, text):
        message = None if role is None else {
            "id": node_id, "author": {"role": role}, "content": {"content_type": "text", "parts": [text]},
            "metadata": {"model_slug": "gpt-4o"} if role == "assistant" else {}, "recipient": "all"}
        mapping[node_id] = {"id": node_id, "message": message, "parent": parent, "children": []}
        if parent:
            mapping[parent]["children"].append(node_id)
        return node_id

    last = node(f"{cid}-root", None, None, None)
    for turn in range(3):
        question = SENTENCE * rng.randint(1, 3)
        if rng.random() < 0.25:
            question += rng.choice(PLANTED) + "."
        last = node(f"{cid}-q{turn}", last, "user", question)
        if turn == 0:
            node(f"{cid}-regen", last, "assistant", "An answer the user regenerated.")
        last = node(f"{cid}-a{turn}", last, "assistant", SENTENCE * rng.randint(2, 6))
    return {"conversation_id": cid, "title": f"Report {number}", "create_time": 1_735_689_600 + number * 60,
            "update_time": 1_735_689_600 + number * 60 + 30, "mapping": mapping, "current_node": last}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="sense7-bench-pii-") as tmp:
        path = Path(tmp) / "export.zip"
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("conversations.json", json.dumps([_conversation(rng, i) for i in range(args.conversations)]))
            archive.writestr("user.json", json.dumps({"email": "jane.doe@mailbox.example", "phone_number": "+14155550132"}))
        started = time.perf_counter()
        export = read_export(path, rater="bench-rater")
        read_seconds = time.perf_counter() - started
        started = time.perf_counter()
        _, report = scrub_conversations(export.conversations, {"bench-rater": export.account.merged(Identifiers())})
        scrub_seconds = time.perf_counter() - started
        result = {
            "conversations": len(export.conversations), "zip_bytes": path.stat().st_size,
            "messages": sum(len(c.messages) for c in export.conversations),
            "read_seconds": round(read_seconds, 2), "scrub_seconds": round(scrub_seconds, 2),
            "conversations_per_second": round(len(export.conversations) / (read_seconds + scrub_seconds), 1),
            "replaced": report.as_dict()["replaced"],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
