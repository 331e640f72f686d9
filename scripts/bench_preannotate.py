"""Benchmark pre-annotations in bulk (issue 13): the refresh job after a new version, and import with
predictions vs without.

Starts a private Label Studio (temporary SENSE7_HOME, free port, fresh SQLite), synthesizes the paper-scale
study (`synth.generate(1400, 109, seed=3)`), trains v1 on its pilot half (the conversations that do not
become tasks) and then, on the live half (~8,700 tasks; `--tasks N` keeps the first N):

(b) imports the tasks into one fresh project without predictions and into another with v1's predictions in
    the same bulk requests (`import_conversations(predict=...)`), tasks/s each;
(a) promotes v2 and times `Preannotator.run()` over the pre-annotated project's (unlabeled) tasks: every task
    gets a v2 prediction; tasks/s and the phases (list, predict, import).

    .venv/bin/python scripts/bench_preannotate.py [--tasks 8700] [--chunk 500] [--out figures.json]

Prints one JSON document. Timings are wall-clock on whatever else the machine runs.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from benchkit import argument_parser, emit, logger

log = logger("bench_preannotate")


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--conversations", type=int, default=1400)
    parser.add_argument("--raters", type=int, default=109)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=None, help="keep only the first N live tasks' conversations")
    parser.add_argument("--chunk", type=int, default=None, help="predictions per import request of the refresh "
                                                                  "(default SENSE7_PREANNOTATE_CHUNK)")
    parser.add_argument("--prefill", choices=["shown", "hidden", "randomized"], default="shown",
                        help="the study's pre-fill policy for the predicted import and the refresh (issue 15): "
                             "every prediction is recorded in the store, shown-arm ones also pushed")
    args = parser.parse_args()

    from sense7.ml_backend.model import build_model
    from sense7.ml_backend.preannotate import Preannotator

    from sense7.synthetic import synth
    from sense7.data.dataset import RatingData
    from sense7.readers.formats import read_conversations, read_raters, read_ratings
    from sense7.store.database import Store
    from sense7.store.study_design import StudyRecords
    from sense7.labelstudio import client as ls_client
    from sense7.labelstudio.importer import import_conversations, plan_tasks
    from sense7.model.bundle import train_bundle
    from sense7.model.registry import ModelRegistry
    from sense7.processes import free_port
    from sense7.settings import Settings, StudyDesign
    from sense7.stack import Stack
    from sense7.taxonomy import load_taxonomy

    figures: dict = {"machine": f"{os.cpu_count()} cores",
                     "study": f"synth.generate({args.conversations}, {args.raters}, seed={args.seed})"}
    with tempfile.TemporaryDirectory(prefix="bench-preannotate-") as tmp:
        home = Path(tmp)
        settings = Settings.from_env({"SENSE7_HOME": str(home / "home"), "SENSE7_LS_PORT": str(free_port()),
                                      "SENSE7_STORE_URL": f"sqlite:///{home / 'store.sqlite'}",
                                      "SENSE7_MODEL_DIR": str(home / "models")})
        chunk = args.chunk or settings.jobs.preannotate_chunk
        log("starting Label Studio (fresh SQLite)")
        with Stack(settings) as stack:
            stack.start_label_studio()
            # -- the study: pilot half trains v1, live half becomes tasks (as `sense7 demo` splits it) -----
            tax = load_taxonomy()
            study = synth.generate(args.conversations, args.raters, args.seed, tax)
            paths = synth.write(study, home / "study")
            conversations = read_conversations(paths["conversations.jsonl"], tax)
            raters = read_raters(paths["raters.csv"], tax)
            ratings = read_ratings(paths["ratings.csv"], tax)
            ids = sorted({c.conversation_id for c in conversations})
            live_ids = set(ids[: len(ids) // 2])
            live = [c for c in conversations if c.conversation_id in live_ids]
            if args.tasks:
                kept, n = [], 0
                for conv in live:
                    if n >= args.tasks:
                        break
                    kept.append(conv)
                    n += len(conv.assistant_turns())
                live = kept
            n_tasks = len(plan_tasks(live))
            figures["tasks"] = n_tasks
            store = Store(settings.store_url)
            store.upsert_raters(raters)
            pilot = ratings[~ratings.conversation_id.isin(live_ids)].copy()
            pilot["turn_index"] = pilot["turn_index"].astype("Int64")
            pilot_data = RatingData({(c.conversation_id, c.rater_id): c for c in conversations
                                     if c.conversation_id not in live_ids}, pilot,
                                    study.raters.set_index("rater_id"))
            log(f"training v1 on the pilot half ({len(pilot)} ratings); {n_tasks} live tasks")
            started = time.perf_counter()
            bundle = train_bundle(pilot_data, "v1", tax)
            figures["train_v1_s"] = round(time.perf_counter() - started, 1)
            registry = ModelRegistry.from_settings(settings)
            registry.add(bundle, "v1")
            registry.promote("v1")

            client = ls_client.connect(settings, timeout=600)
            plain = ls_client.create_rating_project(client, "bench: import without predictions", tax)
            served = ls_client.create_rating_project(client, "bench: import with predictions", tax)
            model = build_model(settings)

            # -- (b) import without / with predictions -------------------------------------------------
            log("import without predictions")
            started = time.perf_counter()
            result = import_conversations(client, plain, live, store, taxonomy=tax)
            seconds = time.perf_counter() - started
            assert result.created == n_tasks, result
            figures["import_without_predictions"] = {"tasks": n_tasks, "seconds": round(seconds, 2),
                                                     "tasks_per_s": round(n_tasks / seconds, 1)}
            log(f"  {figures['import_without_predictions']}")

            log("import with v1 predictions")
            started = time.perf_counter()
            predict = model.import_predictor(client.projects.get(served).label_config)
            timed = _Timed(predict)
            design = StudyDesign(args.prefill, seed="bench", repeat_share=0.0)
            records = StudyRecords(store)
            result = import_conversations(client, served, live, store, predict=timed, design=design, taxonomy=tax)
            seconds = time.perf_counter() - started
            n_shown = sum(a == "shown" for a in records.arms_frame()["arm"])
            assert result.created == n_tasks and result.predicted == n_shown, result
            assert len(records.predictions_frame()) == n_tasks
            pre = Preannotator(client, model, served, chunk, records)
            assert pre.pending_tasks("v1") == [] or args.prefill != "shown"
            figures["prefill"] = args.prefill
            figures["import_with_predictions"] = {"tasks": n_tasks, "shown": n_shown, "seconds": round(seconds, 2),
                                                  "tasks_per_s": round(n_tasks / seconds, 1),
                                                  "predict_and_record_s": round(timed.seconds, 2)}
            log(f"  {figures['import_with_predictions']}")

            # -- (a) a new version: the refresh job ----------------------------------------------------
            registry.add(bundle, "v2")
            registry.promote("v2")
            model.hot_model.refresh()
            assert model.hot_model.get().version == "v2"
            log(f"refresh: Preannotator.run() with v2 over {n_tasks} unlabeled tasks (chunk {chunk})")
            done = pre.run()
            assert done.version == "v2" and done.pushed == n_shown and done.recorded == n_tasks \
                and not done.failed, done.as_dict()
            figures["refresh_preannotate"] = {"tasks": n_tasks, "pushed": done.pushed, "seconds": done.seconds,
                                              "tasks_per_s": round(n_tasks / done.seconds, 1),
                                              "chunk": chunk, "phases_s": done.phases}
            log(f"  {figures['refresh_preannotate']}")
    emit(figures, args.out)


class _Timed:
    """Wraps the import predictor to time the predict part of an import."""

    def __init__(self, predict):
        self.predict, self.seconds = predict, 0.0

    def __call__(self, tasks):
        started = time.perf_counter()
        try:
            return self.predict(tasks)
        finally:
            self.seconds += time.perf_counter() - started

    def with_records(self, tasks):
        started = time.perf_counter()
        try:
            return self.predict.with_records(tasks)
        finally:
            self.seconds += time.perf_counter() - started


if __name__ == "__main__":
    main()
