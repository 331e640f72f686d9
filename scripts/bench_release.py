"""Timing of `sense7 release` on a large study: building, writing, and the check that reads every file; and
of `sense7 export` on the same store (its tidy tables and the LeWiDi layout).

    .venv/bin/python scripts/bench_release.py                         # 5,000 conversations, 500 raters, 3 each
    .venv/bin/python scripts/bench_release.py --conversations 300 --raters 60   # a quick look

Fills a SQLite store in a temporary folder with a synthetic study (sense7.synthetic.synth: every conversation
rated by `--per-conversation` raters; messages lengthened to about `--chars` characters with ordinary
prose, dates and amounts, so the phone and card detectors have digits to look at), a link per rater and a
completed crowd participant (platform id) per rater: the ids, e-mails, hashes and platform ids the check
looks for. Then times `build_release`, `write_release` and `check_release` (sense7.privacy.release_check)
separately, then `build_export` and `write_export` (sense7.research.study_export, both layouts, each
with its Croissant check and leak scan), and prints one JSON document: sizes, seconds per phase (and the
check's CPU seconds), megabytes checked per second, peak RSS.
"""

from __future__ import annotations

import random
import resource
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import benchkit

from sense7.data.conversations import Conversation, Message
from sense7.privacy.release import build_release, write_release
from sense7.privacy.release_check import check_release, originals_from_store
from sense7.research.study_export import build_export, forbidden_values, write_export
from sense7.store.database import Store
from sense7.store.rater_page_tables import LinkBook
from sense7.store.tables import crowd_completions
from sense7.synthetic import synth
from sense7.taxonomy import load_taxonomy

PROSE = ("I keep going back and forth on whether to take the new role, it pays better but the commute is long "
         "and I would see my kids less. ", "On 12 March I paid 1,250 euros for the course and it started two "
         "weeks late. ", "That sounds like a hard choice, and it makes sense that you feel pulled both ways. ",
         "Version 2.4.1 fixed it for a while; the ticket was number 58213. ")


def _lengthen(conversations, chars: int, rng: random.Random):
    out = []
    for conv in conversations:
        messages = []
        for message in conv.messages:
            text = message.content
            while len(text) < chars * rng.uniform(0.5, 1.5):
                text += " " + rng.choice(PROSE)
            messages.append(Message(message.role, text))
        out.append(Conversation(conv.conversation_id, conv.rater_id, messages, conv.context))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = benchkit.argument_parser(__doc__)
    parser.add_argument("--conversations", type=int, default=5000)
    parser.add_argument("--raters", type=int, default=500)
    parser.add_argument("--per-conversation", type=int, default=3)
    parser.add_argument("--chars", type=int, default=400, help="about how long a message is")
    parser.add_argument("--seed", type=int, default=37)
    args = parser.parse_args(argv)
    log = benchkit.logger("bench_release")
    tax = load_taxonomy()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="sense7-bench-release-") as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'store.sqlite'}")
        data = synth.generate(args.conversations, args.raters, seed=args.seed, taxonomy=tax,
                              raters_per_conversation=args.per_conversation)
        store.upsert_raters([{"rater_id": r["rater_id"], "email": r["email"],
                              "traits": {k: v for k, v in r.items() if k not in ("rater_id", "email")}}
                             for r in data.raters.to_dict("records")])
        store.upsert_conversations(_lengthen(data.conversations, args.chars, rng))
        store.import_ratings(data.ratings)
        links = LinkBook(store)
        now = datetime.now(timezone.utc)
        with store.engine.begin() as conn:
            conn.execute(crowd_completions.insert(), [
                {"rater_id": rid, "study_id": "bench", "platform_id": f"{rng.getrandbits(96):024x}",
                 "outcome": "completed", "entered_at": now} for rid in data.raters["rater_id"]])
        for rid in data.raters["rater_id"]:
            links.issue(rid)
        log(f"store filled: {args.conversations} conversations, {len(data.ratings)} ratings")

        started = time.perf_counter()
        rating_data = store.rating_data(tax)
        originals = originals_from_store(store)
        read_seconds = time.perf_counter() - started
        started = time.perf_counter()
        release = build_release(rating_data, tax, k=5)
        build_seconds = time.perf_counter() - started
        out = Path(tmp) / "release"
        started = time.perf_counter()
        write_release(release, out)
        write_seconds = time.perf_counter() - started
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        log(f"release written: {size / 1e6:.1f} MB; checking")
        started, cpu = time.perf_counter(), time.process_time()
        result = check_release(out, originals, k=5)
        check_seconds, check_cpu = time.perf_counter() - started, time.process_time() - cpu
        started = time.perf_counter()
        export = build_export(store, tax)
        export_build_seconds = time.perf_counter() - started
        leaks = forbidden_values(store, with_ids=False)
        export_seconds = {}
        for fmt in ("tidy", "lewidi"):
            started = time.perf_counter()
            write_export(export, Path(tmp) / f"export-{fmt}", fmt, leaks)
            export_seconds[fmt] = round(time.perf_counter() - started, 1)
        log(f"exported {export.row_counts()['ratings']} rating rows")
        figures = {
            "conversations": args.conversations, "raters": args.raters, "per_conversation": args.per_conversation,
            "rows": result["counts"], "messages": sum(len(c["messages"]) for c in release.tables["conversations"]),
            "release_megabytes": round(size / 1e6, 1),
            "store_ids": len(originals.rater_ids) + len(originals.conversation_ids) + len(originals.platform_ids),
            "seconds": {"read_store": round(read_seconds, 1), "build": round(build_seconds, 1),
                        "write": round(write_seconds, 1), "check": round(check_seconds, 1)},
            "export": {"rating_rows": export.row_counts()["ratings"], "build_seconds": round(export_build_seconds, 1),
                       "write_seconds": export_seconds},
            "check_cpu_seconds": round(check_cpu, 1),  # what a shared machine's wall clock hides
            "check_megabytes_per_second": round(size / 1e6 / check_seconds, 2),
            "peak_rss_megabytes": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "python": sys.version.split()[0],
        }
    benchkit.emit(figures, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
