"""`sense7 config render|check`: the Label Studio configs (XML) rendered from a taxonomy file.

These commands work on taxonomy *files*, not on a running study: `render` reads the file given (default:
the packaged labeling_config/taxonomy.yaml, never SENSE7_TAXONOMY, so that a study's own taxonomy is not
written over the packaged configs) and `check` compares the packaged configs with the packaged taxonomy.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sense7.cli._common import console, fail
from sense7.taxonomy import TaxonomyError, load_taxonomy, render_all

config_app = typer.Typer(help="Render the Label Studio configs from labeling_config/taxonomy.yaml.",
                         no_args_is_help=True)


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
    rendered = render_all(load_taxonomy())
    stale = [p for p, text in rendered.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    if stale:
        raise fail(f"stale: {', '.join(map(str, stale))}; run `sense7 config render`")
    console.print("configs are up to date")


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
