"""The `sense7` command line. Each module of this package registers one group of commands."""

from __future__ import annotations

import typer

from sense7.cli import backend, data, demo, jobs, project, research, server, synth_cmd

app = typer.Typer(
    name="sense7",
    help="Per-turn empathy ratings in Label Studio and personalized rater models (SENSE-7 style).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for module in (demo, server, project, data, synth_cmd, research, backend, jobs):
    module.register(app)


def main() -> None:
    app()
