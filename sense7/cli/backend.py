"""`sense7 backend start|stop|status|connect`: the ML backend that pre-fills ratings in Label Studio."""

from __future__ import annotations

import typer

from sense7.cli._common import console, fail, label_studio_errors, resolve_taxonomy, settings

CONNECTED = "CO"  # Label Studio's MLBackendState for a backend that answered /health and /setup

backend_app = typer.Typer(help="Serve personalized pre-annotations to Label Studio (gunicorn).",
                          no_args_is_help=True)


def _server(port: int | None):
    from sense7.ml_backend.backend_process import BackendServer

    return BackendServer(settings(), port=port)


@backend_app.command()
def start(
    port: int = typer.Option(None, help="Port on 127.0.0.1 (default SENSE7_BACKEND_PORT, 9090)."),
    workers: int = typer.Option(None, help="gunicorn worker processes (default SENSE7_BACKEND_WORKERS or 2)."),
    threads: int = typer.Option(None, help="Threads per worker (default SENSE7_BACKEND_THREADS or 1: sync workers; more: gthread)."),
) -> None:
    """Start the ML backend in the background; it serves the registry's current model version."""
    from sense7.ml_backend.backend_process import BackendError

    server = _server(port)
    try:
        status = server.start(workers=workers, threads=threads)
    except BackendError as exc:
        raise fail(str(exc))
    console.print(status.describe())
    if status.detail == "model untrained":
        console.print("No model promoted yet: /predict answers 503 until a trained version is promoted.")


@backend_app.command()
def stop(port: int = typer.Option(None, help="Port it was started on.")) -> None:
    """Stop the ML backend started by `sense7 backend start` (in-flight requests finish first)."""
    console.print("ML backend stopped" if _server(port).stop() else "ML backend was not running")


@backend_app.command()
def status(port: int = typer.Option(None, help="Port it was started on.")) -> None:
    """Say whether the ML backend runs and which model version it serves. Exit 1 when it does not answer."""
    state = _server(port).status()
    console.print(state.describe())
    if not (state.running and state.healthy):
        raise typer.Exit(1)


@backend_app.command()
def connect(
    url: str = typer.Option(None, help="URL Label Studio uses to reach the backend (default SENSE7_BACKEND_URL)."),
    project: int = typer.Option(None, help="Project id (default: the rating project, created if needed)."),
    interactive: bool = typer.Option(False, help="Also enable Label Studio's interactive pre-annotation mode "
                                     "(not needed: tasks are pre-filled when retrieved or opened either way)."),
) -> None:
    """Register the backend (and its webhook) with the rating project. Safe to run again."""
    from label_studio_sdk.core.api_error import ApiError

    from sense7.labelstudio.client import connect as ls_connect
    from sense7.labelstudio.client import ensure_projects
    from sense7.labelstudio.protocol import connect_backend

    cfg = settings()
    with label_studio_errors(cfg):
        client = ls_connect(cfg)
        project_id = project or ensure_projects(client, cfg, resolve_taxonomy(cfg=cfg))[0]
        try:
            reg = connect_backend(client, project_id, cfg, url=url, is_interactive=interactive)
        except ApiError as exc:  # Label Studio checks the URL itself and says why it refuses it
            raise fail(f"Label Studio refused the ML backend registration (HTTP {exc.status_code}): {exc.body}")
    verb = "registered" if reg.created else "already registered (settings refreshed)"
    console.print(f"ML backend {verb} on project {project_id} (ml backend id {reg.ml_backend_id}, "
                  f"webhook id {reg.webhook_id}); Label Studio reports it as {reg.state}")
    if reg.state != CONNECTED:
        raise fail(f"Label Studio cannot reach the backend (state {reg.state}): is `sense7 backend start` running "
                   f"and is {url or cfg.backend_url} reachable from Label Studio?")


def register(app: typer.Typer) -> None:
    app.add_typer(backend_app, name="backend")
