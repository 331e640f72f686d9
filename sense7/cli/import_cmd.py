"""`sense7 import`: a batch of conversations as one Label Studio rating task per (assistant turn, rater)."""

from __future__ import annotations

from pathlib import Path

import typer

from sense7.cli._common import (console, err_console, fail, label_studio_errors, nothing_imported, progress,
                                resolve_taxonomy, settings, taxonomy_option)
from sense7.labelstudio import client as ls_client
from sense7.labelstudio.importer import import_conversations, import_profile_tasks
from sense7.privacy.pii import Identifiers
from sense7.readers.exports import EXPORT_FORMATS
from sense7.readers.formats import FORMATS, FormatError, read_assignments, read_identifier_list
from sense7.readers.intake import ReimportConflict, admit, read_batch
from sense7.store.database import Store


def _report_conflict(file: Path, exc: ReimportConflict) -> typer.Exit:
    """One line per conversation whose text changed, as file:line: conversation, message: what to do."""
    for change in exc.changes:
        where = f"{file}:{change.line}" if change.line else str(file)
        what = ("its turns from there on have ratings: nothing can be replaced" if change.rated else
                "the text differs from the imported one (pass --replace to update turns nobody has rated)")
        err_console.print(f"{where}: conversation {change.conversation_id}, message {change.message_index}: {what}",
                          highlight=False, markup=False, soft_wrap=True)
    return fail(f"{exc}; nothing was written", 2)


def import_batch(
    file: Path = typer.Argument(..., help="conversations: native JSONL, CSV (one message per row), OpenAI-style JSONL, "
                                          "or a participant's data export (ChatGPT ZIP or conversations.json, "
                                          "Claude conversations.json, ShareGPT JSON)"),
    fmt: str = typer.Option(None, "--format", help=f"one of {', '.join(FORMATS + EXPORT_FORMATS)} (default: detected)"),
    rater: str = typer.Option(None, "--rater", help="rater id for files that name none (exports, OpenAI-style, CSV)"),
    select: list[str] = typer.Option(None, "--select", help="export: import only these conversation ids "
                                                            "(repeat the option or separate ids by commas)"),
    since: str = typer.Option(None, "--since", help="export: only conversations created on or after this date"),
    until: str = typer.Option(None, "--until", help="export: only conversations created before this date"),
    identifiers: Path = typer.Option(None, "--identifiers", help="the participant's own names and terms, one a line "
                                     "(`Jane Doe`, `term: Acme Corp`, `email: ...`, `phone: ...`): replaced too"),
    phone_region: str = typer.Option("US", "--phone-region", help="region of phone numbers written without +country code"),
    scrub: bool = typer.Option(True, "--scrub/--no-scrub", help="Replace personal details (e-mails, phones, URLs, IPs, "
                               "card numbers, IBANs, the participant's names) by placeholders before anything is "
                               "stored or sent; --no-scrub keeps the texts as they are and is recorded in the staff log."),
    assignments: Path = typer.Option(None, help="CSV conversation_id,rater_id: give a conversation to more raters"),
    replace: bool = typer.Option(False, "--replace", help="Update conversations whose text changed since their import "
                                 "(tasks without ratings only; refuses, writing nothing, where ratings exist)."),
    taxonomy: Path = taxonomy_option(),
    predictions: bool = typer.Option(True, "--predictions/--no-predictions",
                                     help="Import new tasks with the served model's pre-annotations "
                                          "(when a version is served)."),
) -> None:
    """Import a batch of conversations as one rating task per (assistant turn, rater).

    The whole file is validated first: any problem is reported as file:line: field: reason, the command
    exits 2 and nothing is written. Importing the same batch again creates nothing new. When a model
    version is served, new tasks get its pre-annotations in the same bulk request that creates them."""
    cfg = settings()
    tax = resolve_taxonomy(taxonomy, cfg)
    try:
        batch = read_batch(file, tax, fmt, rater, select, since, until)
        conversations = batch.conversations
        if assignments:
            conversations = read_assignments(assignments, conversations)
        own = read_identifier_list(identifiers) if identifiers else Identifiers()
        store = Store(cfg.store_url)
        admitted = admit(conversations, store, batch.account.merged(own), phone_region=phone_region,
                         scrub=scrub, replace=replace)
    except FormatError as exc:
        raise nothing_imported(exc)
    except ReimportConflict as exc:
        raise _report_conflict(file, exc)
    except ValueError as exc:
        raise fail(str(exc), 2)
    conversations, report = admitted.conversations, admitted.redaction
    if batch.skipped:
        console.print("Left out: " + ", ".join(f"{n} {why}" for why, n in sorted(batch.skipped.items())),
                      highlight=False, markup=False)
    if scrub:
        console.print(f"Redaction: {report.summary()}", highlight=False, markup=False)
    else:
        # Texts go to Label Studio as given: who chose that, when and for how many conversations is on record.
        store.log_staff("import --no-scrub", conversations=len(conversations),
                        raters=len({c.rater_id for c in conversations}))
        err_console.print("warning: --no-scrub: texts are imported as given, personal details included "
                          "(recorded in the staff log)", highlight=False, markup=False)
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
    if scrub:
        store.log_staff("import redaction", **report.as_dict())
    repeats = f" (incl. {result.repeats} repeat(s) of a turn, for test-retest)" if result.repeats else ""
    console.print(f"{result.conversations} conversation(s), {result.tasks_in_batch} task(s) in the batch{repeats}: "
                  f"{result.created} created, {result.skipped_existing} already in Label Studio, "
                  f"{result.replaced} replaced (changed text); "
                  f"{new_profiles} new profile questionnaire task(s)")
    if predict is not None:
        console.print(f"{result.predicted} of the new task(s) pre-annotated by {predict.version}")
    console.print(f"Project: {cfg.ls_url}/projects/{rating_id}")
    _embed_texts(cfg, store, [c.conversation_id for c in conversations])


def _embed_texts(cfg, store, conversation_ids: list[str]) -> None:
    """Queue the embed job for the imported conversations (sense7.tasks.embedding) when a text encoder reads
    their vectors; say so when it could not be queued."""
    from sense7.tasks.embedding import request_embedding

    if request_embedding(cfg, store, conversation_ids) == "unavailable":
        console.print("Text vectors: the embed job could not be queued (no Redis); texts are embedded when "
                      "first read", highlight=False, markup=False)


def _import_predictor(cfg, client, rating_id: int):
    """The served version's predictions for the new tasks, or None when no version is served."""
    from sense7.ml_backend.model import import_predictor

    return import_predictor(cfg, client.projects.get(rating_id).label_config)


def register(app: typer.Typer) -> None:
    app.command("import")(import_batch)
