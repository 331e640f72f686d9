"""`sense7 import` (conversation batches) and `sense7 raters import` (rater traits)."""

from __future__ import annotations

from pathlib import Path

import typer

from sense7.cli._common import console, err_console, fail, label_studio_errors, progress, settings
from sense7.data.formats import FORMATS, FormatError, read_assignments, read_conversations, read_raters, read_ratings
from sense7.data.store import Store
from sense7.labelstudio import client as ls_client
from sense7.labelstudio.importer import ReimportConflict, import_conversations, import_profile_tasks
from sense7.taxonomy import TaxonomyError, study_taxonomy

raters_app = typer.Typer(help="Raters: traits (answers to the profile questionnaire) and private rating links.",
                         no_args_is_help=True)
ratings_app = typer.Typer(help="Ratings collected outside Label Studio (a pilot, an earlier study).",
                          no_args_is_help=True)


TAXONOMY_HELP = "the study's taxonomy YAML (default: SENSE7_TAXONOMY, else the packaged one)"


def _report_problems(exc: FormatError) -> typer.Exit:
    """Every problem of the file as file:line: field: reason (the import commands write nothing then)."""
    return fail(f"{exc}\nnothing was imported", 2)


def _email_conflicts(store: Store, rows: list[dict]) -> list[str]:
    """Emails of `rows` that another rater already has in the store (the store keeps emails unique).
    Names the raters and the email only: never anybody's traits."""
    emails = store.rater_emails()  # rater_id -> email
    emails.update({r["rater_id"]: r["email"] for r in rows})  # as they would be after the import
    owners: dict[str, list[str]] = {}
    for rid, email in emails.items():
        if email:
            owners.setdefault(email, []).append(rid)
    conflicts = []
    for row in rows:
        others = [rid for rid in owners.get(row["email"] or "", []) if rid != row["rater_id"]]
        if others:
            conflicts.append(f"rater {row['rater_id']}: email {row['email']} is already used by rater "
                             f"{', '.join(sorted(others))}")
    return conflicts


def _report_conflict(file: Path, exc: ReimportConflict) -> typer.Exit:
    """One line per conversation whose text changed, as file:line: conversation, message: what to do."""
    for change in exc.changes:
        where = f"{file}:{change.line}" if change.line else str(file)
        what = ("its turns from there on have ratings: nothing can be replaced" if change.rated else
                "the text differs from the imported one (pass --replace to update turns nobody has rated)")
        err_console.print(f"{where}: conversation {change.conversation_id}, message {change.message_index}: {what}",
                          highlight=False, markup=False, soft_wrap=True)
    return fail(f"{exc}; nothing was written", 2)


def _taxonomy(path: Path | None, cfg=None):
    try:
        return study_taxonomy(cfg, path)
    except TaxonomyError as exc:
        raise fail(str(exc), 2)


def import_batch(
    file: Path = typer.Argument(..., help="conversations: native JSONL, CSV (one message per row) or OpenAI-style JSONL"),
    fmt: str = typer.Option(None, "--format", help=f"one of {', '.join(FORMATS)} (default: detected)"),
    rater: str = typer.Option(None, "--rater", help="rater id for files that name none (OpenAI exports, CSV)"),
    assignments: Path = typer.Option(None, help="CSV conversation_id,rater_id: give a conversation to more raters"),
    replace: bool = typer.Option(False, "--replace", help="Update conversations whose text changed since their import "
                                 "(tasks without ratings only; refuses, writing nothing, where ratings exist)."),
    taxonomy: Path = typer.Option(None, help=TAXONOMY_HELP),
    predictions: bool = typer.Option(True, "--predictions/--no-predictions",
                                     help="Import new tasks with the served model's pre-annotations "
                                          "(when a version is served)."),
) -> None:
    """Import a batch of conversations as one rating task per (assistant turn, rater).

    The whole file is validated first: any problem is reported as file:line: field: reason, the command
    exits 2 and nothing is written. Importing the same batch again creates nothing new. When a model
    version is served, new tasks get its pre-annotations in the same bulk request that creates them."""
    cfg = settings()
    tax = _taxonomy(taxonomy, cfg)
    try:
        conversations = read_conversations(file, fmt, rater, tax)
        if assignments:
            conversations = read_assignments(assignments, conversations)
    except FormatError as exc:
        raise _report_problems(exc)
    except ValueError as exc:
        raise fail(str(exc), 2)
    store = Store(cfg.store_url)
    with label_studio_errors(cfg):
        client = ls_client.connect(cfg)
        rating_id, profile_id = ls_client.ensure_projects(client, cfg, tax)
        predict = _import_predictor(cfg, client, rating_id) if predictions else None
        with progress() as bar:
            job = bar.add_task("Importing tasks", total=None)
            try:
                result = import_conversations(client, rating_id, conversations, store, replace=replace,
                                              predict=predict, design=cfg.study, taxonomy=tax, on_progress=lambda n: bar.advance(job, n),
                                              on_total=lambda n: bar.update(job, total=n))
            except ReimportConflict as exc:
                raise _report_conflict(file, exc)
        new_profiles = import_profile_tasks(client, profile_id, sorted({c.rater_id for c in conversations}))
    repeats = f" (incl. {result.repeats} repeat(s) of a turn, for test-retest)" if result.repeats else ""
    console.print(f"{result.conversations} conversation(s), {result.tasks_in_batch} task(s) in the batch{repeats}: "
                  f"{result.created} created, {result.skipped_existing} already in Label Studio, "
                  f"{result.replaced} replaced (changed text); "
                  f"{new_profiles} new profile questionnaire task(s)")
    if predict is not None:
        console.print(f"{result.predicted} of the new task(s) pre-annotated by {predict.version}")
    console.print(f"Project: {cfg.ls_url}/projects/{rating_id}")


def _import_predictor(cfg, client, rating_id: int):
    """The served version's predictions for the new tasks, or None when no version is served."""
    from sense7.ml_backend.model import import_predictor

    return import_predictor(cfg, client.projects.get(rating_id).label_config)


@raters_app.command("import")
def raters_import(file: Path = typer.Argument(..., help="CSV: rater_id, email, profile fields of the taxonomy"),
                  taxonomy: Path = typer.Option(None, help=TAXONOMY_HELP)) -> None:
    """Register or update rater traits in sense7's store (never in Label Studio task data)."""
    cfg = settings()
    try:
        rows = read_raters(file, _taxonomy(taxonomy, cfg))
    except FormatError as exc:
        raise _report_problems(exc)
    store = Store(cfg.store_url)
    conflicts = _email_conflicts(store, rows)
    if conflicts:
        raise fail(f"{file}: {len(conflicts)} email conflict(s), nothing was imported:\n  " + "\n  ".join(conflicts), 2)
    inserted, updated = store.upsert_raters(rows)
    console.print(f"{len(rows)} rater(s): {inserted} new, {updated} updated, "
                  f"{len(rows) - inserted - updated} unchanged")


@ratings_app.command("import")
def ratings_import(
    ratings: Path = typer.Argument(..., help="ratings.csv: conversation_id, turn_index, rater_id, dimension, rating"),
    conversations: Path = typer.Option(..., help="the conversations the ratings refer to (native JSONL)"),
    taxonomy: Path = typer.Option(None, help=TAXONOMY_HELP),
) -> None:
    """Add earlier ratings to the training data (they never become Label Studio tasks).

    Both files are validated first (every rating must point at an assistant turn of a conversation of
    that rater); on any problem nothing is written."""
    cfg = settings()
    tax = _taxonomy(taxonomy, cfg)
    try:
        convs = read_conversations(conversations, taxonomy=tax)
        frame = read_ratings(ratings, tax, convs)
    except FormatError as exc:
        raise _report_problems(exc)
    store = Store(cfg.store_url)
    store.upsert_conversations(convs)
    written = store.import_ratings(frame)
    # An explicit staff entry on the raters' behalf: logged (`sense7 ratings history --staff`).
    store.log_staff("ratings import", file=str(ratings), ratings=written, raters=int(frame["rater_id"].nunique()))
    console.print(f"{written} rating(s) from {frame['rater_id'].nunique()} rater(s) stored")


def register(app: typer.Typer) -> None:
    app.command("import")(import_batch)
    app.add_typer(raters_app, name="raters")
    app.add_typer(ratings_app, name="ratings")
