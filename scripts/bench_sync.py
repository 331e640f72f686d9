"""Benchmark the webhook -> store path (issue 13) in one run against the real stack: Label Studio (SQLite),
a private Redis, the ML backend receiving webhooks (gunicorn) and a Celery worker (concurrency 2, every
queue), the demo's topology. Retraining is switched off (SENSE7_RETRAIN_EVERY=0) so that the figures are
the sync path's own; the paper-scale demo measures everything running together.

1. Label Studio's ceiling: annotations created through its API as fast as N concurrent clients can
   (webhooks on), and the sync's submission-to-store latency under that burst;
2. steady arrivals at 10/s and 25/s, each annotation due at its scheduled time and sent by one of
   --clients concurrent writers (as the rater page's delivery job writes: raters' submissions are
   acknowledged by the page at once and written to Label Studio 4 at a time, so Label Studio is never
   flooded): submission-to-store latency p50/p99 from the scheduled time (when the rater pressed save)
   until the row is in sense7's store (polled every 50 ms), and from Label Studio's acknowledgement;
3. the sync's own throughput: a backlog of annotations created while the worker is stopped (the webhooks
   still note them in Redis), then the worker started: annotations/s into the store;
4. reconciliation of many annotations (default 50,000, imported with their tasks in bulk, each by its
   rater's Label Studio user): a first reconciliation and a no-change one.

    .venv/bin/python scripts/bench_sync.py [--raters 109] [--rate-seconds 60] [--reconcile 50000] [--out f.json]

`--attribution-only N` measures only what crediting one annotation looks up in a store of N raters (no
stack): the whole address map (`raters_by_email`, a batch's way) against the task's own rater (one indexed
query, `sync_annotation`'s way), best of 20 each.

`--sync-jobs-at-users N` measures only the sync job of a new participant's first rating (no worker, no
Redis): Label Studio holds N raters' attribution accounts (made and kept as delivery makes them), then,
--jobs times, one more rater's account is made, it rates one task, and one sync job (a fresh LabelSync
sharing the worker's email cache, as tasks.sync runs it) syncs that annotation: the job's wall-clock
seconds, the users-list requests it made, and Label Studio's CPU seconds over all the jobs.

Prints one JSON document (also written to --out). Timings are wall-clock on whatever else the machine runs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchkit import argument_parser, emit, fresh_home, label_studio_and_broker, logger, toy_annotation

log = logger("bench_sync")


class StorePoller(threading.Thread):
    """Notes the first time each annotation id is seen in the store (polled every `interval` s)."""

    def __init__(self, store, interval: float = 0.05):
        super().__init__(daemon=True)
        self.store, self.interval = store, interval
        self.seen: dict[int, float] = {}
        self.running = True

    def run(self) -> None:
        while self.running:
            now = time.perf_counter()
            for annotation_id in self.store.annotation_versions():
                self.seen.setdefault(annotation_id, now)
            time.sleep(self.interval)

    def wait_for(self, ids, timeout: float = 600) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(i in self.seen for i in ids):
                return True
            time.sleep(0.1)
        return False


def percentiles(values) -> dict:
    values = np.asarray(values, dtype=float)
    return {"n": int(values.size), "p50_s": round(float(np.percentile(values, 50)), 3),
            "p99_s": round(float(np.percentile(values, 99)), 3), "max_s": round(float(values.max()), 3)}


class Submitter:
    """Creates annotations through Label Studio's API as each task's rater, recording send and ack times."""

    def __init__(self, client, users: dict[str, int], taxonomy):
        self.client, self.users, self.taxonomy = client, users, taxonomy
        self.sent: dict[int, float] = {}
        self.acked: dict[int, float] = {}
        self.due: dict[int, float] = {}    # task id -> when it was scheduled (paced phases)
        self.task_of: dict[int, int] = {}  # annotation id -> task id
        self.errors = 0

    def post(self, task, at: float | None = None) -> None:
        from sense7.labelstudio.protocol import rating_result

        if at is not None:
            time.sleep(max(0.0, at - time.perf_counter()))
            self.due[task.id] = at
        levels = {d.key: 1 + (task.id + i) % 5 for i, d in enumerate(self.taxonomy.dimensions)}
        levels[self.taxonomy.overall.key] = 1 + task.id % 5
        sent = time.perf_counter()
        try:
            made = self.client.annotations.create(task.id, result=rating_result(levels, self.taxonomy),
                                                  completed_by=self.users[task.data["rater_id"]])
        except Exception as exc:  # counted, reported: a benchmark run with errors is not a figure
            self.errors += 1
            log(f"annotation on task {task.id} failed: {exc}")
            return
        self.sent[made.id], self.acked[made.id] = sent, time.perf_counter()
        self.task_of[made.id] = task.id

    def burst(self, tasks, clients: int) -> float:
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=clients) as pool:
            list(pool.map(self.post, tasks))
        return time.perf_counter() - started

    def paced(self, tasks, rate: float, clients: int) -> float:
        """Annotation i is due at start + i/rate; `clients` writers send them (late when Label Studio is slower)."""
        start = time.perf_counter() + 0.5
        with ThreadPoolExecutor(max_workers=clients) as pool:
            list(pool.map(lambda item: self.post(item[1], start + item[0] / rate), enumerate(tasks)))
        return time.perf_counter() - start


def latency_figures(sub: Submitter, poller: StorePoller, ids) -> dict:
    return {"send_to_store": percentiles([poller.seen[i] - sub.sent[i] for i in ids]),
            "ack_to_store": percentiles([poller.seen[i] - sub.acked[i] for i in ids]),
            "label_studio_ack": percentiles([sub.acked[i] - sub.sent[i] for i in ids])}


def attribution_lookups(n_raters: int, repeats: int = 20) -> dict:
    """Milliseconds (best of `repeats`) to find one annotation's rater in a store of `n_raters` (half with
    an email): the whole map against the task's own rater."""
    import tempfile

    from sense7.store.database import Store
    from sense7.labelstudio.rater_accounts import raters_by_email

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/store.sqlite")
        store.upsert_raters([{"rater_id": f"r{i:06d}", "email": f"r{i}@example.test" if i % 2 else None}
                             for i in range(n_raters)])
        target = f"r{n_raters // 2:06d}"

        def best(call) -> float:
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                call()
                times.append(time.perf_counter() - started)
            return round(min(times) * 1000, 3)

        return {"raters": n_raters, "whole_map_ms": best(lambda: raters_by_email(store)),
                "own_rater_ms": best(lambda: store.rater_emails(every_rater=True, rater_ids=[target]))}




def sync_jobs_at_users(n_users: int, jobs: int) -> dict:
    """A new participant's first rating synced by one job each, with n_users accounts in Label Studio."""
    from sense7.labelstudio.client import UsersCallLog, import_tasks
    from sense7.labelstudio.label_sync import LabelSync
    from sense7.labelstudio.protocol import rating_tasks
    from sense7.labelstudio.rater_accounts import ensure_accounts
    from sense7.processes import CpuMeter
    from sense7.stack import Stack
    from sense7.synthetic.toy_study import make_conversations, make_raters
    from sense7.taxonomy import study_taxonomy

    cfg = fresh_home("bench-sync-users-")
    tax = study_taxonomy(cfg)
    with Stack(cfg) as stack:
        log("starting Label Studio")
        client, rating, profile, store = label_studio_and_broker(stack, tax)
        crowd = [r["rater_id"] for r in make_raters(n_users + jobs, tax, prefix="u", domain="bench.test")]
        store.add_raters(crowd)  # no own emails: every account at its reserved address, as a crowd's
        started = time.perf_counter()
        ensure_accounts(client, store, crowd[:n_users])
        log(f"{n_users} accounts made in {time.perf_counter() - started:.0f} s")
        arrivals = crowd[n_users:]
        convs = make_conversations(arrivals, per_rater=1, turns=1, prefix="arrive")
        store.upsert_conversations(convs)
        import_tasks(client, rating, [t for conv in convs for t in rating_tasks(conv)])
        task_of = {t.data["rater_id"]: t for t in client.tasks.list(project=rating, include="id,data", page_size=1000)}
        counted, worker_emails = UsersCallLog(client), {}
        LabelSync(counted, store, tax, rating, profile, user_emails=worker_emails).sync_annotation(0)  # warm
        started = time.perf_counter()
        client.users.list()
        list_s = time.perf_counter() - started
        meter = CpuMeter({"Label Studio": [stack.label_studio.process.pid()]})
        seconds, lists = [], 0
        cpu = 0.0
        for rater in arrivals:
            account = ensure_accounts(client, store, [rater])[rater]  # delivery's work, not timed
            task = task_of[rater]
            made = client.annotations.create(task.id, completed_by=account,
                                             result=toy_annotation(task.data["turn"][0]["content"], tax))
            before = counted.calls.count("list")
            meter.start()
            started = time.perf_counter()
            LabelSync(counted, store, tax, rating, profile, user_emails=worker_emails).sync_annotation(made.id)
            seconds.append(time.perf_counter() - started)
            cpu += meter.stop()["Label Studio"]
            lists += counted.calls.count("list") - before
        return {"label_studio_users": n_users, "jobs": jobs, "users_list_requests": lists,
                "job_s": percentiles(seconds), "job_s_total": round(sum(seconds), 2),
                "label_studio_cpu_s_per_job": round(cpu / jobs, 3),
                "one_users_list_s": round(list_s, 3)}


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--raters", type=int, default=109)
    parser.add_argument("--ceiling", type=int, default=1000, help="annotations in the as-fast-as-possible burst")
    parser.add_argument("--clients", type=int, default=4,
                        help="concurrent writers (the rater page's delivery job writes 4 at a time)")
    parser.add_argument("--rates", type=float, nargs="+", default=[5.0, 10.0, 25.0])
    parser.add_argument("--rate-seconds", type=float, default=60.0, help="duration of each steady rate")
    parser.add_argument("--backlog", type=int, default=1500, help="annotations made while the worker is stopped")
    parser.add_argument("--reconcile", type=int, default=50_000, help="annotations imported in bulk, then reconciled")
    parser.add_argument("--ls-database-url", default=None,
                        help="run Label Studio on this PostgreSQL database (default: SQLite, as the demo)")
    parser.add_argument("--attribution-only", type=int, default=0, metavar="N",
                        help="only time the attribution lookups on a store of N raters (no stack)")
    parser.add_argument("--sync-jobs-at-users", type=int, default=0, metavar="N",
                        help="only time the sync job of a new participant's first rating at N Label Studio users")
    parser.add_argument("--jobs", type=int, default=20, help="sync jobs timed with --sync-jobs-at-users")
    args = parser.parse_args()
    if args.sync_jobs_at_users:
        emit(sync_jobs_at_users(args.sync_jobs_at_users, args.jobs), args.out)
        return
    if args.attribution_only:
        print(json.dumps(attribution_lookups(args.attribution_only), indent=2))
        return

    cfg = fresh_home("bench-sync-", SENSE7_RETRAIN_EVERY="0", SENSE7_PREANNOTATE_AFTER_PROMOTE="0",
                     **({"SENSE7_LS_DATABASE_URL": args.ls_database_url} if args.ls_database_url else {}))
    from sense7.labelstudio.label_sync import LabelSync
    from sense7.tasks.sync import backlog

    from sense7.synthetic.toy_study import make_conversations, make_raters
    from sense7.labelstudio.client import import_tasks
    from sense7.labelstudio.protocol import rating_tasks, webhook_headers
    from sense7.labelstudio.rater_accounts import ensure_users
    from sense7.stack import Stack
    from sense7.taxonomy import study_taxonomy

    tax = study_taxonomy(cfg)
    figures: dict = {"machine": f"{os.cpu_count()} cores", "raters": args.raters, "worker_concurrency": 2,
                     "label_studio_database": "PostgreSQL" if args.ls_database_url else "SQLite",
                     "retrain": "off (SENSE7_RETRAIN_EVERY=0)"}
    worker_args = ("--without-gossip", "--without-mingle")
    with Stack(cfg) as stack:
        log("starting Label Studio, Redis, the ML backend (webhooks) and the worker")
        client, rating, profile, store = label_studio_and_broker(stack, tax)
        raters = make_raters(args.raters, tax, prefix="s")
        store.upsert_raters(raters)
        users = ensure_users(client, {r["rater_id"]: r["email"] for r in raters})

        live_needed = args.ceiling + sum(int(r * args.rate_seconds) for r in args.rates) + args.backlog
        turns = 5
        per_rater = -(-live_needed // (args.raters * turns))
        convs = make_conversations(list(users), per_rater=per_rater, turns=turns, prefix="live")
        store.upsert_conversations(convs)
        import_tasks(client, rating, [t for conv in convs for t in rating_tasks(conv)])
        tasks = list(client.tasks.list(project=rating, include="id,data", page_size=1000))
        rng = np.random.default_rng(0)
        rng.shuffle(tasks)  # raters working at once, not one rater's conversation after another
        log(f"{len(tasks)} unlabeled tasks of {args.raters} raters")

        stack.start_backend()
        LabelSync(client, store, tax, rating, profile).ensure_webhooks(f"{cfg.backend_url}/webhook",
                                                                      webhook_headers(cfg))
        stack.start_worker(beat=False, extra_args=worker_args)
        poller = StorePoller(store)
        poller.start()
        sub = Submitter(client, users, tax)
        cursor = 0

        def take(n):
            nonlocal cursor
            chunk = tasks[cursor:cursor + n]
            cursor += n
            return chunk

        # -- 1. Label Studio's ceiling -------------------------------------------------------------------
        before = set(sub.acked)
        seconds = sub.burst(take(args.ceiling), args.clients)
        ids = [i for i in sub.acked if i not in before]
        assert poller.wait_for(ids), "burst annotations did not all reach the store"
        last = max(poller.seen[i] for i in ids) - min(sub.sent[i] for i in ids)
        figures["label_studio_ceiling"] = {
            "annotations": len(ids), "clients": args.clients, "seconds": round(seconds, 1),
            "annotations_per_s": round(len(ids) / seconds, 1),
            "all_in_store_after_s": round(last, 1), "into_store_per_s": round(len(ids) / last, 1),
            **latency_figures(sub, poller, ids)}
        log(f"ceiling: {figures['label_studio_ceiling']}")

        # -- 2. steady rates -----------------------------------------------------------------------------
        for rate in args.rates:
            before = set(sub.acked)
            seconds = sub.paced(take(int(rate * args.rate_seconds)), rate, args.clients)
            ids = [i for i in sub.acked if i not in before]
            assert poller.wait_for(ids), f"annotations at {rate}/s did not all reach the store"
            figures[f"steady_{rate:g}_per_s"] = {
                "annotations": len(ids), "clients": args.clients, "seconds": round(seconds, 1),
                "achieved_per_s": round(len(ids) / seconds, 1),
                "due_to_store": percentiles([poller.seen[i] - sub.due[sub.task_of[i]] for i in ids]),
                **latency_figures(sub, poller, ids)}
            log(f"{rate}/s: {figures[f'steady_{rate:g}_per_s']}")

        # -- 3. the sync's own throughput: a backlog drained by a freshly started worker -----------------
        if args.backlog:
            stack.stop_worker()
            before = set(sub.acked)
            sub.burst(take(args.backlog), args.clients)
            ids = [i for i in sub.acked if i not in before]
            noted = backlog()["pending"]
            started = time.perf_counter()
            stack.start_worker(beat=False, extra_args=worker_args)
            ready = time.perf_counter()
            assert poller.wait_for(ids), "the backlog did not reach the store"
            done = max(poller.seen[i] for i in ids)
            figures["backlog_drain"] = {"annotations": len(ids), "noted_by_webhooks": noted,
                                        "worker_start_s": round(ready - started, 1),
                                        "drain_s": round(done - ready, 2),
                                        "into_store_per_s": round(len(ids) / (done - ready), 1)}
            log(f"backlog: {figures['backlog_drain']}")
        figures["errors"] = sub.errors
        poller.running = False

        # -- 4. reconciliation of many annotations ---------------------------------------------------------
        if args.reconcile:
            per_rater = -(-args.reconcile // (args.raters * turns))
            bulk = make_conversations(list(users), per_rater=per_rater, turns=turns, seed=3, prefix="bulk")
            store.upsert_conversations(bulk)
            annotated = []
            for k, conv in enumerate(bulk):
                for task in rating_tasks(conv):
                    result = toy_annotation(task["data"]["turn"][0]["content"], tax, k % 3 - 1)
                    task["annotations"] = [{"result": result, "completed_by": users[conv.rater_id]}]
                    annotated.append(task)
            annotated = annotated[:args.reconcile]
            stack.stop_worker()  # the reconciliation alone, not racing the bulk import's webhooks
            started = time.perf_counter()
            import_tasks(client, rating, annotated)
            figures_import = round(time.perf_counter() - started, 1)
            syncer = LabelSync(client, store, tax, rating, profile)
            started = time.perf_counter()
            first = syncer.reconcile()
            first_s = time.perf_counter() - started
            started = time.perf_counter()
            again = syncer.reconcile()
            again_s = time.perf_counter() - started
            figures["reconcile"] = {
                "annotations_in_label_studio": first.seen, "bulk_imported": len(annotated),
                "bulk_import_s": figures_import,
                "first": {"upserted": first.upserted, "seconds": round(first_s, 1),
                          "annotations_per_s": round(first.seen / first_s, 1)},
                "no_change": {"unchanged": again.unchanged, "seconds": round(again_s, 1),
                              "annotations_per_s": round(again.seen / again_s, 1)}}
            log(f"reconcile: {figures['reconcile']}")
    emit(figures, args.out)


if __name__ == "__main__":
    main()
