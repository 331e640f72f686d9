"""Helpers shared by the CLI modules: settings, the study's taxonomy, consoles, progress bars, clean failures."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text
from typer.core import TyperGroup

from sense7.settings import Settings

console = Console()
err_console = Console(stderr=True)

TAXONOMY_HELP = "the study's taxonomy YAML: its controls and scale (default: SENSE7_TAXONOMY, else the packaged one)"


def settings() -> Settings:
    return Settings.from_env()


def taxonomy_option():
    """The `--taxonomy FILE` option of every command that reads the study's taxonomy."""
    return typer.Option(None, "--taxonomy", help=TAXONOMY_HELP)


def resolve_taxonomy(path: Path | None = None, cfg: Settings | None = None):
    """The study's taxonomy, for every command that reads one: --taxonomy FILE, else SENSE7_TAXONOMY (cfg's,
    or the environment's when the command builds no settings), else the packaged file. Library functions
    take it as an argument and never choose one themselves. A file that is not a taxonomy: one line, exit 2."""
    from sense7.taxonomy import TaxonomyError, study_taxonomy

    try:
        return study_taxonomy(cfg, path)
    except TaxonomyError as exc:
        raise fail(str(exc), 2)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a clear error on stderr and return the Exit to raise (no traceback for expected errors).

    The message is plain text, never rich markup: file names, data and server replies may hold "[...]"."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", str(message)), highlight=False, soft_wrap=True)
    return typer.Exit(code)


def nothing_imported(exc: Exception) -> typer.Exit:
    """A refused input file (FormatError: every problem as file:line: field: reason): the import commands
    write nothing then."""
    return fail(f"{exc}\nnothing was imported", 2)


# Errors a user can cause and fix (bad input files, paths, data conflicts): one line, no traceback.
# (module, class name, exit code). Matched by name so that `sense7 --help` imports none of these modules:
# an exception can only be an instance of a class whose module is already loaded.
EXPECTED_ERRORS = (
    ("sense7.readers.formats", "FormatError", 2),
    ("sense7.taxonomy", "TaxonomyError", 1),
    ("sense7.model.catalog", "UnknownModelError", 2),
    ("sense7.model.bundle", "BundleError", 1),
    ("sense7.model.registry", "RegistryError", 1),
    ("sense7.settings", "SettingsError", 2),
)


def _os_error_message(exc: OSError) -> str:
    """"path: reason" (the errno text without the Python decoration)."""
    if exc.filename is None:
        return str(exc)
    where = str(exc.filename) + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, NotADirectoryError):
        reason += " (part of this path is a file, not a folder)"
    elif isinstance(exc, FileExistsError):
        reason += " (a file is where a folder is needed)"
    return f"{where}: {reason}"


def expected_error(exc: BaseException) -> tuple[str, int] | None:
    """(one-line message, exit code) for an error a user can act on; None for a bug (keeps its traceback).

    Messages never carry the SQL parameters of a database error: those hold other raters' traits."""
    for module, name, code in EXPECTED_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(exc, cls):
            return str(exc), code
    integrity = getattr(sys.modules.get("sqlalchemy.exc"), "IntegrityError", None)
    if integrity is not None and isinstance(exc, integrity):
        # exc.orig is the driver's error: "UNIQUE constraint failed: raters.email" (SQLite) or the
        # PostgreSQL message, whose first line names the constraint; str(exc) would add SQL and parameters.
        reason = str(getattr(exc, "orig", "") or "").strip().splitlines()
        return (f"the store refused the data ({reason[0] if reason else 'integrity constraint'}); "
                "nothing was written", 2)
    if isinstance(exc, OSError):
        return _os_error_message(exc), 1
    return None


class CleanErrorsGroup(TyperGroup):
    """The top-level command group: expected errors (see expected_error) become one `error:` line and a
    non-zero exit code; anything else is a bug and keeps its traceback (see main)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            known = expected_error(exc)
            if known is None:
                raise
            raise fail(*known) from None


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
