"""Helpers shared by the CLI modules: settings, consoles, progress bars, clean failures."""

from __future__ import annotations

import contextlib
import sys

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from sense7.settings import Settings

console = Console()
err_console = Console(stderr=True)


def settings() -> Settings:
    return Settings.from_env()


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a clear error on stderr and return the Exit to raise (no traceback for expected errors)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code)


def progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err_console, transient=not sys.stderr.isatty())


@contextlib.contextmanager
def label_studio_errors(settings: Settings):
    """Turn 'Label Studio is not there' into one line a user can act on."""
    import httpx

    try:
        yield
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise fail(f"cannot reach Label Studio at {settings.ls_url} ({exc}); start it with `sense7 server start`")
