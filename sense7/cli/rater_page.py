"""`sense7 rater-page start|stop|status`: the rater page (gunicorn) that raters' private links open."""

from __future__ import annotations

import typer

from sense7.cli._common import console, fail, settings

page_app = typer.Typer(help="The rater page (gunicorn) that private links open.", no_args_is_help=True)


def _page_server():
    from sense7.rater_page.rater_page_process import RaterPageServer

    return RaterPageServer(settings())


@page_app.command()
def start() -> None:
    """Start the rater page in the background (SENSE7_RATER_PAGE_HOST:PORT, 127.0.0.1:8090 by default)."""
    from sense7.rater_page.rater_page_process import RaterPageError
    from sense7.tasks.redis_local import ensure_redis

    cfg = settings()
    try:
        status = _page_server().start({"SENSE7_REDIS_URL": ensure_redis(cfg)})
    except RaterPageError as exc:
        raise fail(str(exc))
    console.print(status.describe())


@page_app.command()
def stop() -> None:
    """Stop the rater page."""
    console.print("rater page stopped" if _page_server().stop() else "rater page was not running")


@page_app.command()
def status() -> None:
    """Say whether the rater page runs. Exit 1 when it does not answer."""
    state = _page_server().status()
    console.print(state.describe())
    if not (state.running and state.healthy):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(page_app, name="rater-page")
