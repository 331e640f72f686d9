"""`sense7 server start|stop|status`: the Label Studio process."""

from __future__ import annotations

import typer

from sense7.cli._common import console, fail, settings
from sense7.labelstudio.server import LabelStudioServer, ServerError

server_app = typer.Typer(help="Run Label Studio (its own virtualenv) on 127.0.0.1.", no_args_is_help=True)


@server_app.command()
def start() -> None:
    """Start Label Studio (SQLite under SENSE7_HOME, or PostgreSQL with SENSE7_LS_DATABASE_URL).

    Creates the admin user and API token on first start; does nothing if it is already running."""
    cfg = settings()
    server = LabelStudioServer(cfg)
    try:
        with console.status(f"Starting Label Studio on {cfg.ls_url} (first start runs migrations, ~1 min)"):
            status = server.start()
    except ServerError as exc:
        raise fail(str(exc))
    console.print(status.describe())
    console.print(f"Login: {cfg.ls_admin_email} (password in {cfg.home / 'secrets' / 'ls_password'})")


@server_app.command()
def stop() -> None:
    """Stop the Label Studio started by `sense7 server start`."""
    stopped = LabelStudioServer(settings()).stop()
    console.print("Label Studio stopped" if stopped else "Label Studio was not running")


@server_app.command()
def status() -> None:
    """Say whether Label Studio runs and answers. Exit 1 when it does not."""
    state = LabelStudioServer(settings()).status()
    console.print(state.describe())
    if not (state.running and state.healthy):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(server_app, name="server")
