"""`sense7 server start|stop|status|invite-staff`: the Label Studio process."""

from __future__ import annotations

import typer

from sense7.cli._common import console, fail, settings
from sense7.labelstudio.label_studio_process import LabelStudioServer, ServerError

server_app = typer.Typer(help="Run Label Studio (its own virtualenv) on 127.0.0.1.", no_args_is_help=True)

# What any Label Studio account can do in the Community edition (measured on 1.23.2, docs/SECURITY.md):
# said whenever Label Studio is reachable from other machines.
EXPOSED_WARNING = (
    "Label Studio listens on {host}, reachable from other machines. Every Label Studio account is staff: "
    "in the Community edition any account can read every task, rating and user email, change or delete any "
    "annotation and read webhook headers. Give accounts only to staff (`sense7 server invite-staff`); raters "
    "never get one.")


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


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
    if not _loopback(cfg.ls_host):
        console.print(f"[yellow]warning:[/] {EXPOSED_WARNING.format(host=cfg.ls_host)}", highlight=False)


@server_app.command("invite-staff")
def invite_staff() -> None:
    """Print the sign-up link for a new staff account (sign-up without it is off). Share it privately."""
    import requests

    cfg = settings()
    try:
        link = LabelStudioServer(cfg).invite_link()
    except requests.RequestException as exc:
        raise fail(f"cannot get an invite link from Label Studio at {cfg.ls_url} ({type(exc).__name__}); "
                   "is it running (`sense7 server status`)?")
    console.print(link, highlight=False, markup=False, soft_wrap=True)


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
