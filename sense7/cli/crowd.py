"""`sense7 crowd init|open|close|status|completions`: crowd studies on a recruitment platform (Prolific).

`completions` is the only export that holds platform ids (for approving payments); it is written 0600."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sense7.cli._common import console, fail, nothing_imported, resolve_taxonomy, settings, taxonomy_option
from sense7.files import csv_text, write_private

crowd_app = typer.Typer(help="Crowd studies: participants from a platform such as Prolific, with consent, a "
                             "comprehension check, balanced assignments and completion codes.", no_args_is_help=True)


def _store():
    from sense7.store.database import Store

    return Store(settings().store_url)


def _study(store, study_id: str):
    from sense7.crowd.participants import Studies

    found = Studies(store).get(study_id)
    if found is None:
        raise fail(f"no crowd study {study_id!r} (sense7 crowd init STUDY.yaml first)", 2)
    return found


def _embed_pool(cfg, store, study_id: str) -> None:
    """Queue the embed job for the pool's conversations (sense7.tasks.embedding), as `sense7 import` does."""
    from sense7.crowd.participants import Studies
    from sense7.tasks.embedding import request_embedding

    if request_embedding(cfg, store, list(Studies(store).pool(study_id))) == "unavailable":
        console.print("Text vectors: the embed job could not be queued (no Redis); texts are embedded when "
                      "first read", highlight=False, markup=False)


@crowd_app.command("init")
def crowd_init(file: Path = typer.Argument(..., help="the study file (YAML; docs/guides/crowd.md)"),
               taxonomy: Path = taxonomy_option()) -> None:
    """Validate a study file, its consent text and its pool, and store them (the study starts closed;
    re-running it updates the study and keeps its participants and slots)."""
    from sense7.crowd.lifecycle import install_study
    from sense7.readers.formats import FormatError
    from sense7.crowd.participants import study_secret

    cfg = settings()
    store, redaction = _store(), []
    try:
        study, pool = install_study(store, file, resolve_taxonomy(taxonomy, cfg), on_redaction=redaction.append)
    except FormatError as exc:
        raise nothing_imported(exc)
    # As `sense7 import`: the pool's personal details were replaced before it was stored; counts only.
    store.log_staff("crowd init redaction", study=study.study_id, **redaction[0].as_dict())
    console.print(f"Redaction: {redaction[0].summary()}", highlight=False, markup=False)
    study_secret(cfg, study.study_id)  # made now, 0600: the key of the study's pseudonymous ids
    _embed_pool(cfg, store, study.study_id)
    url = cfg.rater_page.public_url.rstrip("/")
    names = study.platform
    console.print(f"study {study.study_id}: {pool} conversations, K={study.raters_per_conversation}, "
                  + (f"N={study.conversations_per_participant}" if study.turns_per_participant is None
                     else f"a budget of {study.turns_per_participant} turns each") + f", cap {study.participant_cap}, consent version "
                  f"{study.consent_version[:12]}; closed until `sense7 crowd open {study.study_id}`", highlight=False)
    console.print(f"study URL: {url}/s/{study.study_id}?{names['participant_param']}={{{{%PROLIFIC_PID%}}}}"
                  f"&{names['study_param']}={{{{%STUDY_ID%}}}}&{names['session_param']}={{{{%SESSION_ID%}}}}",
                  highlight=False, markup=False, soft_wrap=True)
    if "study_id" not in names:
        console.print("note: the study file does not pin the platform's study id (platform.study_id): entries "
                      "naming any platform study are let in", highlight=False)


def _set_open(study_id: str, is_open: bool) -> None:
    from sense7.crowd.participants import Studies

    store = _store()
    _study(store, study_id)
    Studies(store).set_open(study_id, is_open)
    console.print(f"study {study_id} is {'open' if is_open else 'closed'}", highlight=False)


@crowd_app.command("open")
def crowd_open(study_id: str = typer.Argument(..., metavar="STUDY")) -> None:
    """Take new participants."""
    _set_open(study_id, True)


@crowd_app.command("close")
def crowd_close(study_id: str = typer.Argument(..., metavar="STUDY")) -> None:
    """Take no new participants (those inside continue)."""
    _set_open(study_id, False)


@crowd_app.command("status")
def crowd_status(json_out: bool = typer.Option(False, "--json")) -> None:
    """Per study: the pool's coverage, open leases, completed, abandoned, declined and screened-out counts."""
    from sense7.crowd.lifecycle import status

    rows = status(_store())
    if json_out:
        print(json.dumps(rows, indent=1))
        return
    for line in status_lines(rows):
        console.print(line, highlight=False)


def reasons_text(reasons: dict[str, int]) -> str:
    """A policy's reasons for its conversations' K, counted: "602 capped, 78 uncertain"."""
    return ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in reasons.items())


def status_lines(rows: list[dict]) -> list[str]:
    lines = []
    for row in rows:
        c, p = row["coverage"], row["participants"]
        lines.append(
            f"crowd study {row['study']} ({'open' if row['open'] else 'closed'}): {c['rated']} of {c['slots']} "
            f"slots rated, {c['in_lease']} in open leases, {c['fully_covered']} of {c['conversations']} "
            f"conversations fully covered (K={c['raters_per_conversation']}), spread {c['spread']}, "
            f"{c['released']} slots given back; assignment {c.get('policy', 'least_covered')} (floor "
            f"{c.get('floor', 1)}): " + reasons_text(c.get('reasons') or {}) + "; participants:"
            f" {p['completed']} completed, {p['rating']} rating, "
            f"{p['checking']} at the check, {p['abandoned']} abandoned, {p['declined']} declined, "
            f"{p['screened_out']} screened out, {p['full']} turned away (full), {p['withdrawn']} withdrawn; "
            f"cap {row['cap']} ({row.get('seated', 0)} seated)")
    return lines


@crowd_app.command("completions")
def crowd_completions(study_id: str = typer.Argument(..., metavar="STUDY"),
                      out: Path = typer.Option(..., "--out", "-o", help="CSV written 0600"),
                      everyone: bool = typer.Option(False, "--all", help="every outcome, not only completed")) -> None:
    """The platform ids of completed participants, to approve their payments (the only export holding
    platform ids; screened-out participants are asked to return their submission, never rejected)."""
    from sense7.crowd.participants import Participants

    store = _store()
    study, _ = _study(store, study_id)
    rows = [r for r in Participants(store, study).completions() if everyone or r["outcome"] == "completed"]
    table = [["participant_id", "study_id", "session_id", "outcome", "entered_at", "ended_at"]]
    table += [[r["platform_id"], r["platform_study"] or "", r["platform_session"] or "", r["outcome"],
               r["entered_at"].isoformat() if r["entered_at"] else "", r["ended_at"].isoformat() if r["ended_at"] else ""]
              for r in rows]
    write_private(out, csv_text(table))
    store.log_staff("crowd completions", study=study_id, rows=len(rows), file=str(out))
    console.print(f"{len(rows)} participant(s) written to {out} (mode 0600)", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(crowd_app, name="crowd")
