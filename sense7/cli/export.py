"""`sense7 export`: the study's data as researchers load it (staff only: a local command on the study's store)."""

from __future__ import annotations

from pathlib import Path

import typer

from sense7.cli._common import console, fail, resolve_taxonomy, settings, taxonomy_option


def export(
    out: Path = typer.Option(None, "--out", help="a new or empty folder to write the export into"),
    fmt: str = typer.Option("tidy", "--format", help="tidy (Parquet and CSV tables) or lewidi (the LeWiDi "
                            "shared task's perspectivist layout)"),
    with_ids: bool = typer.Option(False, "--with-ids", help="add the store's rater and conversation ids and Label "
                                  "Studio's task and annotation ids (logged in the staff log)"),
    taxonomy: Path = taxonomy_option(),
) -> None:
    """Export the study for analysis: one tidy ratings table (a row per rater x turn x control with the
    rater's traits, the pre-fill arm and level shown, the recorded static, generic and live predictions,
    the model versions, the rater page's timing and quality flags), the conversations, the raters and the
    recorded predictions, as Parquet and CSV with a schema, a datasheet README and Croissant 1.1 metadata;
    or (--format lewidi) the LeWiDi layout. Pseudonymous ids unless --with-ids; never e-mails, platform ids
    or link secrets. Written to a staging folder renamed into place: a failure leaves nothing behind."""
    from sense7.files import FolderNotFree
    from sense7.research.study_export import FORMATS, ExportError, build_export, forbidden_values, write_export

    if out is None:
        raise fail("give --out DIR: a new or empty folder to write the export into (nothing was written)", 2)
    if fmt not in FORMATS:
        raise fail(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r} (nothing was written)", 2)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise fail(f"{out}: {'not a folder' if not out.is_dir() else 'not empty'}; give a new or empty folder "
                   "(nothing was written)", 2)
    cfg = settings()
    tax = resolve_taxonomy(taxonomy, cfg)
    url = cfg.store_url
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise fail(f"no study store at {url}: nothing to export (nothing was written)", 2)
    from sense7.store.database import Store

    store = Store(url)
    try:
        built = build_export(store, tax, design=cfg.study, policy=cfg.quality, with_ids=with_ids)
        written = write_export(built, out, fmt, leaks=forbidden_values(store, with_ids))
    except (ExportError, FolderNotFree) as exc:
        raise fail(str(exc), 2)
    counts = built.row_counts()
    # Who took the study's data out, and whether with the store's ids: counts only, never values.
    store.log_staff("export", format=fmt, with_ids=with_ids, out=str(written.resolve()), **counts)
    shown = ", ".join(f"{n} {name}" for name, n in counts.items())
    ids = "with the store's ids (logged)" if with_ids else "pseudonymous ids"
    console.print(f"Exported into {written} ({fmt}, {ids}): {shown}", highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("export")(export)
