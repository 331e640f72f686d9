"""`sense7 demo` and `sense7 down`: the main job, from nothing to a learning, pre-annotated project.

The demo runs the real stack on this machine (no Docker): Label Studio, a private Redis, the ML backend
under gunicorn and a Celery worker with beat. A synthetic study is split in two: the *pilot* half's
ratings train the first model (as an earlier study would), the *live* half becomes Label Studio tasks.
Simulated raters then rate part of the live tasks on the rater page, each through their private link
over HTTP; the worker delivers their submissions to Label Studio as each rater's annotations, and the
webhooks drive sync -> retrain -> a new promoted version -> refreshed pre-annotations.

`--crowd N` runs a crowd study instead of the private-link raters (sense7.crowd): the same stack and served
model, a study whose pool is the synthetic live half, and N simulated participants (sense7.crowd.simulate)
entering through the study URL at a compressed pace; it ends with the crowd status lines and the gain curve.

Every phase is idempotent, so re-running the demo reuses what exists. Everything it starts is recorded
under SENSE7_HOME/run, and `sense7 down` (or Ctrl-C during the demo) stops exactly that.
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import contextmanager
from pathlib import Path

import typer

from sense7.cli._common import console, err_console, fail, resolve_taxonomy, settings
from sense7.files import csv_text, write_private
from sense7.labelstudio import client as ls_client
from sense7.processes import ProcessError
from sense7.settings import Settings
from sense7.stack import LEFTOVERS, Stack, worker_process
from sense7.synthetic import synth
from sense7.tasks import names

LIVE_FRACTION = 0.5      # of the synthetic conversations become Label Studio tasks; the rest is the pilot
LABEL_FRACTION = 0.35    # of each rater's live tasks the simulated annotators label


class Phases:
    """Times each phase and shows it, so a slow step is visible and the wall time can be recorded."""

    def __init__(self):
        self.timings: list[tuple[str, float]] = []

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        with err_console.status(f"{name} ..."):
            yield
        elapsed = time.perf_counter() - start
        self.timings.append((name, elapsed))
        err_console.print(f"[green]done[/] {name} ({elapsed:.1f} s)", highlight=False)

    def table(self) -> str:
        total = sum(t for _, t in self.timings)
        rows = [f"| {name} | {t:.1f} |" for name, t in self.timings]
        return "\n".join(["| phase | seconds |", "| --- | --- |", *rows, f"| **total** | **{total:.1f}** |"])


def _worker_log(cfg: Settings) -> Path:
    return worker_process(cfg.home).log_file


def _settles(condition, seconds: float):
    """`condition()`'s first truthy value within `seconds`, else None (no error)."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value or None
        time.sleep(0.5)


def _wait(condition, what: str, timeout: float = 180.0):
    """`_settles`, but giving up is an error that names what was waited for, the queues and the log."""
    from sense7.tasks.waiting import describe_state

    value = _settles(condition, timeout)
    if value is None:
        raise fail(f"gave up after {timeout:.0f} s waiting for {what}; {describe_state()}; "
                   f"read {_worker_log(settings())}")
    return value


def _run_job(name: str, what: str, timeout: float, **kwargs) -> dict:
    """Run one job on the worker and wait for it; giving up names the job, the queues and the log."""
    from sense7.tasks.celery_app import get_app
    from sense7.tasks.waiting import wait_for_job

    result = get_app().send_task(name, kwargs=kwargs)
    return wait_for_job(result, f"{what} ({name})", timeout, str(_worker_log(settings())))


def demo(
    conversations: Path = typer.Option(None, help="your own conversations (native JSONL) instead of synthetic ones"),
    raters: Path = typer.Option(None, help="your own raters CSV (with --conversations)"),
    n_conversations: int = typer.Option(80, "--n-conversations", help="size of the synthetic study"),
    n_raters: int = typer.Option(6, "--n-raters", help="raters in the synthetic study"),
    seed: int = typer.Option(7, help="seed of the synthetic study"),
    copy_probability: float = typer.Option(0.3, min=0.0, max=1.0, help="how often a simulated rater keeps a "
                                           "shown pre-fill (the anchoring the study then measures)"),
    crowd: int = typer.Option(0, "--crowd", min=0, help="run a crowd study instead: this many simulated "
                              "participants (consent, check, questionnaire, rating; a few declining, screened "
                              "out or abandoning) at a compressed pace"),
) -> None:
    """The main job: a running, learning, pre-annotated SENSE-7 project, then where to look.

    Starts Label Studio, Redis, the ML backend and a Celery worker; creates the projects; trains the first
    model on the pilot's ratings; imports a batch, pre-annotated by it in the same requests, and rater
    traits; simulates annotators, which drives sync, retrain and fresh pre-annotations; writes the personalized-vs-generic report. Re-running reuses what exists."""
    cfg = settings()
    from sense7.model.options import served_params

    try:
        served_params(cfg)  # a bad SENSE7_MODEL_* option: one error line before anything starts
    except ValueError as exc:
        raise fail(str(exc), 2)
    stack = Stack(cfg)  # what this run started is stopped again on Ctrl-C or failure
    try:
        if crowd:
            _run_crowd_demo(cfg, crowd, n_conversations, n_raters, seed, stack)
        else:
            _run_demo(cfg, conversations, raters, n_conversations, n_raters, seed, stack, copy_probability)
    except (KeyboardInterrupt, Exception) as exc:
        stack.stop()
        if isinstance(exc, KeyboardInterrupt):
            err_console.print("interrupted: stopped what this run had started")
            raise typer.Exit(130)
        if isinstance(exc, (typer.Exit, SystemExit)):
            raise
        from sense7.tasks.waiting import JobWaitTimeout

        raise fail(str(exc) if isinstance(exc, JobWaitTimeout) else f"{type(exc).__name__}: {exc}")


@dataclasses.dataclass
class StudyData:
    """What the demo rates: the conversations, the raters' traits, and (synthetic study) the ratings with
    their split into the pilot (trains the first model) and the live half (becomes tasks)."""

    conversations: Path
    raters: Path | None
    ratings_path: Path | None
    batch: list
    traits: list
    ratings: object  # the ratings frame, None for the user's own conversations
    live_ids: set

    @property
    def live(self) -> list:
        return [c for c in self.batch if c.conversation_id in self.live_ids]

    @property
    def rater_ids(self) -> list[str]:
        return sorted({c.rater_id for c in self.batch})


def _label_studio_and_projects(cfg: Settings, tax, stack: Stack, phases: Phases):
    """The demo's first phases: Label Studio, Redis (this process sends jobs to the worker's broker too),
    and the rating and profile projects. Returns (client, rating project id, profile project id)."""
    with phases.phase(f"Label Studio on {cfg.ls_url}"):
        stack.start_label_studio()
    with phases.phase("Redis (broker)"):
        stack.start_redis()
    client = ls_client.connect(cfg)
    with phases.phase("rating and profile projects"):
        rating_id, profile_id = ls_client.ensure_projects(client, cfg, tax)
    return client, rating_id, profile_id


def _start_study(cfg, stack, data_phase: str, conversations, raters, n_conversations, n_raters, seed) -> tuple:
    """What both demos begin with: Label Studio and its projects, the study's data in the store, and the
    first model from the pilot ratings (before any task exists: tasks arrive pre-annotated).
    -> (phases, taxonomy, client, rating project id, profile project id, store, study, registry, version)."""
    from sense7.store.database import Store
    from sense7.model.registry import ModelRegistry

    phases, tax = Phases(), resolve_taxonomy(cfg=cfg)
    client, rating_id, profile_id = _label_studio_and_projects(cfg, tax, stack, phases)
    store = Store(cfg.store_url)
    with phases.phase(data_phase):
        study = _study_data(cfg, store, tax, conversations, raters, n_conversations, n_raters, seed)
    registry = ModelRegistry.from_settings(cfg, store)
    with phases.phase("first model (pilot ratings)"):
        first_version = _first_model(cfg, store, registry, tax)
    return phases, tax, client, rating_id, profile_id, store, study, registry, first_version


def _run_demo(cfg, conversations, raters, n_conversations, n_raters, seed, stack, copy_probability=0.3) -> None:
    from sense7.ml_backend.model import build_model

    phases, tax, client, rating_id, profile_id, store, study, registry, first_version = _start_study(
        cfg, stack, "study data", conversations, raters, n_conversations, n_raters, seed)
    # New tasks carry the served version's pre-annotations in the same bulk request that creates them.
    predict = build_model(cfg).import_predictor(client.projects.get(rating_id).label_config)
    with phases.phase(f"import {len(study.live)} conversations as tasks with {first_version} pre-annotations"):
        result = _import_tasks(cfg, client, store, tax, study, rating_id, profile_id, predict, seed)
    with phases.phase(f"ML backend on {stack.backend.url}"):
        _serve_backend(stack, client, store, tax, rating_id, profile_id)
    with phases.phase("Celery worker and beat"):
        _start_worker(stack)
    with phases.phase(f"rater page on {stack.rater_page.url} and private links"):
        links = _open_rater_page(stack, store, study.rater_ids)
    # A check, normally pushing nothing: tasks the import could not predict, or from an older demo run.
    with phases.phase(f"pre-annotations of {first_version}: none missing"):
        _check_preannotations(first_version)

    study_result = None
    if study.ratings is not None:
        with phases.phase("simulated raters rate on the rater page (their private links, over HTTP)"):
            labelled = _simulate_raters(study, links, tax, copy_probability, seed)
        with phases.phase(f"sync {labelled} annotations -> retrain -> new version"):
            new_version = _sync_and_retrain(stack, store, registry, first_version, labelled)
        with phases.phase(f"refreshed pre-annotations ({new_version})"):
            _run_job(names.PREANNOTATE, "the refreshed pre-annotations", 300)
        with phases.phase("the study's anchoring, live accuracy and rater quality"):
            study_result = _study_summary(cfg, store, tax)

    report = cfg.home / "report.html"
    if study.ratings_path is not None:
        with phases.phase("personalized vs generic report"):
            _write_report(study.conversations, study.ratings_path, study.raters, report)
    timings = cfg.home / "demo-timings.md"
    timings.write_text(phases.table() + "\n")
    _print_where_to_look(cfg, registry, rating_id, result, links, study_result, report, timings)


def _study_data(cfg: Settings, store, tax, conversations, raters, n_conversations, n_raters, seed) -> StudyData:
    """The synthetic study (or the user's files) read, its raters and conversations in the store, and the
    pilot half's ratings imported as an earlier study's."""
    from sense7.readers.formats import read_conversations, read_raters, read_ratings
    from sense7.readers.intake import admit

    data_dir = cfg.home / "demo-data"
    if conversations is None:
        synth.write(synth.generate(n_conversations, n_raters, seed, taxonomy=tax), data_dir)
        conversations, raters, ratings_path = (data_dir / "conversations.jsonl", data_dir / "raters.csv",
                                               data_dir / "ratings.csv")
    else:
        ratings_path = None
    # Scrubbed as every batch is (the crowd pool drawn from it then matches the store); a re-run with other
    # data replaces the demo's texts, as it always did.
    batch = admit(read_conversations(conversations, taxonomy=tax), store, replace=True).conversations
    traits = read_raters(raters, tax) if raters else []
    store.upsert_raters(traits)
    store.upsert_conversations(batch)
    ratings = read_ratings(ratings_path, tax) if ratings_path else None
    ids = sorted({c.conversation_id for c in batch})
    live_ids = set(ids[: max(1, int(len(ids) * LIVE_FRACTION))]) if ratings is not None else set(ids)
    if ratings is not None:  # the pilot half: ratings from an earlier study, never Label Studio tasks
        store.import_ratings(ratings[~ratings.conversation_id.isin(live_ids)])
    return StudyData(conversations, raters, ratings_path, batch, traits, ratings, live_ids)


def _first_model(cfg: Settings, store, registry, tax) -> str:
    """The served version: the pilot's model (with the served model's options, as the retrain job fits it),
    trained unless one is already served."""
    from sense7.model.options import served_params
    from sense7.retraining import Retrainer

    if registry.current() is None:
        Retrainer(store, registry, tax, personalized_params=served_params(cfg)).run("demo: pilot ratings")
    first_version = registry.current()
    if first_version is None:
        raise fail("no model could be trained from the pilot ratings")
    return first_version


def _import_tasks(cfg: Settings, client, store, tax, study: StudyData, rating_id: int, profile_id: int,
                  predict, seed: int):
    """The live half as rating tasks (pre-annotated), and each rater's questionnaire task."""
    from sense7.labelstudio.importer import import_conversations, import_profile_tasks

    # The study's pre-fill policy (default randomized) with the demo's seed, so a re-run draws the same arms.
    design = dataclasses.replace(cfg.study, seed=cfg.study.seed or f"demo-{seed}")
    result = import_conversations(client, rating_id, study.live, store, predict=predict, design=design, taxonomy=tax)
    import_profile_tasks(client, profile_id, study.rater_ids)
    from sense7.tasks.embedding import request_embedding

    request_embedding(cfg, store, [c.conversation_id for c in study.live])  # (a no-op with n-grams only)
    return result


def _serve_backend(stack: Stack, client, store, tax, rating_id: int, profile_id: int) -> None:
    """The ML backend, connected to the rating project, and Label Studio's webhooks pointed at it."""
    from sense7.labelstudio.protocol import connect_backend, webhook_headers
    from sense7.labelstudio.label_sync import LabelSync

    cfg = stack.cfg
    stack.start_backend()
    connect_backend(client, rating_id, cfg)
    LabelSync(client, store, tax, rating_id, profile_id).ensure_webhooks(f"{cfg.backend_url}/webhook",
                                                                        webhook_headers(cfg))


def _start_worker(stack: Stack) -> None:
    try:
        stack.start_worker()
    except ProcessError as exc:
        raise fail(str(exc))


def _open_rater_page(stack: Stack, store, rater_ids: list[str]) -> dict[str, str]:
    """The rater page, a fresh private link per rater, and their queues copied from Label Studio."""
    from sense7.tasks.delivery import refresh_queues
    from sense7.tasks.runtime import Runtime

    stack.start_rater_page()
    links = _demo_links(stack.cfg, store, rater_ids)
    refresh_queues(Runtime(stack.cfg), sorted(links))  # one pass over Label Studio, not one per rater
    return links


def _check_preannotations(first_version: str) -> None:
    pending = _run_job(names.PREANNOTATE, "the pre-annotation check", 300)["pending"]
    if pending:
        err_console.print(f"{pending} task(s) lacked a {first_version} prediction: pushed now", highlight=False)


def _simulate_raters(study: StudyData, links: dict[str, str], tax, copy_probability: float, seed: int) -> int:
    """The simulated raters rate part of their live tasks through their links; how many they rated."""
    from sense7.rater_page.simulate import rate_through_page

    answers = {row["rater_id"]: row.get("traits") or {} for row in study.traits}
    live_ratings = study.ratings[study.ratings.conversation_id.isin(study.live_ids)]
    behaviours = _planted_habits(sorted(links), copy_probability)
    return rate_through_page(links, live_ratings, answers, tax, LABEL_FRACTION, behaviours=behaviours,
                             default=behaviours["honest"], seed=seed)


def _sync_and_retrain(stack: Stack, store, registry, first_version: str, labelled: int) -> str:
    """Wait until every answer is in Label Studio and in the store, and for a version newer than the
    first (retraining now if no retrain was triggered); the served version."""
    from sense7.store.rater_page_tables import Outbox

    _run_job(names.RECONCILE, "the reconciliation with Label Studio", 300)
    outbox = Outbox(store)
    _wait(lambda: outbox.counts()["undelivered"] == 0, "the rater page's submissions to reach Label Studio", 900)
    # Label Studio sends each webhook once, with a 1 s timeout: under load one can be lost, and the
    # reconciliation beat would find it minutes later. Once every answer is in Label Studio and the
    # store still lacks some after a short while, reconcile now.
    if not _settles(lambda: store.counts()["annotations"] >= labelled, 20):
        _run_job(names.RECONCILE, "the reconciliation with Label Studio", 600)
    _wait(lambda: store.counts()["annotations"] >= labelled, "the rater page's submissions to reach the store", 600)
    if registry.current() == first_version:
        done = _run_job(names.RETRAIN, "the retrain", 600, reason="demo: new annotations")
        if done.get("status") == "skipped":  # a retrain the new ratings triggered holds the lock
            import redis

            from sense7.tasks.training import LOCK_NAME

            lock = redis.Redis.from_url(stack.redis_url)
            _wait(lambda: not lock.exists(LOCK_NAME), "the triggered retrain to finish", 600)
    return registry.current()


def _print_where_to_look(cfg: Settings, registry, rating_id: int, result, links: dict[str, str],
                         study_result: dict | None, report: Path, timings: Path) -> None:
    versions = ", ".join(f"{v.name}{' (serving)' if v.current else ''}" for v in registry.list_versions())
    console.print()
    console.print(f"[bold]Label Studio:[/] {cfg.ls_url}/projects/{rating_id}  "
                  f"({result.tasks_in_batch} tasks, {result.created} new in this run)", highlight=False)
    console.print(f"[bold]Login:[/] {cfg.ls_admin_email}  password: in {cfg.home / 'secrets' / 'ls_password'}",
                  highlight=False)
    console.print(f"[bold]Model versions:[/] {versions}", highlight=False)
    if links:
        rater_id, link = next(iter(sorted(links.items())))
        console.print(f"[bold]Rater page:[/] {link}  (rater {rater_id}'s private link; every rater's in "
                      f"{cfg.home / 'links.csv'})", highlight=False)
    for line in serving_lines(registry.list_versions()):
        console.print(line, highlight=False)
    if study_result is not None:
        _print_study(study_result, cfg.home / "study.json")
        for line in gain_lines(study_result.get("live_gain")):
            console.print(line, highlight=False)
    if report.exists():
        console.print(f"[bold]Report:[/] {report}", highlight=False)
    console.print(f"Phase timings in {timings}. Stop everything with `sense7 down`.", highlight=False)


def serving_lines(versions: list) -> list[str]:
    """Which version serves and, for each newer version the promotion gate kept out, the two held-out
    scores that decided it (sense7.retraining: macro Spearman of the candidate vs the served)."""
    from sense7.retraining import gate_scores

    serving = next((v for v in versions if v.current), None)
    if serving is None:
        return ["[bold]Serving:[/] no version (none was promoted)"]
    candidate, served = gate_scores(serving.metrics)
    how = (f" (promoted: held-out macro Spearman {candidate:.3f} vs {served:.3f} of the version it replaced)"
           if candidate is not None and served is not None else "")
    lines = [f"[bold]Serving:[/] {serving.name}{how}"]
    for version in versions:
        if version.created_at <= serving.created_at or (version.metrics or {}).get("promoted", True):
            continue
        candidate, served = gate_scores(version.metrics)
        if candidate is None or served is None:
            continue
        against = ((version.metrics or {}).get("served_on_holdout") or {}).get("version") or serving.name
        lines.append(f"[bold]Kept out:[/] {version.name} by the promotion gate: held-out macro Spearman "
                     f"{candidate:.3f} < {served:.3f} of {against}")
    return lines


def gain_lines(gain: dict | None) -> list[str]:
    """The gain curve of live pre-fills (sense7.research.live_gain, from the study analysis) in a few lines:
    MAE on hidden-arm ratings of the live, static and generic predictions by the rater's own earlier ratings."""
    if not gain or not gain.get("bins"):
        return ["[bold]Live pre-fills:[/] no hidden-arm rating with a live prediction yet"]

    def ci(block: dict) -> str:
        lo, hi = block.get("ci") or (None, None)
        return f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""

    def num(value) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = ["[bold]Live pre-fills:[/] MAE on hidden-arm ratings by the rater's own earlier ratings "
             "(live = served version + the rater's answers so far; static = served version; 95% CI over raters)"]
    for b in gain["bins"]:
        mae = b["mae"]
        lines.append(f"  {b['own_ratings']:>5} earlier: live {num(mae['live']['value'])}{ci(mae['live'])}  "
                     f"static {num(mae['static']['value'])}  generic {num(mae['generic']['value'])}  "
                     f"({b['n']} ratings, {b['n_raters']} raters)")
    return lines


def _planted_habits(rater_ids: list[str], copy_probability: float) -> dict:
    """The demo's simulated raters: honest ones (8-40 s a turn, keeping a shown pre-fill with
    `copy_probability`), one rushing (1-2 s a turn) and one straight-lining (3 on everything): the study's
    quality checks must flag exactly those two."""
    from sense7.rater_page.simulate import RaterBehaviour

    habits = {"honest": RaterBehaviour(copy_probability=copy_probability)}
    if len(rater_ids) >= 4:
        habits[rater_ids[0]] = RaterBehaviour(seconds=(1.0, 2.0), copy_probability=copy_probability)
        habits[rater_ids[1]] = RaterBehaviour(straight_line=3)
    return habits


def _study_summary(cfg: Settings, store, tax) -> dict:
    from sense7.research.study_analysis import analyze_study

    result = analyze_study(store, tax, cfg.quality, n_boot=200)
    write_private(cfg.home / "study.json", json.dumps(result, indent=1, allow_nan=False))
    return result


def _print_study(result: dict, path: Path) -> None:
    anchoring = ((result.get("anchoring") or {}).get("controls") or {}).get("__all__") or {}
    copy = anchoring.get("copy_rate") or {}
    if copy.get("value") is not None:
        lo, hi = copy.get("ci") or (None, None)
        ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
        console.print(f"[bold]Anchoring:[/] raters kept a shown pre-fill {copy['value']:.0%} of the time{ci} "
                      f"(arms: {result['arms']})", highlight=False)
    flagged = result["quality"]["flagged"]
    raters = result["quality"]["raters"]
    console.print("[bold]Rater quality:[/] " + ("; ".join(
        f"{r}: {', '.join(f['flag'] for f in raters[r]['flags'])}" for r in flagged) or "no rater flagged")
        + f"  (details in {path})", highlight=False)


def _demo_links(cfg: Settings, store, rater_ids: list[str]) -> dict[str, str]:
    """A fresh private link per simulated rater (only hashes are stored, so the demo makes new ones each
    run), written to SENSE7_HOME/links.csv (0600)."""
    from sense7.store.rater_page_tables import LinkBook

    book, base = LinkBook(store), cfg.rater_page.public_url
    links = {r: f"{base}/r/{book.issue(r, rotate=True)}" for r in rater_ids}
    write_private(cfg.home / "links.csv", csv_text([["rater_id", "url"], *links.items()]))
    return links


def _write_report(conversations: Path, ratings: Path, raters: Path | None, out: Path) -> None:
    from sense7.readers.formats import load_native
    from sense7.research.evaluation import evaluate
    from sense7.research.report import write_report

    tax = resolve_taxonomy()
    data = load_native(conversations, ratings, raters, taxonomy=tax)
    results = evaluate(data, splits=("known_rater", "cold_start"), n_folds=3, seed=0, n_boot=200,
                       dataset="sense7 demo (synthetic)", taxonomy=tax)
    write_report(results, out)


def down() -> None:
    """Stop everything `sense7 demo` started: rater page, Celery worker, ML backend, private Redis, Label Studio,
    and any other process of the home (what a killed worker left running)."""
    for name, was_running in Stack(settings()).down().items():
        console.print(f"{name}: {'stopped' if was_running else 'none' if name == LEFTOVERS else 'was not running'}")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
    app.command("down")(down)


# -- `sense7 demo --crowd N`: a crowd study with simulated participants ----------------------------------

CROWD_STUDY = "demo-crowd"
CROWD_PACE = {"think": (0.1, 0.4), "consent_read": (0.2, 0.6), "check_answer": (0.5, 1.5)}  # (s) compressed
CROWD_CODES = {"completion": "DEMODONE", "no_consent": "DEMONOCONS", "screen_out": "DEMOSCREEN"}


def _run_crowd_demo(cfg: Settings, n: int, n_conversations: int, n_raters: int, seed: int, stack: Stack) -> None:
    """The stack, a served model trained on a synthetic pilot, and a crowd study whose pool is the
    synthetic live half; N simulated participants go through it on the rater page; then the study's status
    and the live pre-fills' gain curve."""
    phases, tax, client, rating_id, profile_id, store, study, _, _ = _start_study(
        cfg, stack, "study data (synthetic pilot and pool)", None, None, n_conversations, n_raters, seed)
    with phases.phase(f"ML backend on {stack.backend.url}"):
        _serve_backend(stack, client, store, tax, rating_id, profile_id)
    with phases.phase("Celery worker and beat"):
        _start_worker(stack)
    with phases.phase(f"rater page on {stack.rater_page.url}"):
        stack.start_rater_page()
    with phases.phase(f"crowd study: {n} simulated participants through {stack.rater_page.url}/s/{CROWD_STUDY}"):
        result = run_crowd_study(cfg, store, tax, stack.rater_page.url, n, study.live, seed)
    timings = cfg.home / "demo-timings.md"
    timings.write_text(phases.table() + "\n")
    console.print()
    for line in crowd_lines(result):
        console.print(line, highlight=False)
    console.print(f"[bold]Label Studio:[/] {cfg.ls_url}/projects/{rating_id}", highlight=False)
    console.print(f"Phase timings in {timings}. Stop everything with `sense7 down`.", highlight=False)


def run_crowd_study(cfg: Settings, store, tax, page_url: str, n: int, pool: list, seed: int,
                    settle: float = 600.0) -> dict:
    """Install and open the demo's crowd study, run `n` simulated participants (sense7.crowd.simulate: one
    of each ending at least when n >= 4) at a compressed pace, end the abandoners' leases (their minute,
    compressed: at once, when everyone else is done) and clear their given-back tasks, wait until every
    answer is in Label Studio and the store, and return the study's status row, the participants' tally
    and the live pre-fills' gain curve."""
    import random
    from datetime import datetime, timedelta, timezone

    from sense7.crowd.lifecycle import expire_leases, install_study, status
    from sense7.crowd.participants import Participants, Studies
    from sense7.crowd.simulate import Pace, mix, run_participants, write_study
    from sense7.store.rater_page_tables import Outbox
    from sense7.research.study_analysis import analyze_study
    from sense7.tasks.crowd_jobs import clear_released_tasks
    from sense7.tasks.runtime import Runtime

    rng = random.Random(seed)
    # A re-run adds N more participants to the same study: the cap counts the earlier runs' seats too.
    earlier = Studies(store).get(CROWD_STUDY)
    seats = Participants(store, earlier[0]).seated() if earlier else 0
    study_path = write_study(cfg.home / "crowd-demo", pool, study_id=CROWD_STUDY, participants=seats + n, k=3, n=2,
                             lease_minutes=1, codes=CROWD_CODES)
    study, _ = install_study(store, study_path, tax)
    Studies(store).set_open(study.study_id, True)
    kinds = mix(n, at_least_one=True, rng=rng)
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(1 / 0.3)  # about three arrivals a second: a burst
        arrivals.append(t)
    levels = [rng.choice("234") for _ in range(n)]  # each participant's own leniency
    forms = [{**{c: level for c in tax.controls}, tax.expectation_key: tax.expectation_values[0]} for level in levels]
    profile = {f.key: str(f.choices[0] if f.type == "choice" else f.min) for f in tax.profile_fields}
    # Platform ids unique per run: a re-run of the demo is new participants, not the same ones returning.
    stamp = f"{int(time.time()):08x}"
    tally = run_participants(page_url, study, kinds, arrivals, Pace(**CROWD_PACE), forms, profile, seed=seed,
                             pids=[f"{stamp}{i:016x}" for i in range(n)])
    expired = expire_leases(store, datetime.now(timezone.utc) + timedelta(minutes=study.lease_minutes + 1))
    cleared = clear_released_tasks(Runtime(cfg))
    outbox = Outbox(store)
    _wait(lambda: outbox.counts()["undelivered"] == 0, "the participants' answers to reach Label Studio", settle)
    delivered = {row["task_id"] for row in outbox.delivered() if row["kind"] == "rating"}
    if not _settles(lambda: _stored(store) >= delivered, 20):  # a webhook lost under load: reconcile now
        _run_job(names.RECONCILE, "the reconciliation with Label Studio", settle)
    _wait(lambda: _stored(store) >= delivered, "the participants' answers to reach the store", settle)
    row = next(r for r in status(store) if r["study"] == study.study_id)
    gain = analyze_study(store, tax, cfg.quality, n_boot=200).get("live_gain")
    return {"status": row, "tally": tally, "kinds": {k: kinds.count(k) for k in set(kinds)},
            "expired": expired.participants, "tasks_cleared": cleared, "live_gain": gain,
            "participants": Participants(store, study).counts()}


def _stored(store) -> set[int]:
    from sqlalchemy import select

    from sense7.store.tables import annotations

    with store.engine.connect() as conn:
        return {r.task_id for r in conn.execute(select(annotations.c.task_id))}


def crowd_lines(result: dict) -> list[str]:
    """The crowd demo's final lines: the study's status (as `sense7 status` prints it), the participants'
    endings and timings, and the gain curve."""
    from sense7.cli.crowd import status_lines

    tally = result["tally"]
    first = sorted(tally.first_turn)
    p99 = first[min(len(first) - 1, int(0.99 * len(first)))] if first else None
    lines = [f"[bold]Crowd:[/] {line}" for line in status_lines([result["status"]])]
    lines.append(f"[bold]Participants:[/] {len(tally.submitted)} turns rated; endings seen by the participants: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(tally.outcomes.items()))
                 + f"; {result['expired']} lease(s) ended, {result['tasks_cleared']} unrated task(s) of given-back "
                 f"slots deleted from Label Studio"
                 + (f"; entry -> first turn p99 {p99:.2f} s (server time and the wait on 'preparing')" if p99 else "")
                 + (f"; {len(tally.errors)} error(s), first: {tally.errors[0]}" if tally.errors else ""))
    return lines + gain_lines(result.get("live_gain"))
