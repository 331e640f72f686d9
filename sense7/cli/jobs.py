"""`sense7 worker`, `sense7 beat`, `sense7 sync`, `sense7 retrain`, `sense7 preannotate`.

`worker` runs the Celery worker with beat (periodic reconciliation and retrain). The other commands run
the same job code in this process, so they work without a worker; `--enqueue` hands them to the worker.
Without SENSE7_REDIS_URL a private redis-server under SENSE7_HOME is started (tasks/README.md).
"""

from __future__ import annotations

import os
import sys
import time

import typer

from sense7.cli._common import console, fail, label_studio_errors, progress, settings
from sense7.tasks import names


def _redis(cfg) -> str:
    from sense7.tasks.redis_local import RedisUnavailable, ensure_redis

    try:
        url = ensure_redis(cfg)
    except RedisUnavailable as exc:
        raise fail(str(exc))
    # This process's jobs app talks to that broker; child processes (the worker) get it in their
    # environment (see `worker`).
    from sense7.tasks.celery_app import configure

    configure(cfg, url)
    return url


def _check_config() -> None:
    """Reject a malformed SENSE7_* setting (a number, the served model's options) before anything is started
    or changed."""
    from sense7.model.options import served_params

    try:
        served_params(settings())
    except ValueError as exc:
        raise fail(str(exc))


def _runtime():
    from sense7.tasks.runtime import Runtime

    return Runtime(settings())


class _SdkErrors:
    """Label Studio's refusals as one clean line (the SDK's own message carries response headers)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        from label_studio_sdk.core.api_error import ApiError

        from sense7.tasks.runtime import describe_error

        if isinstance(exc, ApiError):
            raise fail(describe_error(exc)) from None
        return False


def _worker(cfg):
    from sense7.stack import worker_process

    return worker_process(cfg.home)


def _beat(cfg):
    from sense7.stack import beat_process

    return beat_process(cfg.home)


def _claim(process, what: str) -> None:
    """Refuse a second worker (or beat) for this home, stop what a killed one left running, then write this
    process's pid file: the exec below keeps the pid, so `sense7 down` stops a worker started by hand like
    one the demo started."""
    from sense7.stack import stop_leftovers

    pid = process.pid()
    if pid is not None and pid != os.getpid():
        raise fail(f"a Celery {what} for this home is already running (pid {pid}); `sense7 down` stops it")
    left = stop_leftovers(process)
    if left:
        console.print(f"stopped {len(left)} process(es) a killed Celery {what} of this home left running")
    process.pid_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    process.pid_file.write_text(str(os.getpid()))


def _exec_celery(process, args: list[str], url: str) -> None:
    """Become the Celery process (exec: signals such as Ctrl-C or docker stop go straight to Celery, which
    finishes or re-queues the job), marked as this home's service like every process sense7 starts, so that
    `sense7 down` finds its children even after it was killed."""
    from sense7.processes import service_environment

    sys.stdout.flush()
    os.execve(sys.executable, args, service_environment({**os.environ, "SENSE7_REDIS_URL": url}, process.home,
                                                        process.name))


def _enqueue(name: str, **kwargs) -> None:
    from sense7.tasks.celery_app import get_app

    result = get_app().send_task(name, kwargs=kwargs)
    console.print(f"enqueued {name} (job id {result.id})")


def worker(
    concurrency: int = typer.Option(2, help="Job processes: 2 lets sync keep pace while a retrain (CPU-bound) runs."),
    beat: bool = typer.Option(True, help="Also run the scheduler (reconciliation, scheduled retrain): right for "
                                          "one machine; with several workers use --no-beat and one `sense7 beat`."),
    loglevel: str = typer.Option("info", help="Celery log level."),
) -> None:
    """Run the Celery worker (and beat) that syncs labels, retrains and pushes pre-annotations."""
    _check_config()
    cfg = settings()
    process = _worker(cfg)
    _claim(process, "worker")
    url = _redis(cfg)
    run_dir = cfg.home / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "celery", "-A", "sense7.tasks.celery_app:app", "worker", "--pool", "prefork",
            "--concurrency", str(concurrency), "--loglevel", loglevel]
    if beat:
        args += ["--beat", "--schedule", str(run_dir / "celerybeat-schedule")]
    console.print(f"worker on {url.split('@')[-1]} (beat {'on' if beat else 'off'})")
    _exec_celery(process, args, url)


def beat(loglevel: str = typer.Option("info", help="Celery log level.")) -> None:
    """Run the scheduler alone (periodic reconciliation and retrain), for setups with several workers
    started with --no-beat: one beat per deployment, or every scheduled job runs once per scheduler."""
    cfg = settings()
    process = _beat(cfg)
    _claim(process, "beat")
    url = _redis(cfg)
    run_dir = cfg.home / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "celery", "-A", "sense7.tasks.celery_app:app", "beat", "--loglevel", loglevel,
            "--schedule", str(run_dir / "celerybeat-schedule")]
    console.print(f"beat on {url.split('@')[-1]}")
    _exec_celery(process, args, url)


def sync(
    enqueue: bool = typer.Option(False, "--enqueue", help="Hand the job to the worker instead of running it here."),
    register_webhook: bool = typer.Option(True, help="Register the Label Studio webhook (idempotent)."),
) -> None:
    """Reconcile the store with Label Studio: every annotation and questionnaire answer, deletions too."""
    _check_config()
    cfg = settings()
    _redis(cfg)
    if enqueue:
        _enqueue(names.RECONCILE)
        return
    from sense7.labelstudio.protocol import webhook_headers
    from sense7.labelstudio.label_sync import LabelSync

    rt = _runtime()
    with label_studio_errors(cfg), _SdkErrors():
        syncer = LabelSync.from_runtime(rt)
        if register_webhook:
            hooks = syncer.ensure_webhooks(f"{cfg.backend_url}/webhook", webhook_headers(cfg))
            console.print(f"webhooks {hooks} -> {cfg.backend_url}/webhook")
        started = time.perf_counter()
        with console.status("Reading annotations from Label Studio"):
            result = syncer.reconcile()
    console.print(f"{result.seen} annotations read in {time.perf_counter() - started:.1f} s: "
                  f"{result.upserted} new or changed, {result.unchanged} unchanged, {result.deleted} deleted, "
                  f"{result.profiles} questionnaires, {result.quarantined} quarantined, {result.held} written in "
                  "Label Studio under a rater's account without a rater-page submission behind it "
                  "(`sense7 ratings quarantined` lists them)")
    for problem in result.invalid[:20]:
        console.print(f"[yellow]skipped[/] {problem}", highlight=False)
    if len(result.invalid) > 20:
        console.print(f"... and {len(result.invalid) - 20} more skipped")


def retrain(
    enqueue: bool = typer.Option(False, "--enqueue", help="Hand the job to the worker instead of running it here."),
    reason: str = typer.Option("manual", help="Recorded with the version's metrics."),
) -> None:
    """Train generic + personalized models; promote the new version only if not worse on the held-out slice."""
    _check_config()
    cfg = settings()
    url = _redis(cfg)
    if enqueue:
        _enqueue(names.RETRAIN, reason=reason)
        return
    from sense7.tasks.training import run_retrain

    with console.status("Training (generic and personalized models)"):
        result = run_retrain(_runtime(), url, reason)
    if result["status"] == "skipped":
        raise fail(f"retrain skipped: {result['reason']}")
    verb = "promoted" if result["status"] == "promoted" else "trained but not promoted"
    console.print(f"{result['version']} {verb} ({result['reason']}); serving {result['serving']}")


def preannotate(
    enqueue: bool = typer.Option(False, "--enqueue", help="Hand the job to the worker instead of running it here."),
    chunk: int = typer.Option(None, min=1, help="Predictions per import request (default SENSE7_PREANNOTATE_CHUNK)."),
) -> None:
    """Predict every unlabeled task lacking a prediction of the served version and push them to Label Studio."""
    _check_config()
    cfg = settings()
    _redis(cfg)
    if enqueue:
        _enqueue(names.PREANNOTATE)
        return
    from sense7.store.study_design import StudyRecords
    from sense7.ml_backend.model import ModelUnavailable
    from sense7.ml_backend.preannotate import Preannotator

    rt = _runtime()
    with label_studio_errors(cfg), _SdkErrors():
        pre = Preannotator(rt.client, rt.serving_model, rt.rating_project, chunk or rt.jobs.preannotate_chunk,
                           StudyRecords(rt.store))
        with progress() as bar:
            job = bar.add_task("Pre-annotating", total=None)
            try:
                result = pre.run(on_total=lambda n: bar.update(job, total=n),
                                 on_chunk=lambda n: bar.advance(job, n))
            except ModelUnavailable as exc:
                raise fail(str(exc))
    rate = result.pushed / result.seconds if result.seconds else 0.0
    console.print(f"{result.pushed} predictions of {result.version} pushed, {result.recorded} recorded "
                  f"({result.pending} tasks were pending, "
                  f"{len(result.failed)} failed) in {result.seconds:.1f} s ({rate:.0f} tasks/s)")
    for problem in result.failed[:10]:
        console.print(f"[yellow]failed[/] {problem}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(worker)
    app.command()(beat)
    app.command()(sync)
    app.command()(retrain)
    app.command()(preannotate)
