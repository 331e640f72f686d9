"""Import throughput into Label Studio on SQLite: `sense7 import`'s path vs the raw SDK bulk call.

Starts a private Label Studio (temporary SENSE7_HOME, free port), generates N synthetic conversations,
then in one run: (1) our importer (validate the file, list existing keys, store upsert, chunked bulk
import) into a fresh project, (2) one raw `projects.import_tasks` call with the same task list into
another fresh project. Prints tasks/s for both and our overhead ratio.

    .venv/bin/python scripts/bench_import.py --conversations 1000
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from sense7.labelstudio import client as ls_client
from sense7.labelstudio.importer import import_conversations, plan_tasks
from sense7.processes import free_port
from sense7.readers.formats import read_conversations
from sense7.settings import Settings
from sense7.stack import Stack
from sense7.store.database import Store
from sense7.synthetic import synth
from sense7.taxonomy import load_taxonomy

from benchkit import argument_parser, emit


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--raters", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        settings = Settings.from_env({"SENSE7_HOME": str(home), "SENSE7_LS_PORT": str(free_port())})
        with Stack(settings) as stack:
            stack.start_label_studio()
            tax = load_taxonomy()
            synth.write(synth.generate(args.conversations, args.raters, args.seed, tax), home / "batch")
            client = ls_client.connect(settings, timeout=600)
            ours = ls_client.create_rating_project(client, "bench: sense7 import", tax)
            raw = ls_client.create_rating_project(client, "bench: raw SDK", tax)

            start = time.perf_counter()
            conversations = read_conversations(home / "batch" / "conversations.jsonl", tax)
            result = import_conversations(client, ours, conversations, Store(settings.store_url), taxonomy=tax)
            ours_s = time.perf_counter() - start

            tasks = plan_tasks(conversations)
            start = time.perf_counter()
            client.projects.import_tasks(raw, request=tasks, return_task_ids=True)
            raw_s = time.perf_counter() - start

            assert ls_client.count_tasks(client, ours) == ls_client.count_tasks(client, raw) == len(tasks)
            start = time.perf_counter()
            again = import_conversations(client, ours, conversations, Store(settings.store_url), taxonomy=tax)
            reimport_s = time.perf_counter() - start
    figures = {
        "conversations": args.conversations, "tasks": len(tasks), "created": result.created,
        "sense7_import_s": round(ours_s, 2), "sense7_tasks_per_s": round(len(tasks) / ours_s),
        "raw_sdk_s": round(raw_s, 2), "raw_sdk_tasks_per_s": round(len(tasks) / raw_s),
        "overhead_ratio": round(ours_s / raw_s, 2),
        "reimport_s": round(reimport_s, 2), "reimport_created": again.created,
    }
    emit(figures, args.out)


if __name__ == "__main__":
    main()
