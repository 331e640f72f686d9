"""Benchmark the Celery jobs in one run, on a fresh Label Studio (SQLite) and store:

1. sync throughput: reconcile 10,000 annotations (50 Label Studio users = 50 raters) into the store,
   then a second, no-change reconciliation; plus webhook-style single-annotation jobs through a real
   Celery worker (jobs/s);
2. retrain wall time on those 10,000 rated items;
3. preannotate throughput into Label Studio (tasks/s) for N unlabeled tasks, against Label Studio's own
   path to the ML backend ("Retrieve predictions" -> /predict on the gunicorn backend) for the same tasks.

    .venv/bin/python scripts/bench_jobs.py [--annotations 10000] [--unlabeled 2000] [--jobs 500]

Prints one JSON document (also written to --out). Timings are wall-clock on whatever else the machine runs.
"""

from __future__ import annotations

import os
import time

from benchkit import argument_parser, emit, fresh_home, logger, toy_annotation

log = logger("bench_jobs")


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--annotations", type=int, default=10_000)
    parser.add_argument("--unlabeled", type=int, default=2_000)
    parser.add_argument("--jobs", type=int, default=500, help="single-annotation sync jobs through the worker")
    parser.add_argument("--raters", type=int, default=50)
    args = parser.parse_args()

    settings = fresh_home("bench-jobs-")
    from label_studio_sdk import LabelStudio

    from sense7.synthetic.toy_study import make_conversations, make_raters
    from sense7.labelstudio.client import ensure_projects, import_tasks
    from sense7.labelstudio.protocol import connect_backend, rating_tasks
    from sense7.stack import Stack

    figures: dict = {"machine": f"{os.cpu_count()} cores", "annotations": args.annotations,
                     "unlabeled_tasks": args.unlabeled}
    with Stack(settings) as stack:
        log("starting Label Studio (fresh SQLite)")
        stack.start_label_studio()
        redis_url = stack.start_redis()
        client = LabelStudio(base_url=settings.ls_url, api_key=settings.ls_token, timeout=600)
        from sense7.tasks.runtime import Runtime

        rt = Runtime(settings)
        rating, profile = ensure_projects(client, settings, rt.taxonomy)

        # -- data: raters (store + Label Studio users), conversations, annotated tasks ------------------
        raters = make_raters(args.raters, rt.taxonomy, prefix="b")
        rt.store.upsert_raters(raters)
        user_ids = {}
        for r in raters:
            user_ids[r["rater_id"]] = client.users.create(username=r["email"], email=r["email"],
                                                          password="bench-only-9c1f").id
        turns = 5
        per_rater = max(1, args.annotations // (args.raters * turns))
        convs = make_conversations([r["rater_id"] for r in raters], per_rater=per_rater, turns=turns, prefix="b")
        rt.store.upsert_conversations(convs)
        labeled = []
        for k, conv in enumerate(convs):
            for task in rating_tasks(conv):
                text = task["data"]["turn"][0]["content"]
                task["annotations"] = [{"result": toy_annotation(text, rt.taxonomy, bias=k % 3 - 1),
                                        "completed_by": user_ids[conv.rater_id]}]
                labeled.append(task)
        labeled = labeled[:args.annotations]
        log(f"importing {len(labeled)} annotated tasks")
        started = time.perf_counter()
        import_tasks(client, rating, labeled)
        figures["import_annotated_tasks_s"] = round(time.perf_counter() - started, 1)
        # The raters' submissions behind those annotations (as the rater page's outbox holds them once
        # delivered): the sync counts an annotation as a rater's only with one behind it (issue 23).
        from sense7.store.rater_page_tables import Outbox
        from sense7.labelstudio.label_sync import LabelSync

        outbox = Outbox(rt.store)
        for task in LabelSync(client, rt.store, rt.taxonomy, rating, profile).exported_tasks(rating):
            for annotation in task["annotations"]:
                rater = task["data"]["rater_id"]
                revision = outbox.add_next(rater, "rating", task["id"], annotation["result"],
                                           {"result": annotation["result"]}, None)
                outbox.mark_delivered(rater, task["id"], revision, int(annotation["id"]))

        # -- 1. sync -----------------------------------------------------------------------------------
        from sense7.labelstudio.label_sync import LabelSync

        syncer = LabelSync(client, rt.store, rt.taxonomy, rating, profile)
        started = time.perf_counter()
        exported = sum(len(t.get("annotations") or []) for t in syncer.exported_tasks(rating))
        figures["export_only"] = {"annotations": exported, "seconds": round(time.perf_counter() - started, 2)}
        started = time.perf_counter()
        result = syncer.reconcile()
        seconds = time.perf_counter() - started
        assert result.upserted == len(labeled) and result.quarantined == 0, result.as_dict()
        figures["reconcile_first"] = {"annotations": result.upserted, "seconds": round(seconds, 2),
                                      "annotations_per_s": round(result.upserted / seconds, 1)}
        started = time.perf_counter()
        again = syncer.reconcile()
        seconds = time.perf_counter() - started
        figures["reconcile_no_change"] = {"annotations": again.unchanged, "seconds": round(seconds, 2),
                                          "annotations_per_s": round(again.unchanged / seconds, 1)}
        log(f"reconcile: {figures['reconcile_first']} / no change: {figures['reconcile_no_change']}")

        # Webhook-style jobs through a real worker: each fetches its annotation + task from the API.
        stack.start_worker(beat=False, concurrency=1, loglevel="WARNING",
                           extra_args=("--pool", "prefork", "--without-gossip", "--without-mingle"),
                           extra_env={"SENSE7_RETRAIN_EVERY": "0", "SENSE7_PREANNOTATE_AFTER_PROMOTE": "0"})
        from celery import Celery

        celery = Celery("bench", broker=redis_url, backend=redis_url)
        ids = sorted(rt.store.annotation_versions())[:args.jobs]
        started = time.perf_counter()
        pending = [celery.send_task("sense7.sync_annotation", args=(i,)) for i in ids]
        outcomes = [p.get(timeout=600) for p in pending]
        seconds = time.perf_counter() - started
        assert all(o["unchanged"] == 1 for o in outcomes)
        figures["sync_annotation_jobs"] = {"jobs": len(ids), "seconds": round(seconds, 2),
                                           "jobs_per_s": round(len(ids) / seconds, 1), "worker_concurrency": 1}
        log(f"single-annotation jobs: {figures['sync_annotation_jobs']}")

        # -- 2. retrain ----------------------------------------------------------------------------------
        from sense7.tasks.training import run_retrain

        started = time.perf_counter()
        outcome = run_retrain(rt, redis_url, "benchmark")
        seconds = time.perf_counter() - started
        assert outcome["status"] == "promoted", outcome
        metrics = outcome["metrics"]
        figures["retrain"] = {"seconds": round(seconds, 1), "train_bundle_seconds": metrics["train_seconds"],
                              "train_items": metrics["n_train_items"],
                              "holdout_items": metrics["holdout"]["n_items"],
                              "holdout_macro": metrics["holdout"]["macro"],
                              "baseline_majority_macro": metrics["baseline_majority"]["macro"]}
        log(f"retrain: {figures['retrain']}")

        # -- 3. preannotate vs Label Studio -> /predict ---------------------------------------------------
        extra = make_conversations([r["rater_id"] for r in raters], per_rater=max(1, args.unlabeled // (args.raters * turns)),
                                   turns=turns, seed=7, prefix="u")
        rt.store.upsert_conversations(extra)
        unlabeled = [t for conv in extra for t in rating_tasks(conv)][:args.unlabeled]
        import_tasks(client, rating, unlabeled)
        from sense7.ml_backend.preannotate import Preannotator

        pre = Preannotator(client, rt.serving_model, rating, rt.jobs.preannotate_chunk)
        done = pre.run()
        assert done.pushed == len(unlabeled) and not done.failed, done.as_dict()
        figures["preannotate"] = {"tasks": done.pushed, "seconds": done.seconds,
                                  "tasks_per_s": round(done.pushed / done.seconds, 1),
                                  "chunk": rt.jobs.preannotate_chunk, "phases_s": done.phases}
        log(f"preannotate: {figures['preannotate']}")

        # The same tasks in a second project, predicted by Label Studio calling the ML backend.
        other = client.projects.create(title="bench: retrieve predictions",
                                       label_config=client.projects.get(rating).label_config).id
        import_tasks(client, other, [{"data": t["data"]} for t in unlabeled])
        stack.start_backend()
        connect_backend(client, other, settings)
        started = time.perf_counter()
        client.actions.create(id="retrieve_tasks_predictions", project=other,
                              selected_items={"all": True, "excluded": []})
        predicted = 0
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            tasks = client.tasks.list(project=other, include="id,predictions_model_versions", page_size=1000)
            predicted = sum(1 for t in tasks if t.predictions_model_versions)
            if predicted >= len(unlabeled):
                break
            time.sleep(1)
        seconds = time.perf_counter() - started
        figures["label_studio_retrieve_predictions"] = {"tasks": predicted, "seconds": round(seconds, 1),
                                                        "tasks_per_s": round(predicted / seconds, 1)}
        log(f"Label Studio -> /predict: {figures['label_studio_retrieve_predictions']}")
    emit(figures, args.out)

if __name__ == "__main__":
    main()
