"""`sense7 project create` and `sense7 config render|check`."""

from __future__ import annotations

from pathlib import Path

import typer

from sense7.cli._common import console, fail, label_studio_errors, settings
from sense7.labelstudio import client as ls_client
from sense7.taxonomy import TaxonomyError, load_taxonomy, render_all

project_app = typer.Typer(help="The rating and profile projects in Label Studio.", no_args_is_help=True)
config_app = typer.Typer(help="Render the Label Studio configs from labeling_config/taxonomy.yaml.",
                         no_args_is_help=True)


@project_app.command("create")
def create(taxonomy: Path = typer.Option(None, help="Taxonomy YAML (default: SENSE7_TAXONOMY, else "
                                                         "labeling_config/taxonomy.yaml)")) -> None:
    """Create (or find and update) the SENSE-7 rating project and the rater-profile project."""
    cfg = settings()
    try:
        tax = load_taxonomy(taxonomy or cfg.taxonomy_path)
    except (TaxonomyError, OSError) as exc:
        raise fail(str(exc))
    with label_studio_errors(cfg):
        client = ls_client.connect(cfg)
        rating_id, profile_id = ls_client.ensure_projects(client, cfg, tax)
    console.print(f"Rating project:  {cfg.ls_url}/projects/{rating_id}  ({cfg.rating_project_title})")
    console.print(f"Profile project: {cfg.ls_url}/projects/{profile_id}  ({cfg.profile_project_title})")


@config_app.command("render")
def render(taxonomy: Path = typer.Option(None, help="Taxonomy YAML"),
           out: Path = typer.Option(None, help="Output folder, created if missing "
                                                "(default: next to the taxonomy)")) -> None:
    """Write rating.xml and profile.xml from the taxonomy."""
    try:
        tax = load_taxonomy(taxonomy)
    except (TaxonomyError, OSError) as exc:
        raise fail(str(exc))
    if out is not None:
        if out.exists() and not out.is_dir():
            raise fail(f"--out {out}: not a folder (give the folder for rating.xml and profile.xml)")
        out.mkdir(parents=True, exist_ok=True)
    for path, text in render_all(tax, out or (taxonomy.parent if taxonomy else None)).items():
        path.write_text(text, encoding="utf-8")
        console.print(f"wrote {path}")


@config_app.command("check")
def check() -> None:
    """Exit 1 if the committed XML files are stale (the taxonomy changed without `config render`)."""
    stale = [p for p, text in render_all().items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    if stale:
        raise fail(f"stale: {', '.join(map(str, stale))}; run `sense7 config render`")
    console.print("configs are up to date")


def register(app: typer.Typer) -> None:
    app.add_typer(project_app, name="project")
    app.add_typer(config_app, name="config")
