"""Benchmark a crowd study (issue 24) against the real stack on this machine: Label Studio (SQLite), a
private Redis, the ML backend receiving webhooks, a Celery worker with beat (concurrency 2) and the rater
page (gunicorn), the demo's topology.

P simulated participants (default 500) arrive as a Poisson process over --window seconds (default 600), each
with its own Prolific id and browser session: 5% decline the consent, 5% fail the comprehension check twice,
10% abandon midway (their lease then ends and their unfinished conversations go back to the pool), the rest
answer the questionnaire and rate N = 3 conversations (K = 3 raters each) at a human pace (--think, 20-60 s
per turn). Every human wait (arrivals, think times, the lease) is divided by --compress (stated in the
output); the server's own times are never compressed.

Participants read the consent (--consent-read, 5-15 s), answer the comprehension check (--check-answer,
20-40 s per attempt) and the questionnaire (--questionnaire, 40-90 s: 18 questions), divided by
--entry-compress (default: --compress) like every human wait; their tasks are asked for when the check is
passed (an entry at the check holds nothing: issue 37). The questionnaire is served from the store at once
(it needs no Label Studio task yet: RaterQueue.provide) while the worker's round makes the tasks; a
"preparing" page covers whatever of the round is left when it is answered.

Measured: entry -> first turn (from the entry URL to the first task page), reported as
`entry_to_first_turn` = (a) `entry_server` (the server time of the entry pages: entry, consent, check, the
"preparing" requests, the questionnaire) + (b) `preparing_wait` (time spent on "preparing" pages waiting for
the worker, after the check and after the questionnaire; 0 when the pages were there), the participant's own
reading and answering time excluded
(the figure the issue's target is about; before the tasks were asked for at consent it was measured with no
reading time at all, the old "entry -> first turn"; since issue 37 they are asked for when the check is
passed, so `preparing_wait` holds the worker's whole round again), and `entry_to_first_turn_with_reading` (wall time, the
compressed reading included); page (GET of a
task page), submit acknowledged (the POST), submit -> Label Studio (the outbox's delivered time) and ->
store (polled every 100 ms), finish -> next turn (`finish_to_next_turn`: an answer's POST to the next turn's
page, the wait on "preparing" for the next conversation included; the pool's conversations have one turn, so
every answer finishes a conversation and the next is chosen then: issue 41), lost submissions, slots beyond K (must be 0), the pool's coverage spread at the
end, abandoned slots and whether each was taken again, participants turned away (pool full).

Label Studio's side: its write rate during the run (annotations delivered by the outbox, from their delivered
times; tasks made by the preparation jobs, from its own task counts every 5 s), then its ceiling on the same
server after the load (`--ceiling-imports` imports of 4 tasks by 2 clients, `--ceiling-annotations`
annotations by 4 clients, in a probe project), and the busiest 10 s over that ceiling. `--ls-database-url`
(an empty PostgreSQL database), `--ls-workers N` (gunicorn, SENSE7_LS_WORKERS) choose how Label Studio runs;
`--ceiling-only` measures the ceiling alone.

    .venv/bin/python scripts/bench_crowd.py [--participants 500] [--window 600] [--compress 10] [--out f.json]
    .venv/bin/python scripts/bench_crowd.py --participants 500 --window 600 --compress 1 --lease-minutes 5

A smoke run: --participants 20 --window 60 --compress 20. Prints one JSON document (also written to --out).

`--topology compose` runs instead docker-compose.yml's topology on this machine (`sense7.deployment.Deployment`,
the one list of services the multi-home test runs): a PostgreSQL server of the benchmark's own with sense7's store
and Label Studio's database, Label Studio under gunicorn (--ls-workers, default 4), the private Redis over TCP, the
ML backend, --workers workers (each `sense7 worker --no-beat --concurrency 1`, every queue), one `sense7 beat`, two
rater pages behind HAProxy with the shipped TLS config: participants enter at the proxy's https address; Label
Studio, the ML backend, the workers and beat at the deployment's background priority (`nice`, as compose's
`cpu_shares`: sense7.deployment.SERVICE_NICE, LABEL_STUDIO_NICE). The page's time is also reported in parts
(`page_server`: the app's own time from its Server-Timing header; `client_loop_lag`: the clients' own delay). Either
topology reports `cpu`: each service's CPU seconds (user + system of its process tree, sampled when the
participants start arriving and after the last answer reached the store), in all, at rest (--idle-seconds before
the first arrival), and per participant and per answer net of the rest; the benchmark's own process (the
participants' clients) apart.

    .venv/bin/python scripts/bench_crowd.py --topology compose --participants 60 --window 120 --compress 3

`--flood` measures instead whether made-up entries can hold a study hostage (issue 37): --flood-ids made-up
platform ids (500) from --flood-addresses client addresses (50, each under the entry limit; sent as
X-Forwarded-For with SENSE7_TRUSTED_PROXIES=1, as behind the study's reverse proxy) enter and agree within
--flood-window seconds (60, real) against a study of --flood-slots slots (200; K=2, N=2, the cap the
participants those slots hold), and never pass the check; then --real participants (40) arrive at a human pace
(--window and --compress as above) and rate everything. Reported: flood entries holding a slot at any sample
and past their reservation (--check-minutes, 1: must be 0), Label Studio tasks made for unchecked entries
(must be 0), real participants who got slots (must be all), the flood's answers and times.

    .venv/bin/python scripts/bench_crowd.py --flood [--flood-ids 500 --flood-addresses 50 --flood-slots 200 --real 40]
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timezone
from pathlib import Path

from benchkit import (PostgresCluster, StoreWatch, argument_parser, emit, fresh_home, label_studio_and_broker, logger,
                      promote_synthetic_version, summary)

log = logger("bench_crowd")
CODES = {"completion": "DONE", "no_consent": "NOCONS", "screen_out": "SCREEN"}


def slot_figures(store, k: int) -> dict:
    from sqlalchemy import func, select

    from sense7.store.tables import crowd_released, crowd_slots

    with store.engine.connect() as conn:
        per = dict(conn.execute(select(crowd_slots.c.conversation_id, func.count())
                                .group_by(crowd_slots.c.conversation_id)).all())
        released = conn.execute(select(crowd_released.c.conversation_id, crowd_released.c.released_at)).all()
        later = dict(conn.execute(select(crowd_slots.c.conversation_id, func.max(crowd_slots.c.taken_at))
                                  .group_by(crowd_slots.c.conversation_id)).all())
    reused = sum(1 for r in released if r.conversation_id in later and later[r.conversation_id] >= r.released_at)
    left = sorted({r.conversation_id for r in released
                   if not (r.conversation_id in later and later[r.conversation_id] >= r.released_at)})
    return {"over_k": sum(1 for v in per.values() if v > k), "released": len(released),
            "released_then_taken_again": reused, "released_not_taken_again": len(released) - reused,
            "conversations_with_a_slot_not_taken_again": left}


class LabelStudioWatch(threading.Thread):
    """Every `interval` s, the tasks in the study's projects (Label Studio's own count): the rate at which the
    crowd's preparation jobs write tasks into Label Studio during the run."""

    def __init__(self, client, projects, interval: float = 5.0):
        super().__init__(daemon=True)
        self.client, self.projects, self.interval = client, projects, interval
        self.samples: list[tuple[float, int]] = []
        self.running = True

    def run(self) -> None:
        while self.running:
            try:
                self.samples.append((time.time(), sum(self.client.projects.get(p).task_number or 0
                                                      for p in self.projects)))
            except Exception as exc:  # a missed sample is a gap, not a failed run
                log(f"task count: {type(exc).__name__}")
            time.sleep(self.interval)


def event_rates(times, window: float = 10.0) -> dict:
    """Events at the given wall times: count, mean rate over their span, and the busiest `window` seconds."""
    times = sorted(times)
    if len(times) < 2:
        return {"n": len(times)}
    peak, j = 0, 0
    for i, t in enumerate(times):
        while times[j] < t - window:
            j += 1
        peak = max(peak, i - j + 1)
    span = times[-1] - times[0]
    return {"n": len(times), "span_s": round(span, 1), "mean_per_s": round(len(times) / span, 2),
            f"peak_{window:.0f}s_per_s": round(peak / window, 2)}


def count_rates(samples, window: float = 10.0) -> dict:
    """Rates from (wall time, cumulative count) samples: mean over the span in which the count grew, and the
    largest growth over any `window` (or the nearest longer interval between samples)."""
    grew = [i for i in range(1, len(samples)) if samples[i][1] > samples[i - 1][1]]
    if not grew:
        return {"n": 0}
    first, last = grew[0] - 1, grew[-1]
    made = samples[last][1] - samples[first][1]
    span = samples[last][0] - samples[first][0]
    peak = 0.0
    for i in range(len(samples)):
        for j in range(i + 1, len(samples)):
            if samples[j][0] - samples[i][0] >= window:
                peak = max(peak, (samples[j][1] - samples[i][1]) / (samples[j][0] - samples[i][0]))
                break
    return {"n": made, "span_s": round(span, 1), "mean_per_s": round(made / span, 2),
            f"peak_{window:.0f}s_per_s": round(peak, 2)}


def label_studio_ceiling(client, rating_project: int, tax, imports: int, batch: int, importers: int,
                         annotations: int, writers: int) -> dict:
    """Label Studio's write ceiling, measured on the same server: `imports` task imports of `batch` tasks
    (a participant's tasks, as the preparation job imports them) by `importers` clients (the worker's
    concurrency), then `annotations` annotations by `writers` clients (the delivery job's), as fast as they
    go, in a probe project with the rating project's interface and one of its tasks' data (no webhook on it:
    Label Studio's own part of a write)."""
    from sense7.labelstudio.protocol import rating_result

    project = client.projects.get(rating_project)
    probe = client.projects.create(title="bench_crowd ceiling probe", label_config=project.label_config).id
    data = next(iter(client.tasks.list(project=rating_project, page_size=1))).data
    task_ids: list[int] = []
    import_seconds: list[float] = []
    errors = [0]

    def import_one(_):
        t0 = time.perf_counter()
        try:
            made = client.projects.import_tasks(probe, request=[{"data": data}] * batch, return_task_ids=True)
        except Exception:
            errors[0] += 1
            return
        import_seconds.append(time.perf_counter() - t0)
        task_ids.extend(made.task_ids or [])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=importers) as pool:
        list(pool.map(import_one, range(imports)))
    import_wall = time.perf_counter() - t0
    result = rating_result({c: 3 for c in tax.controls}, tax, tax.expectation_values[0])
    write_seconds: list[float] = []

    def annotate(i):
        t0 = time.perf_counter()
        try:
            client.annotations.create(task_ids[i % len(task_ids)], result=result)
        except Exception:
            errors[0] += 1
            return
        write_seconds.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(annotate, range(annotations if task_ids else 0)))
    write_wall = time.perf_counter() - t0
    return {"imports": len(import_seconds), "tasks_per_import": batch, "importers": importers,
            "imports_per_s": round(len(import_seconds) / import_wall, 2),
            "tasks_per_s": round(len(task_ids) / import_wall, 2), "import": summary(import_seconds),
            "annotations": len(write_seconds), "writers": writers,
            "annotations_per_s": round(len(write_seconds) / write_wall, 2) if write_seconds else None,
            "annotation": summary(write_seconds), "errors": errors[0]}


def start_crowd_services(stack, topology: str, workers: int, root: Path, study_id: str):
    """The services after Label Studio and Redis: the demo's (through the stack: the ML backend, one worker with
    beat, concurrency 2, one rater page) or docker-compose's (`sense7.deployment.Deployment`, each instance in a
    home of its own under `root`, HAProxy in front of the pages). (the URL participants enter at, {service: root
    pids} whose process trees the CPU meter reads, the deployment to stop or None)."""
    from urllib.parse import urlparse

    from sense7.crowd.participants import study_secret
    from sense7.settings import RATER_PAGE_SECRET, crowd_secret_variable
    from sense7.tasks.redis_local import local_redis_dir

    cfg = stack.cfg
    ls_and_redis = {"Label Studio": [stack.label_studio.process.pid()],
                    "Redis": [int((local_redis_dir(cfg) / "pid").read_text())]}
    if topology == "demo":
        stack.start_backend()
        stack.start_worker(beat=True, extra_args=("--without-gossip", "--without-mingle"))
        stack.start_rater_page()
        return stack.rater_page.url, {**ls_and_redis, "ML backend": [stack.backend.pid()],
                                      "worker (with beat)": [stack.worker.pid()],
                                      "rater page": [stack.rater_page.process.pid()]}, None
    from sense7.deployment import Deployment

    shared = {"SENSE7_STORE_URL": cfg.store_url, "SENSE7_REDIS_URL": stack.redis_url, "SENSE7_LS_URL": cfg.ls_url,
              "SENSE7_LS_TOKEN": cfg.ls_token, "SENSE7_BACKEND_URL": cfg.backend_url,
              "SENSE7_BACKEND_USER": cfg.backend_user, "SENSE7_BACKEND_PASSWORD": cfg.backend_password,
              "SENSE7_WEBHOOK_SECRET": cfg.webhook_secret,
              RATER_PAGE_SECRET: cfg.secret("rater_page_secret", RATER_PAGE_SECRET),
              crowd_secret_variable(study_id): study_secret(cfg, study_id),
              # the benchmark's own settings (fresh_home's), which every host of the deployment gets alike
              **{key: os.environ[key] for key in ("SENSE7_RETRAIN_EVERY", "SENSE7_PREANNOTATE_AFTER_PROMOTE",
                                                  "SENSE7_RATER_PAGE_LINK_LIMIT")}}
    deployment = Deployment(root, shared, backend_bind=urlparse(cfg.backend_url).netloc, workers=workers)
    deployment.start()
    base = deployment.start_proxy()
    # The participants' clients (httpx) trust the proxy's self-signed certificate, and only it.
    os.environ["SSL_CERT_FILE"] = str(deployment.proxy_certificate)
    pids = deployment.pids()
    return base, {**ls_and_redis, "ML backend": [pids["ml-backend"]],
                  "workers": [pid for name, pid in pids.items() if name.startswith("worker-")],
                  "beat": [pids["beat"]], "rater pages": [pids["rater-page"], pids["rater-page-2"]],
                  "HAProxy": [pids["haproxy"]]}, deployment


def cpu_figures(spent: dict[str, float], idle: dict[str, float], own_seconds: float, participants: int,
                answers: int, seconds: float) -> dict:
    """Each service's CPU seconds over the run: in all, as cores (a share of one core over the run), at rest
    (`idle`: cores measured before the first arrival, with the benchmark's own watchers polling), and per
    participant and per answer net of that rest (what more participants add)."""
    def row(value: float, rest: float) -> dict:
        net = max(0.0, value - rest * seconds)
        return {"cpu_s": round(value, 1), "cores": round(value / seconds, 3), "idle_cores": round(rest, 3),
                "cpu_s_per_participant": round(net / participants, 4),
                "cpu_s_per_answer": round(net / answers, 4) if answers else None}

    rows = {name: row(value, idle[name]) for name, value in spent.items()}
    rows["benchmark (participants' clients)"] = row(own_seconds, 0.0)
    return {"seconds": round(seconds, 1), "participants": participants, "answers": answers, "per_service": rows,
            "services_total": row(sum(spent.values()), sum(idle.values()))}


class SlotWatch(threading.Thread):
    """Every `interval` s: how many of the given raters hold a slot or a seat (the flood's must never)."""

    def __init__(self, store, raters: set[str], interval: float = 0.5):
        super().__init__(daemon=True)
        self.store, self.raters, self.interval = store, raters, interval
        self.max_slots = self.max_seats = self.samples = 0
        self.running = True

    def run(self) -> None:
        from sqlalchemy import select

        from sense7.store.tables import crowd_participants, crowd_slots

        while self.running:
            with self.store.engine.connect() as conn:
                slots = {r.rater_id for r in conn.execute(select(crowd_slots.c.rater_id))}
                seats = {r.rater_id for r in conn.execute(select(crowd_participants.c.rater_id).where(
                    crowd_participants.c.seat.is_not(None)))}
            self.max_slots = max(self.max_slots, len(slots & self.raters))
            self.max_seats = max(self.max_seats, len(seats & self.raters))
            self.samples += 1
            time.sleep(self.interval)


def flood_entries(base: str, study_id: str, pids: list[str], addresses: int, window: float, seed: int) -> dict:
    """Made-up platform ids entering and agreeing (never answering the check), spread over `window` s from
    `addresses` client addresses (X-Forwarded-For); the answers and the server's times."""
    import asyncio

    import httpx

    from sense7.crowd.simulate import CSRF

    rng = random.Random(seed)
    starts = sorted(rng.uniform(0, window) for _ in pids)
    statuses: dict[str, int] = {}
    seconds: list[float] = []

    async def one(i: int, http) -> None:
        await asyncio.sleep(starts[i])
        headers = {"X-Forwarded-For": f"198.51.{i % addresses // 250}.{i % addresses % 250 + 1}"}
        t0 = time.perf_counter()
        try:
            page = await http.get(f"/s/{study_id}?PROLIFIC_PID={pids[i]}&STUDY_ID=flood&SESSION_ID=f{i}",
                                  headers=headers)
            found = CSRF.search(page.text) if page.status_code == 200 else None
            if found is None:
                statuses[f"entry {page.status_code}"] = statuses.get(f"entry {page.status_code}", 0) + 1
                return
            agreed = await http.post(f"/s/{study_id}/consent", headers=headers,
                                     data={"csrf_token": found.group(1), "consent": "agree"})
            key = "agreed (at the check)" if agreed.status_code == 303 else f"consent {agreed.status_code}"
            statuses[key] = statuses.get(key, 0) + 1
        except Exception as exc:  # a refused connection is a figure, not a failed run
            statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1
            return
        seconds.append(time.perf_counter() - t0)

    async def run() -> None:
        async def browser(i: int) -> None:
            async with httpx.AsyncClient(base_url=base, timeout=120.0) as http:  # its own cookies
                await one(i, http)
        await asyncio.gather(*[browser(i) for i in range(len(pids))])

    asyncio.run(run())
    return {"answers": statuses, "entry_and_consent": summary(seconds)}


def flood_main(args, cfg) -> None:
    """The --flood benchmark (the module's docstring)."""
    from sqlalchemy import select

    from sense7.crowd.lifecycle import assignments_of, install_study
    from sense7.crowd.participants import Participants, Studies, pseudonymous_id, study_secret
    from sense7.crowd.simulate import Pace, run_participants, write_study
    from sense7.store.tables import crowd_participants, crowd_slots
    from sense7.synthetic.toy_study import make_conversations
    from sense7.stack import Stack
    from sense7.taxonomy import study_taxonomy

    tax = study_taxonomy(cfg)
    k, n = 2, 2
    pool = max(1, args.flood_slots // k)
    cap = max(1, args.flood_slots // n)
    figures: dict = {"machine": f"{os.cpu_count()} cores", "mode": "flood", "flood_ids": args.flood_ids,
                     "flood_addresses": args.flood_addresses, "flood_window_s": args.flood_window,
                     "slots": pool * k, "k": k, "n": n, "cap": cap, "check_minutes": args.check_minutes,
                     "real_participants": args.real, "window_s": args.window, "compress": args.compress,
                     "note": "the flood in real time; the real participants' waits divided by `compress`"}
    rng = random.Random(args.seed)
    with Stack(cfg) as stack:
        client, rating, profile, store = label_studio_and_broker(stack, tax)
        conversations = make_conversations(["pool"], per_rater=pool, turns=1, prefix="flood")
        study, _ = install_study(store, write_study(Path(cfg.home) / "study", conversations, study_id="bench",
                                                    participants=cap, k=k, n=n, codes=CODES,
                                                    lease_minutes=max(1, args.lease_minutes),
                                                    check_minutes=args.check_minutes), tax)
        Studies(store).set_open("bench", True)
        stack.start_worker(beat=True, extra_args=("--without-gossip", "--without-mingle"))
        stack.start_rater_page()
        base = stack.rater_page.url
        secret = study_secret(cfg, "bench")
        flood = [f"{0xF1000D:06x}{i:018x}" for i in range(args.flood_ids)]
        flood_raters = {pseudonymous_id(secret, "bench", pid) for pid in flood}
        watch = SlotWatch(store, flood_raters)
        watch.start()
        log(f"stack up: {args.flood_ids} made-up ids from {args.flood_addresses} addresses over {args.flood_window:.0f} s")
        started = time.time()
        figures["flood"] = flood_entries(base, "bench", flood, args.flood_addresses, args.flood_window, args.seed)
        figures["flood"]["seconds"] = round(time.time() - started, 1)
        log(f"flood done: {figures['flood']['answers']}; real participants now")
        real = [f"{0x4EA1:06x}{i:018x}" for i in range(args.real)]
        arrivals, t = [], 0.0
        for _ in real:
            t += rng.expovariate(len(real) / args.window)
            arrivals.append(t / args.compress)
        think = (args.think[0] / args.compress, args.think[1] / args.compress)
        pace = Pace(think, (args.consent_read[0] / args.compress, args.consent_read[1] / args.compress),
                    (args.check_answer[0] / args.compress, args.check_answer[1] / args.compress),
                    (args.questionnaire[0] / args.compress, args.questionnaire[1] / args.compress))
        form = {**{c: "3" for c in tax.controls}, tax.expectation_key: tax.expectation_values[0]}
        profile_values = {f.key: str(f.choices[0] if f.type == "choice" else f.min) for f in tax.profile_fields}
        tally = run_participants(base, study, ["complete"] * len(real), arrivals, pace, [form] * len(real),
                                 profile_values, seed=args.seed, pids=real,
                                 addresses=[f"192.0.2.{i % 250 + 1}" for i in range(len(real))])
        real_raters = {pseudonymous_id(secret, "bench", pid) for pid in real}
        with store.engine.connect() as conn:
            holders = {r.rater_id for r in conn.execute(select(crowd_slots.c.rater_id))}
        participants = Participants(store, study)
        states = {r: getattr(participants.get(r), "state", None) for r in real_raters}
        completed = {r for r, state in states.items() if state == "completed"}
        # The flood's reservations end (beat's pass every minute): every flood entry abandoned, none holding.
        deadline = time.time() + 60 * (args.check_minutes + 3)
        while time.time() < deadline and participants.counts()["checking"]:
            time.sleep(2.0)
        watch.running = False
        with store.engine.connect() as conn:
            still = {r.rater_id for r in conn.execute(select(crowd_participants.c.rater_id).where(
                crowd_participants.c.state == "checking"))}
            held_now = {r.rater_id for r in conn.execute(select(crowd_slots.c.rater_id))}
        flood_tasks = sum(1 for project in (rating, profile)
                          for task in client.tasks.list(project=project, include="id,data", page_size=1000)
                          if (task.data or {}).get("rater_id") in flood_raters)
        figures.update({
            "flood_holding_a_slot_at_any_sample": watch.max_slots, "flood_holding_a_seat_at_any_sample": watch.max_seats,
            "samples": watch.samples,
            "flood_holding_a_slot_past_their_reservation": len(held_now & flood_raters),
            "flood_still_at_the_check_at_the_end": len(still & flood_raters),
            "label_studio_tasks_for_unchecked_entries": flood_tasks,
            "real_participants_with_slots": len(real_raters & (holders | completed)),
            "real_participants_completed": len(completed), "real_outcomes": tally.outcomes,
            "real_errors": tally.errors[:3], "real_entry_to_first_turn": summary(tally.first_turn),
            "real_preparing_wait": summary(tally.preparing),
            "participants_by_state": participants.counts(), "coverage": {
                key: value for key, value in assignments_of(store, study).coverage().items() if key != "per_conversation"}})
    emit(figures, args.out)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--participants", type=int, default=500)
    parser.add_argument("--window", type=float, default=600.0, help="arrivals over this many (human) seconds")
    parser.add_argument("--think", type=float, nargs=2, default=[20.0, 60.0], help="seconds per turn (human)")
    parser.add_argument("--compress", type=float, default=10.0, help="human waits divided by this")
    parser.add_argument("--consent-read", type=float, nargs=2, default=[5.0, 15.0],
                        help="seconds reading the consent (human)")
    parser.add_argument("--check-answer", type=float, nargs=2, default=[20.0, 40.0],
                        help="seconds answering the comprehension check, per attempt (human)")
    parser.add_argument("--questionnaire", type=float, nargs=2, default=[40.0, 90.0],
                        help="seconds answering the questionnaire (human; its 18 questions at 2-5 s each)")
    parser.add_argument("--entry-compress", type=float, default=None,
                        help="the consent's and check's human times divided by this (default: --compress)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--pool", type=int, default=None, help="default: 85%% of the slots the completers need")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lease-minutes", type=int, default=1,
                        help="the study's lease (real minutes, not compressed; at least 1)")
    parser.add_argument("--topology", choices=("demo", "compose"), default="demo",
                        help="demo: the demo's stack; compose: docker-compose.yml's (the docstring)")
    parser.add_argument("--idle-seconds", type=float, default=20.0,
                        help="the services' CPU at rest, measured for this long before the first arrival")
    parser.add_argument("--workers", type=int, default=2,
                        help="compose topology: worker processes (each --concurrency 1, every queue)")
    parser.add_argument("--ls-database-url", default=None,
                        help="Label Studio on this (empty) PostgreSQL database (default: SQLite, as the demo)")
    parser.add_argument("--ls-workers", type=int, default=None,
                        help="Label Studio under gunicorn with this many worker processes (0: its own server; "
                             "default 0, compose topology 4)")
    parser.add_argument("--ls-threads", type=int, default=1, help="threads per gunicorn worker of Label Studio")
    parser.add_argument("--ceiling-imports", type=int, default=60,
                        help="ceiling probe after the load: imports of 4 tasks by 2 clients (0: no probe)")
    parser.add_argument("--ceiling-annotations", type=int, default=300,
                        help="ceiling probe after the load: annotations by 4 clients")
    parser.add_argument("--ceiling-only", action="store_true",
                        help="start Label Studio (as the --ls-* options say) and run the ceiling probe only")
    parser.add_argument("--flood", action="store_true", help="the flood benchmark (the docstring's last part)")
    parser.add_argument("--flood-ids", type=int, default=500, help="made-up platform ids that enter and agree")
    parser.add_argument("--flood-addresses", type=int, default=50, help="client addresses the flood comes from")
    parser.add_argument("--flood-window", type=float, default=60.0, help="(real) seconds the flood's entries span")
    parser.add_argument("--flood-slots", type=int, default=200, help="the study's slots (K=2, N=2)")
    parser.add_argument("--real", type=int, default=40, help="real participants after the flood, at a human pace")
    parser.add_argument("--check-minutes", type=int, default=1, help="the study's reservation at the check")
    args = parser.parse_args()
    if args.flood:
        cfg = fresh_home("bench-crowd-flood-", SENSE7_RETRAIN_EVERY="0", SENSE7_PREANNOTATE_AFTER_PROMOTE="0",
                         SENSE7_TRUSTED_PROXIES="1")
        flood_main(args, cfg)
        return

    if args.ls_workers is None:
        args.ls_workers = 4 if args.topology == "compose" else 0
    ls_env = {"SENSE7_LS_WORKERS": str(args.ls_workers), "SENSE7_LS_THREADS": str(args.ls_threads)}
    if args.ls_database_url:
        ls_env["SENSE7_LS_DATABASE_URL"] = args.ls_database_url
    postgres = None
    if args.topology == "compose":  # sense7's store and Label Studio's database on a server of the run's own
        postgres = PostgresCluster().start()
        args.ls_database_url = ls_env["SENSE7_LS_DATABASE_URL"] = postgres.create_database("label_studio")
        ls_env["SENSE7_STORE_URL"] = postgres.create_database("sense7")
        from sense7.deployment import LABEL_STUDIO_NICE

        ls_env["SENSE7_LS_NICE"] = str(LABEL_STUDIO_NICE)  # background work, as compose's cpu_shares make it
    try:
        crowd_main(args, ls_env, postgres)
    finally:
        if postgres is not None:
            postgres.stop()


def crowd_main(args, ls_env: dict, postgres) -> None:
    """The crowd benchmark (the module's docstring), on the topology `args.topology` names."""
    cfg = fresh_home("bench-crowd-", SENSE7_RETRAIN_EVERY="0", SENSE7_PREANNOTATE_AFTER_PROMOTE="0",
                     SENSE7_RATER_PAGE_LINK_LIMIT="100000 per minute", **ls_env)
    from sense7.crowd.lifecycle import assignments_of, install_study
    from sense7.crowd.simulate import Pace, run_participants, write_study
    from sense7.synthetic.toy_study import make_conversations
    from sense7.crowd.participants import Participants, Studies
    from sense7.store.rater_page_tables import Outbox
    from sense7.labelstudio.label_sync import LabelSync
    from sense7.labelstudio.protocol import webhook_headers
    from sense7.processes import CpuMeter
    from sense7.research.study_analysis import analyze_study
    from sense7.stack import Stack
    from sense7.taxonomy import study_taxonomy

    tax = study_taxonomy(cfg)
    rng = random.Random(args.seed)
    p = args.participants
    pool = args.pool or max(1, math.ceil(0.85 * p * 0.8 * args.n / args.k))
    # The shortest lease the study file takes is 1 minute; compressed runs see it at that length.
    figures: dict = {"machine": f"{os.cpu_count()} cores", "participants": p, "window_s": args.window,
                     "think_s": args.think, "compress": args.compress, "k": args.k, "n": args.n, "pool": pool,
                     "lease_minutes": args.lease_minutes, "topology": args.topology,
                     "note": "arrivals and think times divided by `compress`; server times real",
                     "label_studio": {"database": "PostgreSQL" if args.ls_database_url else "SQLite",
                                      "server": (f"gunicorn, {args.ls_workers} workers x {args.ls_threads} threads"
                                                 if args.ls_workers else "label-studio start (one process)")}}
    kinds = ["decline"] * round(0.05 * p) + ["screen"] * round(0.05 * p) + ["abandon"] * round(0.10 * p)
    kinds += ["complete"] * (p - len(kinds))
    rng.shuffle(kinds)
    arrivals, t = [], 0.0
    for _ in range(p):
        t += rng.expovariate(p / args.window)
        arrivals.append(t / args.compress)
    think = (args.think[0] / args.compress, args.think[1] / args.compress)
    entry_compress = args.entry_compress or args.compress
    consent_read = (args.consent_read[0] / entry_compress, args.consent_read[1] / entry_compress)
    check_answer = (args.check_answer[0] / entry_compress, args.check_answer[1] / entry_compress)
    questionnaire = (args.questionnaire[0] / entry_compress, args.questionnaire[1] / entry_compress)
    figures.update({"consent_read_s": args.consent_read, "check_answer_s": args.check_answer,
                    "questionnaire_s": args.questionnaire, "entry_compress": entry_compress})
    # Each completer rates every control at their own level (2, 3 or 4): a leniency the served version does not
    # know, which the live pre-fills (issue 25) should pick up from their first answers.
    levels = [rng.choice("234") for _ in range(p)]
    form_values = [{**{c: level for c in tax.controls}, tax.expectation_key: tax.expectation_values[0]}
                   for level in levels]
    profile_values = {f.key: str(f.choices[0] if f.type == "choice" else f.min) for f in tax.profile_fields}
    version = promote_synthetic_version(cfg, tax)  # served: pre-fills (shown / hidden arms) and live updates
    log(f"promoted {version} (trained on a synthetic study)")
    if args.ceiling_only:
        with Stack(cfg) as stack:
            client, rating, _profile, _store = label_studio_and_broker(stack, tax)
            from sense7.labelstudio.protocol import rating_tasks

            conversation = make_conversations(["probe"], per_rater=1, turns=1, prefix="probe")[0]
            client.projects.import_tasks(rating, request=[{"data": t["data"]} for t in rating_tasks(conversation)])
            log("Label Studio's ceiling probe")
            emit({"machine": figures["machine"], "label_studio": {
                **figures["label_studio"], "ceiling": label_studio_ceiling(
                    client, rating, tax, args.ceiling_imports, 4, 2, args.ceiling_annotations, 4)}}, args.out)
        return
    with Stack(cfg) as stack, contextlib.ExitStack() as services:  # the services stop before the stack
        client, rating, profile, store = label_studio_and_broker(stack, tax)
        conversations = make_conversations(["pool"], per_rater=pool, turns=1, prefix="crowd")
        study, _ = install_study(store, write_study(Path(cfg.home) / "study", conversations, study_id="bench",
                                                    participants=p, k=args.k, n=args.n,
                                                    lease_minutes=max(1, args.lease_minutes), codes=CODES), tax)
        Studies(store).set_open("bench", True)
        LabelSync(client, store, tax, rating, profile).ensure_webhooks(f"{cfg.backend_url}/webhook",
                                                                      webhook_headers(cfg))
        base, metered, deployment = start_crowd_services(stack, args.topology, args.workers,
                                                         Path(cfg.home).parent / "hosts", "bench")
        if postgres is not None:
            metered["PostgreSQL"] = [postgres.pid()]
        if deployment is not None:
            services.callback(deployment.stop)
            from sense7.deployment import SERVICE_NICE

            figures["deployment"] = {"workers": args.workers, "rater_pages": 2, "proxy": "HAProxy, TLS",
                                     "store": "PostgreSQL (the run's own server)",
                                     "nice": {**SERVICE_NICE, "label-studio": cfg.ls_nice}}
        log(f"stack up ({args.topology}): pool {pool}, {p} participants arriving over "
            f"{args.window / args.compress:.0f} s at {base}")
        meter = CpuMeter(metered)
        watch = StoreWatch(store)
        watch.start()
        ls_watch = LabelStudioWatch(client, (rating, profile))
        ls_watch.start()
        meter.start()  # the services at rest, the watchers polling: what a participant's cost is net of
        time.sleep(args.idle_seconds)
        idle = {name: value / args.idle_seconds for name, value in meter.stop().items()}
        started = time.time()
        meter.start()
        own = os.times()
        tally = run_participants(base, study, kinds, arrivals, Pace(think, consent_read, check_answer, questionnaire), form_values,
                                 profile_values, seed=args.seed, pids=[f"{i:024x}" for i in range(p)])
        submitted = dict(tally.submitted)
        log(f"{len(submitted)} submitted, {len(tally.errors)} errors; waiting for delivery and lease expiry")
        deadline = time.time() + 600
        outbox = Outbox(store)
        participants = Participants(store, study)
        while time.time() < deadline and (outbox.counts()["undelivered"] or not set(submitted) <= set(watch.seen)):
            time.sleep(0.5)
        # The CPU the participants cost: up to their last answer in the store, before the idle wait for leases.
        spent, own_seconds = meter.stop(), sum(os.times()[:2]) - sum(own[:2])
        figures["cpu"] = cpu_figures(spent, idle, own_seconds, p, len(submitted), time.time() - started)
        while time.time() < deadline and participants.counts()["rating"]:
            time.sleep(0.5)
        delivered = {row["task_id"]: row["delivered_at"].replace(tzinfo=timezone.utc).timestamp()
                     for row in outbox.delivered()}
        figures.update({
            "seconds": round(time.time() - started, 1), "outcomes": tally.outcomes, "errors": len(tally.errors),
            "first_errors": tally.errors[:3], "submissions": len(submitted),
            "entry_to_first_turn": summary(tally.first_turn), "entry_server": summary(tally.entry_server),
            "preparing_wait": summary(tally.preparing),
            "waited_on_preparing": sum(1 for w in tally.preparing if w > 0),
            "entry_to_first_turn_with_reading": summary(tally.first_turn_with_reading),
            "page": summary(tally.page),
            # the page's parts: the app's own time (Server-Timing, summed over the redirects), the requests
            # a page took, and the clients' event-loop lag (their own delay in every client-side time)
            "page_server": summary(tally.page_server),
            "page_requests": {n: tally.page_requests.count(n) for n in sorted(set(tally.page_requests))},
            "client_loop_lag": summary(tally.loop_lag),
            "finish_to_next_turn": summary(tally.next_turn),
            "waited_on_next_conversation": sum(1 for w in tally.waited_next if w > 0),
            "submit_ack": summary(tally.ack),
            "submit_to_label_studio": summary([delivered[t] - s for t, s in submitted.items() if t in delivered]),
            "submit_to_store": summary([watch.seen[t] - s for t, s in submitted.items() if t in watch.seen]),
            "lost": len([t for t in submitted if t not in watch.seen or t not in delivered]),
            "coverage": assignments_of(store, study).coverage(), "participants_by_state": participants.counts(),
            **slot_figures(store, args.k)})
        watch.running = ls_watch.running = False
        # Label Studio's write rate during the run (annotations delivered by the outbox, tasks made by the
        # preparation jobs), then its ceiling on the same server, measured after the load.
        annotations_rate = event_rates(list(delivered.values()))
        tasks_rate = count_rates(ls_watch.samples)
        figures["label_studio"]["during_run"] = {"annotations_delivered": annotations_rate, "tasks_made": tasks_rate}
        if args.ceiling_imports:
            log("Label Studio's ceiling probe")
            ceiling = label_studio_ceiling(client, rating, tax, args.ceiling_imports, 4, 2,
                                           args.ceiling_annotations, 4)
            figures["label_studio"]["ceiling"] = ceiling
            busiest = {"annotations": (annotations_rate.get("peak_10s_per_s"), ceiling["annotations_per_s"]),
                       "tasks": (tasks_rate.get("peak_10s_per_s"), ceiling["tasks_per_s"])}
            figures["label_studio"]["busiest_10s_over_ceiling"] = {
                name: round(run / top, 2) if run and top else None for name, (run, top) in busiest.items()}
        # The gain curve of the participants' live pre-fills (hidden arm: live vs the served version vs generic).
        figures["live_gain"] = analyze_study(store, tax, n_boot=300)["live_gain"]
    emit(figures, args.out)


if __name__ == "__main__":
    main()
