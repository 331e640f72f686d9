"""The `sense7` command line. Each module of this package registers one command or one group of commands
(`sense7 raters ...` lives in raters.py, `sense7 import` in import_cmd.py); `_common` holds what they share,
`research_tables` the tables of `evaluate` and `analyze`."""

from __future__ import annotations

import os
import sys
import traceback

import typer

from sense7.cli import (backend, backup, config, demo, export, import_cmd, jobs, jury, models, project, rater_page, raters,
                        ratings, release, research, server, status, synth_cmd)
from sense7.cli import crowd, store
from sense7.cli._common import CleanErrorsGroup, err_console

app = typer.Typer(
    cls=CleanErrorsGroup,  # expected errors (bad files, paths, data conflicts): one line, no traceback
    name="sense7",
    help="Per-turn empathy ratings in Label Studio and personalized rater models (SENSE-7 style).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Registration order is the order `sense7 --help` lists the commands (then the groups) in.
for module in (demo, server, project, config, import_cmd, raters, ratings, rater_page, synth_cmd, research, jury,
               release, export, status, backend, jobs, models, crowd, store, backup):
    module.register(app)


def main() -> None:
    # Everything sense7 writes (store, secrets, logs, reports, the servers it starts and their databases)
    # holds traits, conversations or secrets: readable by this user only.
    os.umask(0o077)
    try:
        app()
    except Exception:  # expected errors never get here (CleanErrorsGroup): this is a bug in sense7
        traceback.print_exc()
        err_console.print("internal error: this is a bug in sense7, not a problem with your input; the traceback "
                          "above shows where it happened (please include it in a bug report)",
                          style="bold red", highlight=False, markup=False, soft_wrap=True)
        sys.exit(1)
