"""`sense7 ratings import | history | revert | quarantined | accept`: ratings collected elsewhere, every change
of a synced rating, its undo, and what is not counted.

Label Studio Community lets any member edit or delete any annotation, so the store keeps each change
(who, when, before and after); a project manager lists them and reverts one in Label Studio, after which
the store follows. Quarantined annotations (author not the task's rater) are listed with the reason, and so
are versions written in Label Studio under a rater's account that no rater-page submission stands behind
(held: never trained on as the rater's until `sense7 ratings accept` says so, which is logged).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sense7.cli._common import (console, fail, label_studio_errors, nothing_imported, resolve_taxonomy, settings,
                                taxonomy_option)

ratings_app = typer.Typer(help="Ratings collected outside Label Studio (a pilot, an earlier study).",
                          no_args_is_help=True)


@ratings_app.command("import")
def ratings_import(
    ratings: Path = typer.Argument(..., help="ratings.csv: conversation_id, turn_index, rater_id, dimension, rating"),
    conversations: Path = typer.Option(..., help="the conversations the ratings refer to (native JSONL)"),
    taxonomy: Path = taxonomy_option(),
) -> None:
    """Add earlier ratings to the training data (they never become Label Studio tasks).

    Both files are validated first (every rating must point at an assistant turn of a conversation of
    that rater); on any problem nothing is written."""
    from sense7.readers.formats import FormatError, read_conversations, read_ratings
    from sense7.store.database import Store

    cfg = settings()
    tax = resolve_taxonomy(taxonomy, cfg)
    try:
        convs = read_conversations(conversations, tax)
        frame = read_ratings(ratings, tax, convs)
    except FormatError as exc:
        raise nothing_imported(exc)
    store = Store(cfg.store_url)
    store.upsert_conversations(convs)
    written = store.import_ratings(frame)
    # An explicit staff entry on the raters' behalf: logged (`sense7 ratings history --staff`).
    store.log_staff("ratings import", file=str(ratings), ratings=written, raters=int(frame["rater_id"].nunique()))
    console.print(f"{written} rating(s) from {frame['rater_id'].nunique()} rater(s) stored")


def _summary(state: dict | None) -> str:
    if state is None:
        return "-"
    values = " ".join(f"{k}={v}" for k, v in (state.get("values") or {}).items())
    extra = f" expectation={state['expectation']}" if state.get("expectation") else ""
    who = state.get("rater_id") or f"quarantined ({state.get('quarantine')})"
    held = state.get("held")
    if held and state.get("rater_id"):
        kept = " ".join(f"{k}={v}" for k, v in (held.get("values") or {}).items())
        if "lead_time" in held and held["lead_time"] != state.get("lead_time"):
            kept += f" lead_time={held['lead_time']}"
        if held.get("cancelled"):
            kept += " was_cancelled=true"
        if held.get("author") is not None:
            kept += f" completed_by={held['author']}"
        extra += f" [not counted: {kept} by user {held.get('changed_by')}]"
    return f"{who}: {values}{extra}"


def _author(row: dict) -> str:
    """Who wrote a change: the rater page (a rater's submission), a Label Studio user, or a command."""
    via = row.get("via")
    user = row["changed_by"] if row["changed_by"] is not None else "?"
    if via == "rater page":
        return f"the rater page (account {user})"
    if via == "label studio":
        return f"user {user} in Label Studio"
    if via:
        return via
    return f"user {user}"  # recorded before sources were kept


@ratings_app.command("history")
def history(
    annotation: int = typer.Option(None, help="Only this Label Studio annotation id."),
    rater: str = typer.Option(None, help="Only changes of this rater's ratings."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per change."),
    staff: bool = typer.Option(False, "--staff", help="The staff entries instead (ratings imported, reverts)."),
) -> None:
    """Every change of a synced rating, oldest first: id, when, who (Label Studio user id), before -> after."""
    from sense7.store.database import Store

    store = Store(settings().store_url)
    if staff:
        for entry in store.staff_entries():
            console.print(f"{entry['at']:%Y-%m-%d %H:%M:%S} {entry['actor']}: {entry['action']} "
                          f"{json.dumps(entry['detail'], sort_keys=True)}", highlight=False, markup=False)
        return
    rows = store.history(annotation_id=annotation, rater_id=rater)
    for row in rows:
        if as_json:
            console.print_json(json.dumps({**row, "changed_at": row["changed_at"].isoformat()}, default=str))
            continue
        console.print(f"#{row['id']} {row['changed_at']:%Y-%m-%d %H:%M:%S} annotation {row['annotation_id']} "
                      f"{row['change']} by {_author(row)}: "
                      f"{_summary(row['old'])} -> {_summary(row['new'])}", highlight=False, markup=False)
    if not rows and not as_json:
        console.print("no changes recorded")


@ratings_app.command("revert")
def revert(change: int = typer.Argument(..., help="The change's id (#N in `sense7 ratings history`).")) -> None:
    """Undo one change in Label Studio and sync the annotation back into the store."""
    from label_studio_sdk.core.api_error import ApiError

    from sense7.tasks.runtime import Runtime, describe_error
    from sense7.labelstudio.label_sync import LabelSync

    cfg = settings()
    with label_studio_errors(cfg):
        try:
            result = LabelSync.from_runtime(Runtime(cfg)).revert(change)
        except LookupError as exc:
            raise fail(str(exc))
        except ApiError as exc:
            raise fail(describe_error(exc)) from None
    from sense7.store.database import Store

    Store(cfg.store_url).log_staff("revert", change=change, written=result.upserted, deleted=result.deleted)
    console.print(f"change #{change} reverted: {result.upserted} annotation(s) written, {result.deleted} deleted")


@ratings_app.command("quarantined")
def quarantined() -> None:
    """Annotations credited to no rater (the author is not a known rater, or not the task's rater)."""
    from sense7.store.database import Store

    rows = Store(settings().store_url).quarantined()
    for row in rows:
        console.print(f"annotation {row['annotation_id']} (task {row['task_id']}, conversation "
                      f"{row['conversation_id']} turn {row['turn_index']}): {row['quarantine']}",
                      highlight=False, markup=False)
    console.print(f"{len(rows)} quarantined annotation(s); they are kept, never trained on")
    held = Store(settings().store_url).held()
    for row in held:
        if row["rater_id"] is None:  # quarantined: listed above
            continue
        version = row["held"]
        values = " ".join(f"{k}={v}" for k, v in (version.get("values") or {}).items())
        console.print(f"annotation {row['annotation_id']} (task {row['task_id']}, rater {row['rater_id']}): "
                      f"not counted: {values} ({version.get('reason')})", highlight=False, markup=False)
    if held:
        console.print(f"{len(held)} version(s) written in Label Studio under a rater's account, not counted as "
                      "the rater's; `sense7 ratings accept ID` counts one (logged)", highlight=False, markup=False)


@ratings_app.command("accept")
def accept(annotations: list[int] = typer.Argument(..., help="Label Studio annotation ids (see `sense7 ratings quarantined`).")) -> None:
    """Count what Label Studio holds for these annotations as their rater's own rating, although no
    rater-page submission stands behind it (a staff correction, a rating entered for a rater; an accepted
    cancellation removes the rating). Logged (`sense7 ratings history --staff`); all or nothing."""
    from sense7.store.database import Store

    try:
        done = Store(settings().store_url).accept_held(list(dict.fromkeys(annotations)))
    except LookupError as exc:
        raise fail(str(exc))
    for row in done:
        values = " ".join(f"{k}={v}" for k, v in row["values"].items())
        said = "cancelled: no rating of" if row["cancelled"] else "counted as"
        console.print(f"annotation {row['annotation_id']}: {said} rater {row['rater_id']}'s ({values})",
                      highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(ratings_app, name="ratings")
