"""Benchmark the rater page (issue 14) against the real stack on this machine: Label Studio (SQLite), a
private Redis, the ML backend receiving webhooks, a Celery worker (concurrency 2) and the rater page
(gunicorn), the demo's topology.

N simulated raters at once (default 200), each with their own private link and session, arriving at a random
moment of the first think-time window: open the link (which copies their queue from Label Studio), then
per turn: wait a think time (uniform in --think seconds, as a person reads and rates), submit the
answer, receive the next page. Measured: page time (GET of a task page), submit acknowledgement (the POST
until the page says saved), and for every submission the time until Label Studio has it (the outbox's
delivered time) and until sense7's store has it (polled every 100 ms). Then the same raters, turns and
pacing through Label Studio's own API (create the annotation, fetch the next task) for comparison.

    .venv/bin/python scripts/bench_rater_page.py [--raters 200] [--turns 3] [--think 30 90] [--out f.json]
    .venv/bin/python scripts/bench_rater_page.py --live      # what live pre-fills add to a page (issue 25)
    .venv/bin/python scripts/bench_rater_page.py --half-open 16 20   # /healthz with held connections (issue 37)

--live: the rater page is run twice with the same raters and pacing, first with no model version (no
pre-fill at all), then with a version trained on a synthetic study (sense7.synthetic.synth; the bench's raters are
new to it) promoted, so every page after a rater's answers carries a live pre-fill (sense7.rater_page.live_prefills,
recorded before the page is sent). Each pass answers one of the rater's two conversations; the Label Studio
API comparison is skipped (it would annotate the second one). Reported: both passes' figures and
`live_added_page_ms` (page p50 / p99 of the live pass minus the first's) and the live predictions recorded.

--half-open N [N ...]: only the rater page (its production size, 2 workers x 8 threads) and its Redis, no
Label Studio. /healthz is asked --rate times a second for --seconds, each on a new connection (as a health
check does), first idle, then for each N while N connections that sent part of a header line and then
nothing are held (benchkit.HeldConnections: one the server closes after its read timeout is replaced at
once). Reported: /healthz p50 / p99 / max and errors for each, p99 over idle p99 (goal: <= 2), and how many
held connections the server closed. Before issue 37 (stock gthread), 16 held connections held every thread.

Prints one JSON document (also written to --out). Timings are wall-clock on whatever else the machine runs.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from datetime import timezone

import httpx

from benchkit import (HeldConnections, StoreWatch, argument_parser, emit, fresh_home, label_studio_and_broker,
                      logger, promote_synthetic_version, summary)

HIDDEN = re.compile(r'name="(csrf_token|revision|rendered_at)" value="([^"]*)"')
ACTION = re.compile(r'<form method="post" action="(/task/\d+)"')


log = logger("bench_rater_page")


class Tally:
    def __init__(self):
        self.page, self.ack, self.errors, self.open = [], [], [], []
        self.prefilled = 0  # task pages that came with a pre-fill
        self.submitted: dict[int, float] = {}  # task id -> wall time the POST was acknowledged


async def page_rater(link: str, turns: int, think: tuple[float, float], tally: Tally, rng: random.Random,
                     level: int) -> None:
    base = link.split("/r/", 1)[0]
    async with httpx.AsyncClient(timeout=60.0, follow_redirects=True) as http:
        try:
            await asyncio.sleep(rng.uniform(0, think[1]))  # raters arrive over the first minute or so
            started = time.perf_counter()
            page = await http.get(link)  # opening the link copies the rater's queue from Label Studio
            tally.open.append(time.perf_counter() - started)
            for _ in range(turns):
                action = ACTION.search(page.text)
                if page.status_code != 200 or action is None:
                    raise RuntimeError(f"no task page (HTTP {page.status_code}, {page.url})")
                await asyncio.sleep(rng.uniform(*think))
                form = dict(HIDDEN.findall(page.text))
                form.update(FORM_VALUES[level])
                started = time.perf_counter()
                saved = await http.post(base + action.group(1), data=form, follow_redirects=False)
                tally.ack.append(time.perf_counter() - started)
                if saved.status_code != 303:
                    raise RuntimeError(f"submit answered HTTP {saved.status_code}")
                tally.submitted[int(action.group(1).rsplit("/", 1)[1])] = time.time()
                started = time.perf_counter()
                page = await http.get(base + saved.headers["location"])
                tally.page.append(time.perf_counter() - started)
                tally.prefilled += 'id="prefill-note"' in page.text
        except Exception as exc:
            tally.errors.append(f"{type(exc).__name__}: {exc}")


async def api_rater(ls_url: str, token: str, project: int, tasks: list[int], user: int, result: list[dict],
                    think: tuple[float, float], tally: Tally, rng: random.Random) -> None:
    headers = {"Authorization": f"Token {token}"}
    async with httpx.AsyncClient(base_url=ls_url, headers=headers, timeout=120.0) as http:
        try:
            await asyncio.sleep(rng.uniform(0, think[1]))
            started = time.perf_counter()
            await http.get(f"/api/tasks/{tasks[0]}")
            tally.page.append(time.perf_counter() - started)
            for i, task in enumerate(tasks):
                await asyncio.sleep(rng.uniform(*think))
                started = time.perf_counter()
                made = await http.post(f"/api/tasks/{task}/annotations/", json={"result": result, "completed_by": user})
                tally.ack.append(time.perf_counter() - started)
                made.raise_for_status()
                tally.submitted[task] = time.time()
                if i + 1 < len(tasks):
                    started = time.perf_counter()
                    (await http.get(f"/api/tasks/{tasks[i + 1]}")).raise_for_status()
                    tally.page.append(time.perf_counter() - started)
        except Exception as exc:
            tally.errors.append(f"{type(exc).__name__}: {exc}")


FORM_VALUES: dict[int, dict] = {}


def page_pass(ids: list[str], links: dict[str, str], args, tax, rng: random.Random, store, watch) -> dict:
    """Every rater at once through the rater page (`args.turns` answers each); the figures of the pass."""
    from sense7.store.rater_page_tables import Outbox

    tally = Tally()
    started = time.time()

    async def run_page():
        await asyncio.gather(*[page_rater(links[r], args.turns, tuple(args.think), tally, random.Random(rng.random()),
                                          1 + i % tax.levels) for i, r in enumerate(ids)])

    asyncio.run(run_page())
    submitted = dict(tally.submitted)
    log(f"rater page: {len(submitted)} submitted, {len(tally.errors)} errors; waiting for delivery")
    deadline = time.time() + 600
    outbox = Outbox(store)
    while time.time() < deadline and (outbox.counts()["undelivered"] or not set(submitted) <= set(watch.seen)):
        time.sleep(0.5)
    delivered = {row["task_id"]: row["delivered_at"].replace(tzinfo=timezone.utc).timestamp()
                 for row in outbox.delivered()}
    figures = {
        "submissions": len(submitted), "errors": len(tally.errors), "first_errors": tally.errors[:3],
        "seconds": round(time.time() - started, 1), "pages_prefilled": tally.prefilled,
        "open_link": summary(tally.open), "page": summary(tally.page), "submit_ack": summary(tally.ack),
        "submit_to_label_studio": summary([delivered[t] - s for t, s in submitted.items() if t in delivered]),
        "submit_to_store": summary([watch.seen[t] - s for t, s in submitted.items() if t in watch.seen]),
        "lost": len([t for t in submitted if t not in watch.seen or t not in delivered])}
    log(f"rater page: {figures}")
    return figures


def healthz_times(url: str, seconds: float, rate: float) -> tuple[list[float], list[str]]:
    """/healthz `rate` times a second for `seconds`, each on a new connection (http.client: an httpx client
    per request would time its own set-up): (durations, errors)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    times, errors = [], []
    started = time.perf_counter()
    for i in range(int(seconds * rate)):
        time.sleep(max(started + i / rate - time.perf_counter(), 0))
        asked = time.perf_counter()
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30.0)
        try:
            connection.request("GET", "/healthz")
            answer = connection.getresponse()
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"HTTP {answer.status}")
            times.append(time.perf_counter() - asked)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()
    return times, errors


def half_open(args) -> dict:
    """/healthz idle, then while N partial-header connections are held, for each N of --half-open."""
    cfg = fresh_home("bench-page-held-")
    from sense7.stack import Stack

    page = cfg.rater_page
    figures: dict = {"machine": f"{os.cpu_count()} cores", "rater_page": f"gunicorn {page.workers} workers x "
                     f"{page.threads} threads", "read_timeout_s": page.read_timeout, "seconds": args.seconds,
                     "rate_per_s": args.rate}
    with Stack(cfg) as stack:
        stack.start_redis()
        stack.start_rater_page()
        url = stack.rater_page.url
        httpx.get(f"{url}/healthz", timeout=30.0)
        times, errors = healthz_times(url, args.seconds, args.rate)
        figures["idle"] = {**summary(times), "errors": len(errors)}
        log(f"idle: {figures['idle']}")
        for n in args.half_open:
            held = HeldConnections(stack.rater_page.host, stack.rater_page.port, n)
            held.start()
            held.ready.wait(30)
            times, errors = healthz_times(url, args.seconds, args.rate)
            held.stop()
            run = {**summary(times), "errors": len(errors), "first_errors": errors[:3],
                   "held_closed_by_server": held.closed_by_server}
            if times and figures["idle"].get("p99_ms"):
                run["p99_over_idle"] = round(run["p99_ms"] / figures["idle"]["p99_ms"], 2)
            figures[f"held_{n}"] = run
            log(f"{n} held: {run}")
    return figures


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--raters", type=int, default=200)
    parser.add_argument("--turns", type=int, default=3, help="turns each rater submits")
    parser.add_argument("--think", type=float, nargs=2, default=[30.0, 90.0], help="think time range (s)")
    parser.add_argument("--skip-api", action="store_true", help="skip the Label Studio API comparison")
    parser.add_argument("--live", action="store_true", help="measure what live pre-fills add to a page")
    parser.add_argument("--half-open", type=int, nargs="+", default=None, metavar="N",
                        help="only /healthz, idle and while N partial-header connections are held")
    parser.add_argument("--seconds", type=float, default=30.0, help="--half-open: seconds of /healthz per run")
    parser.add_argument("--rate", type=float, default=20.0, help="--half-open: /healthz requests a second")
    args = parser.parse_args()
    if args.half_open:
        emit(half_open(args), args.out)
        return
    args.skip_api = args.skip_api or args.live

    cfg = fresh_home("bench-page-", SENSE7_RETRAIN_EVERY="0", SENSE7_PREANNOTATE_AFTER_PROMOTE="0")
    from sense7.labelstudio.label_sync import LabelSync

    from sense7.store.rater_page_tables import LinkBook
    from sense7.synthetic.toy_study import make_conversations, make_raters
    from sense7.labelstudio.importer import import_conversations
    from sense7.labelstudio.protocol import rating_result, webhook_headers
    from sense7.labelstudio.rater_accounts import ensure_accounts
    from sense7.stack import Stack
    from sense7.taxonomy import study_taxonomy

    tax = study_taxonomy(cfg)
    for level in range(1, tax.levels + 1):
        FORM_VALUES[level] = {**{c: str(level) for c in tax.controls},
                              tax.expectation_key: tax.expectation_values[0]}
    figures: dict = {"machine": f"{os.cpu_count()} cores", "raters": args.raters, "turns_each": args.turns,
                     "think_s": args.think, "rater_page": f"gunicorn {cfg.rater_page.workers} workers x "
                     f"{cfg.rater_page.threads} threads", "worker_concurrency": 2}
    with Stack(cfg) as stack:
        client, rating, profile, store = label_studio_and_broker(stack, tax)
        raters = make_raters(args.raters, tax, prefix="bp")
        store.upsert_raters(raters)
        ids = [r["rater_id"] for r in raters]
        # Two conversations per rater: one for the rater page, one for the API comparison.
        convs = make_conversations(ids, per_rater=2, turns=args.turns, prefix="bp")
        import_conversations(client, rating, convs, store, taxonomy=tax)
        accounts = ensure_accounts(client, store, ids)
        stack.start_backend()
        LabelSync(client, store, tax, rating, profile).ensure_webhooks(f"{cfg.backend_url}/webhook",
                                                                      webhook_headers(cfg))
        stack.start_worker(beat=False, extra_args=("--without-gossip", "--without-mingle"))
        stack.start_rater_page({"SENSE7_RATER_PAGE_LINK_LIMIT": "30 per minute"})
        page = stack.rater_page
        book = LinkBook(store)
        links = {r: f"{page.url}/r/{book.issue(r)}" for r in ids}
        from sense7.tasks.delivery import refresh_queues
        from sense7.tasks.runtime import Runtime

        started = time.perf_counter()
        refresh_queues(Runtime(cfg), ids)  # as `sense7 raters invite` does
        figures["copy_queues_s"] = round(time.perf_counter() - started, 1)
        log(f"stack up: {len(ids)} raters, {len(convs)} conversations")

        tasks_by_conv: dict[str, list[int]] = {}
        for task in client.tasks.list(project=rating, include="id,data", page_size=1000):
            tasks_by_conv.setdefault(task.data["conversation_id"], []).append((task.data["turn_index"], task.id))
        by_rater: dict[str, list[list[int]]] = {}
        for conv in convs:
            by_rater.setdefault(conv.rater_id, []).append([t for _, t in sorted(tasks_by_conv[conv.conversation_id])])

        watch = StoreWatch(store)
        watch.start()
        # -- the rater page --------------------------------------------------------------------------------
        rng = random.Random(0)
        figures["rater_page"] = page_pass(ids, links, args, tax, rng, store, watch)
        if args.live:
            version = promote_synthetic_version(cfg, tax)
            log(f"promoted {version} (trained on a synthetic study) for live pre-fills")
            # Each rater-page worker's background thread reads the pointer every 5 s and loads the version
            # (sense7.rater_page.live_prefills); no page waits for it, a page before it shows no live pre-fill.
            time.sleep(6)
            figures["live_version"] = version
            figures["rater_page_live"] = page_pass(ids, links, args, tax, rng, store, watch)
            figures["live_added_page_ms"] = {
                q: round(figures["rater_page_live"]["page"][q] - figures["rater_page"]["page"][q], 1)
                for q in ("p50_ms", "p99_ms") if q in figures["rater_page"]["page"]
                and q in figures["rater_page_live"]["page"]}
            from sense7.store.study_design import LIVE_KIND, StudyRecords

            recorded = StudyRecords(store).predictions_frame()
            figures["live_predictions_recorded"] = int((recorded["kind"] == LIVE_KIND).sum()) if len(recorded) else 0
            log(f"live pre-fills added to a page: {figures['live_added_page_ms']}, "
                f"{figures['live_predictions_recorded']} live predictions recorded")

        # -- the same through Label Studio's API ---------------------------------------------------------------
        if not args.skip_api:
            api = Tally()
            result = rating_result({c: 3 for c in tax.controls}, tax, tax.expectation_values[0])
            started = time.time()

            async def run_api():
                await asyncio.gather(*[api_rater(cfg.ls_url, cfg.ls_token, rating, by_rater[r][1][:args.turns],
                                                 accounts[r], result, tuple(args.think), api,
                                                 random.Random(rng.random())) for r in ids])

            asyncio.run(run_api())
            deadline = time.time() + 600
            while time.time() < deadline and not set(api.submitted) <= set(watch.seen):
                time.sleep(0.5)
            figures["label_studio_api"] = {
                "submissions": len(api.submitted), "errors": len(api.errors), "first_errors": api.errors[:3],
                "seconds": round(time.time() - started, 1),
                "next_task": summary(api.page), "create_annotation": summary(api.ack),
                "create_to_store": summary([watch.seen[t] - s for t, s in api.submitted.items() if t in watch.seen])}
            log(f"Label Studio API: {figures['label_studio_api']}")
        watch.running = False
    emit(figures, args.out)


if __name__ == "__main__":
    main()
