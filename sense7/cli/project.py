"""`sense7 project create`: the rating and rater-profile projects in Label Studio."""

from __future__ import annotations

from pathlib import Path

import typer

from sense7.cli._common import console, label_studio_errors, resolve_taxonomy, settings, taxonomy_option
from sense7.labelstudio import client as ls_client

project_app = typer.Typer(help="The rating and profile projects in Label Studio.", no_args_is_help=True)


@project_app.command("create")
def create(taxonomy: Path = taxonomy_option()) -> None:
    """Create (or find and update) the SENSE-7 rating project and the rater-profile project."""
    cfg = settings()
    tax = resolve_taxonomy(taxonomy, cfg)
    with label_studio_errors(cfg):
        client = ls_client.connect(cfg)
        rating_id, profile_id = ls_client.ensure_projects(client, cfg, tax)
    console.print(f"Rating project:  {cfg.ls_url}/projects/{rating_id}  ({cfg.rating_project_title})")
    console.print(f"Profile project: {cfg.ls_url}/projects/{profile_id}  ({cfg.profile_project_title})")


def register(app: typer.Typer) -> None:
    app.add_typer(project_app, name="project")
