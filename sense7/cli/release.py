"""`sense7 release`: the study's anonymized data set (`--out DIR`), and its check (`--check DIR`)."""

from __future__ import annotations

from pathlib import Path

import typer

from sense7.cli._common import console, fail, resolve_taxonomy, settings, taxonomy_option


def release(
    out: Path = typer.Option(None, "--out", help="a new or empty folder to write the release into"),
    check: Path = typer.Option(None, "--check", help="verify a release folder instead of writing one"),
    k: int = typer.Option(None, "--k", help="every combination of released traits is shared by at least k raters "
                          "(default 5; with --check: the k the release claims)"),
    taxonomy: Path = taxonomy_option(),
) -> None:
    """Write an anonymized release of the study (ratings, scrubbed conversations, contexts, k-anonymous traits,
    new random rater ids; JSONL and CSV with a schema and a datasheet README the Hugging Face `datasets` loader
    reads), or check one, every file of it: no file outside the release's layout; no e-mail (the raters' own
    too), phone number or other detected personal detail, link secret or hash, rater, conversation or
    platform id of the store, anywhere; k; CSV equal to JSONL; counts that add up.

    Writing goes to a temporary folder renamed into place at the end: a failure leaves nothing behind."""
    from sense7.privacy.release import ReleaseError, build_release, write_release
    from sense7.privacy.release_check import check_release

    if (out is None) == (check is None):
        raise fail("give --out DIR to write a release or --check DIR to verify one", 2)
    if k is not None and k < 2:
        raise fail(f"--k must be at least 2, got {k}", 2)
    cfg = settings()
    tax = resolve_taxonomy(taxonomy, cfg)
    try:
        if check is not None:
            originals = _originals(cfg)
            result = check_release(check, originals, k=k)
            counts = ", ".join(f"{n} {name}" for name, n in result["counts"].items())
            console.print(f"{check}: passes (k={result['k']}; {counts})", highlight=False, markup=False, soft_wrap=True)
            if originals is None:
                console.print(f"note: no study store at {cfg.store_url}: its ids, e-mails and link hashes were not "
                              "looked for", highlight=False, markup=False, soft_wrap=True)
            elif result["ids_matched_whole"]:
                console.print(f"note: {result['ids_matched_whole']} store id(s) too short to tell from a word "
                              "were matched only as whole id values", highlight=False, markup=False, soft_wrap=True)
            return
        k = 5 if k is None else k
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ReleaseError(f"{out}: {'not a folder' if not out.is_dir() else 'not empty'}; "
                               "give a new or empty folder (nothing was written)")
        store = _store(cfg, create=False)
        if store is None:
            raise ReleaseError(f"no study store at {cfg.store_url}: nothing to release (nothing was written)")
        # Participants' choices (sense7.privacy.participation): conversations their owner left out of a release
        # or of the study, anyone else's own ratings they left out, and raters whose withdrawal is not erased
        # yet, are not released.
        from sense7.privacy.participation import ConversationChoices, Withdrawals

        left_out = ConversationChoices(store).out_of_release()
        built = build_release(store.rating_data(tax), tax, k=k, exclude_raters=Withdrawals(store).pending_raters(),
                              exclude_conversations=left_out.conversations, exclude_ratings=left_out.ratings)
        from sense7.privacy.croissant import study_facts

        built.study = study_facts(store, tax, cfg.study)  # the Croissant file's RAI fields: pre-fills, models, crowd
        originals = _originals(cfg)
        written = write_release(built, out, verify=lambda folder: check_release(folder, originals, k=k))
    except ReleaseError as exc:
        raise fail(str(exc), 2)
    store.log_staff("release", k=k, **built.counts(), suppressed_raters=built.suppressed_raters)
    counts = ", ".join(f"{n} {name}" for name, n in built.counts().items())
    console.print(f"Released into {written}: {counts}; traits {k}-anonymous "
                  f"({built.suppressed_raters} rater(s) suppressed); the check passes", highlight=False, markup=False, soft_wrap=True)


def _store(cfg, create: bool):
    """The study's store, or None when its SQLite file does not exist (never created by a check)."""
    from sense7.store.database import Store

    url = cfg.store_url
    if not create and url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return None
    return Store(url)


def _originals(cfg):
    """What the store holds that a release must not (None without a store: never created by a check)."""
    from sense7.privacy.release_check import originals_from_store

    store = _store(cfg, create=False)
    return None if store is None else originals_from_store(store)


def register(app: typer.Typer) -> None:
    app.command("release")(release)
