"""`sense7 evaluate` and `sense7 analyze`: what researchers run on their ratings (or on WASSA 2024)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sense7.cli._common import console, fail, progress, resolve_taxonomy, settings, taxonomy_option
from sense7.cli.research_tables import print_agreement, print_analysis, print_evaluation, print_study, print_trait_audit
from sense7.model.catalog import CATALOG

CONVERSATIONS_HELP = "conversations.jsonl (native format)"
RATINGS_HELP = "ratings.csv: conversation_id, turn_index, rater_id, dimension, rating"
RATERS_HELP = "raters.csv: rater_id, email, profile fields (optional)"
WASSA_HELP = "a directory with the WASSA 2024 CSV files (instead of the native files)"
CONVABUSE_HELP = "ConvAbuse's ConvAbuseEMNLPfull.csv or its directory (instead of the native files)"
ASSIGNMENTS_HELP = ("CSV conversation_id,rater_id: more raters for a conversation line (as `sense7 import "
                    "--assignments`; a rater in ratings.csv without a line of their own shares the conversation's)")


def _load(conversations: Path | None, ratings: Path | None, raters: Path | None, wassa: Path | None,
          taxonomy, need_conversations: bool = True, assignments: Path | None = None,
          convabuse: Path | None = None):
    """(RatingData or ratings frame, data set name); exits 2 with file:line: field: reason on bad input."""
    from sense7.readers.formats import load_native
    from sense7.readers.formats import read_ratings

    if sum(bool(x) for x in (wassa, convabuse, conversations or ratings or raters)) > 1:
        raise fail("give one of --wassa2024, --convabuse or the native files (--conversations/--ratings/--raters)", 2)
    try:
        if wassa:
            from sense7.readers.wassa import load_wassa

            return load_wassa(wassa), "wassa2024"
        if convabuse:
            from sense7.readers.convabuse import load_convabuse

            return load_convabuse(convabuse), "convabuse"
        if ratings is None or (need_conversations and conversations is None):
            missing = "--ratings" if ratings is None else "--conversations"
            raise fail(f"missing {missing} (or give --wassa2024 DIR)", 2)
        for path in (conversations, ratings, raters, assignments):
            if path is not None and not Path(path).is_file():
                raise fail(f"{path}: file not found", 2)
        if assignments is not None and conversations is None:
            raise fail("--assignments needs --conversations (it gives their texts to more raters)", 2)
        if conversations is None:
            return read_ratings(ratings, taxonomy), Path(ratings).stem
        return (load_native(conversations, ratings, raters, taxonomy=taxonomy, assignments_path=assignments),
                Path(ratings).parent.name or Path(ratings).stem)
    except ValueError as exc:  # sense7.readers.formats.FormatError: file:line: field: reason
        raise fail(str(exc), 2)


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    tmp.replace(path)


def _trait_audit(data, tax, folds: int, seed: int, boot: int) -> dict:
    """`evaluate --trait-audit`: each questionnaire item's and trait's cold-start importance (printed as a
    table; the dict goes into --json)."""
    from sense7.research.trait_audit import audit_rating_data

    with progress() as bar:
        job = bar.add_task("Trait audit", total=folds)
        try:
            audit = audit_rating_data(data, tax, n_folds=folds, seed=seed, n_boot=boot,
                                      progress=lambda label: bar.update(job, advance=1, description=label))
        except ValueError as exc:
            raise fail(f"--trait-audit: {exc}", 2)
    print_trait_audit(audit)
    return audit


def _set_text_model(estimators: dict, text_encoder: str | None, relational_weight: str | None,
                    text_alpha: str | None = None, text_vectors: str | None = None) -> None:
    """--text-encoder / --relational-weight / --text-alpha on every estimator that has those parameters (the
    rater models: generic and personalized alike, so that their comparison stays like for like); None: the
    models' own default. An encoder reads and keeps its vectors in --text-vectors (`_vector_cache`)."""
    from sense7.model.features import TEXT_ENCODER_NAMES

    if text_encoder is not None and text_encoder not in TEXT_ENCODER_NAMES:
        raise fail(f"--text-encoder: unknown encoder {text_encoder!r}; choose {', '.join(TEXT_ENCODER_NAMES)}", 2)
    params = {}
    if relational_weight is not None:
        try:
            weight = relational_weight if relational_weight.strip() == "cv" else float(relational_weight)
        except ValueError:
            raise fail(f"--relational-weight: expected a number >= 0 or cv, got {relational_weight!r}", 2)
        if weight != "cv" and not (weight >= 0 and weight != float("inf")):
            raise fail(f"--relational-weight: expected a number >= 0 or cv, got {relational_weight!r}", 2)
        params["relational_weight"] = weight
    if text_alpha is not None:
        from sense7.model import options

        try:
            params["alpha"] = options.text_alpha(text_alpha)
        except ValueError as exc:
            raise fail(f"--text-alpha: {exc}", 2)
    if text_encoder == "minilm":
        from sense7.model.embeddings import embeddings_available

        if not embeddings_available():
            raise fail("--text-encoder minilm needs the optional extra: pip install 'sense7[embeddings]'", 2)
    if text_encoder is not None:
        params["text_encoder"] = None if text_encoder == "ngrams" else text_encoder
    if params.get("text_encoder") is not None:
        from sense7.model.vector_cache import cached_encoder

        params["text_encoder"] = cached_encoder(params["text_encoder"], _vector_cache(text_vectors))
    for estimator in estimators.values():
        own = estimator.get_params() if hasattr(estimator, "get_params") else {}
        estimator.set_params(**{k: v for k, v in params.items() if k in own})


def _vector_cache(text_vectors: str | None):
    """--text-vectors: the file where evaluate keeps the encoder's vectors by text hash (evaluate has no store;
    sense7.store.text_vectors.TextVectorRows.local, 0600), default <SENSE7_HOME>/cache/text-vectors.sqlite; "none":
    every fold embeds its texts again."""
    from sqlalchemy.exc import SQLAlchemyError

    from sense7.model.vector_cache import VectorCache
    from sense7.store.text_vectors import TextVectorRows

    if text_vectors is not None and text_vectors.strip().lower() == "none":
        return None
    path = Path(text_vectors) if text_vectors else settings().home / "cache" / "text-vectors.sqlite"
    if path.is_dir():
        raise fail(f"--text-vectors: {path} is a folder; give a file (or none)", 2)
    try:
        return VectorCache(TextVectorRows.local(path))
    except (OSError, SQLAlchemyError) as exc:
        raise fail(f"--text-vectors: {path} cannot hold text vectors ({type(exc).__name__}: "
                   f"{str(exc).splitlines()[0][:200]})", 2)


def _set_rater_ridge(estimators: dict, rater_ridge: str | None, rater_ridge_from: str) -> None:
    """--rater-ridge / --rater-ridge-from on every estimator that has them (the personalized model)."""
    if rater_ridge is None:
        return
    from sense7.model import options

    try:
        value = options.rater_ridge(rater_ridge)
    except ValueError as exc:
        raise fail(f"--rater-ridge: {exc}", 2)
    if rater_ridge_from not in ("encoder", "text"):
        raise fail(f"--rater-ridge-from: expected encoder or text, got {rater_ridge_from!r}", 2)
    for estimator in estimators.values():
        own = estimator.get_params() if hasattr(estimator, "get_params") else {}
        if "rater_ridge" in own:
            estimator.set_params(rater_ridge=value, rater_ridge_from=rater_ridge_from)


def _model_option(flag: str, help: str):
    """An option of the rater models that stays unset unless given: the models' own default then applies."""
    return typer.Option(None, flag, show_default=False, help=help)


def evaluate_command(
    conversations: Path = typer.Option(None, help=CONVERSATIONS_HELP),
    ratings: Path = typer.Option(None, help=RATINGS_HELP),
    raters: Path = typer.Option(None, help=RATERS_HELP),
    assignments: Path = typer.Option(None, help=ASSIGNMENTS_HELP),
    wassa2024: Path = typer.Option(None, "--wassa2024", help=WASSA_HELP),
    convabuse: Path = typer.Option(None, "--convabuse", help=CONVABUSE_HELP),
    splits: str = typer.Option("known_rater,cold_start",
                               help="comma-separated: known_rater, cold_start, live_replay (new raters' answers "
                                    "replayed in their order through the live posterior; folds by rater)"),
    folds: int = typer.Option(5, min=2, help="cross-validation folds"),
    seed: int = typer.Option(0, help="seed of the fold assignment and the bootstrap"),
    boot: int = typer.Option(1000, min=0, help="bootstrap resamples for the confidence intervals"),
    models: str = typer.Option(None, show_default=False,
                               help="comma-separated subset of the registered models (quicker iterations); "
                                    f"default all: {', '.join(CATALOG.names())}"),
    list_models: bool = typer.Option(False, "--list-models", help="list the registered models and exit"),
    jobs: int = typer.Option(1, min=1, help="fit folds in parallel processes (same results)"),
    repeats: int = typer.Option(1, min=1, help="fold assignments for the within-rater gain (repeated "
                                               "cross-validation: seeds seed, seed + 1, ...); other figures "
                                               "are the first assignment's"),
    replay_ks: str = typer.Option("0,1,2,5,10,20", "--replay-ks",
                                  help="live_replay: the numbers of answers after which the live posterior is "
                                       "scored (the largest is the replayed stream's length)"),
    replay_min_targets: int = typer.Option(5, "--replay-min-targets", min=1,
                                           help="live_replay: a rater takes part with at least this many answers "
                                                "after the stream (all of them are predicted at every k)"),
    json_path: Path = typer.Option(None, "--json", help="write the full result as JSON"),
    report: Path = typer.Option(None, help="write a self-contained HTML report"),
    taxonomy: Path = taxonomy_option(),
    trait_audit: bool = typer.Option(False, "--trait-audit",
                                     help="also audit the raters' traits: how much each trait and questionnaire "
                                          "item lowers the personalized model's cold-start error"),
    text_encoder: str = _model_option("--text-encoder",
                                      "the rater models' text encoder beside the n-grams: ngrams (none: the "
                                      "default), static (token embeddings distilled from the packaged "
                                      "MiniLM) or minilm (sentence embeddings; needs the [embeddings] extra)"),
    relational_weight: str = _model_option("--relational-weight",
                                           "scale of the relational features in the rater models: a number "
                                           ">= 0 (0 = off), or cv (chosen on each training fold); default "
                                           "the models' own (0)"),
    rater_ridge: str = _model_option("--rater-ridge",
                                     "each known rater's own content weights in the personalized model: cv "
                                     "(penalty by inner cross-validation on each training fold, off if it "
                                     "does not help), cv_rater (chosen per rater), cv_rater_1se (per rater, "
                                     "on only if it beats off by one standard error) or a penalty; default off"),
    rater_ridge_from: str = typer.Option("encoder", "--rater-ridge-from",
                                         help="the features of --rater-ridge: encoder (needs --text-encoder "
                                              "minilm) or text (every text feature)"),
    text_vectors: str = typer.Option(None, "--text-vectors",
                                     help="with --text-encoder static or minilm: the file (SQLite) where each "
                                          "text's vector is kept by its hash, so that every fold and run "
                                          "embeds a text once; default <SENSE7_HOME>/cache/text-vectors.sqlite; "
                                          "none: no cache"),
    text_alpha: str = _model_option("--text-alpha",
                                    "the rater models' text ridge penalty: a number, or cv (per control, by "
                                    "inner cross-validation on each training fold; ~4.5x the fit time); "
                                    "default the models' own (10)"),
) -> None:
    """Cross-validate the rater models and the trivial baselines; print metrics with 95% CIs.

    Known raters: folds grouped by conversation. Cold start: folds grouped by rater. Every model is refitted
    on each training fold. Live replay: folds by rater; each test rater's answers in the data's order, the live
    posterior after k of them against the static prediction, the generic model and their running mean."""
    from sense7.research.evaluation import REPLAY_SPLIT, SPLIT_NAMES, SPLITS, default_models, evaluate

    if list_models:
        for kind in CATALOG:
            console.print(f"{kind.name:<14} {kind.role:<9} {kind.label}: {kind.description}".rstrip(": "),
                          highlight=False, markup=False, soft_wrap=True)
        return

    chosen = [s.strip() for s in splits.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SPLIT_NAMES]
    if unknown or not chosen:
        raise fail(f"--splits: unknown split(s) {', '.join(unknown) or '(none given)'}; "
                   f"choose from {', '.join(SPLIT_NAMES)}", 2)
    try:
        ks = sorted({int(k) for k in replay_ks.split(",") if k.strip()})
    except ValueError:
        ks = []
    if not ks or ks[0] < 0:
        raise fail(f"--replay-ks: expected comma-separated counts of answers >= 0, got {replay_ks!r}", 2)
    try:
        estimators = default_models(None if models is None else [m.strip() for m in models.split(",") if m.strip()])
    except ValueError as exc:
        raise fail(f"--models: {exc}", 2)
    if REPLAY_SPLIT in chosen and "personalized" not in estimators:
        raise fail(f"--splits {REPLAY_SPLIT} replays the personalized model: add personalized to --models", 2)
    _set_text_model(estimators, text_encoder, relational_weight, text_alpha, text_vectors)
    _set_rater_ridge(estimators, rater_ridge, rater_ridge_from)
    tax = resolve_taxonomy(taxonomy)
    data, name = _load(conversations, ratings, raters, wassa2024, tax, assignments=assignments, convabuse=convabuse)
    with progress() as bar:
        pair = int("generic" in estimators and "personalized" in estimators)
        crossed = [s for s in chosen if s in SPLITS]
        job = bar.add_task("Cross-validating",
                           total=len(crossed) * folds * (len(estimators) + 2 * pair * (repeats - 1))
                           + folds * (REPLAY_SPLIT in chosen))
        try:
            result = evaluate(data, splits=chosen, n_folds=folds, seed=seed, n_boot=boot, models=estimators,
                              n_jobs=jobs, taxonomy=tax, repeats=repeats, replay_ks=ks,
                              replay_min_targets=replay_min_targets,
                              dataset=name, progress=lambda label: bar.update(job, advance=1, description=label))
        except ValueError as exc:
            raise fail(str(exc), 2)
    print_evaluation(result)
    if trait_audit:
        result["trait_audit"] = _trait_audit(data, tax, folds, seed, boot)
    if json_path:
        _write_json(json_path, result)
        console.print(f"JSON: {json_path}")
    if report:
        from sense7.research.report import write_report

        write_report(result, report)
        console.print(f"Report: {report}")


def analyze_command(
    conversations: Path = typer.Option(None, help=CONVERSATIONS_HELP + " (optional here)"),
    ratings: Path = typer.Option(None, help=RATINGS_HELP),
    raters: Path = typer.Option(None, help=RATERS_HELP + " (not used)"),
    assignments: Path = typer.Option(None, help=ASSIGNMENTS_HELP),
    wassa2024: Path = typer.Option(None, "--wassa2024", help=WASSA_HELP),
    seed: int = typer.Option(0, help="bootstrap seed"),
    boot: int = typer.Option(1000, min=10, help="bootstrap resamples for the confidence intervals"),
    json_path: Path = typer.Option(None, "--json", help="write the full result as JSON"),
    taxonomy: Path = taxonomy_option(),
    study: bool = typer.Option(False, "--study", help="analyze the running study in SENSE7_HOME's store instead of "
                               "files: anchoring by the pre-fill, live accuracy, rater quality, agreement"),
    report: Path = typer.Option(None, help="with --study: write an HTML report here"),
) -> None:
    """Variance shares (rater / conversation / turn), rating changes after failures, agreement.

    Per control: method-of-moments shares of rating variance due to the rater, the conversation and the
    rest; how ratings move on and after a continuity failure (continuity <= 2) or an unmet expectation,
    against the rater's baseline and against the same conversation's earlier turns; Krippendorff's alpha
    where turns have several raters. With --study: the running study's anchoring, live evaluation and
    rater quality (sense7.research.study_analysis)."""
    from sense7.research.analysis import analyze

    tax = resolve_taxonomy(taxonomy)
    if study:
        return _analyze_study(tax, seed, boot, json_path, report)
    if report:
        raise fail("--report needs --study (for files, `sense7 evaluate --report` draws the model comparison)", 2)
    loaded, name = _load(conversations, ratings, raters, wassa2024, tax, need_conversations=False,
                         assignments=assignments)
    frame = getattr(loaded, "ratings", loaded)
    try:
        result = analyze(frame, n_boot=boot, seed=seed, dataset=name, taxonomy=tax)
    except ValueError as exc:  # e.g. no ratings in the file
        raise fail(str(exc), 2)
    print_analysis(result)
    result["agreement"] = _agreement(frame, tax, boot, seed)
    if json_path:
        _write_json(json_path, result)
        console.print(f"JSON: {json_path}")


def _agreement(frame, tax, boot: int, seed: int) -> dict | None:
    """Krippendorff's alpha per control where turns have several raters, printed; None when no control was
    rated."""
    from sense7.research.agreement import krippendorff_alpha

    rated = frame[frame["dimension"].isin(tax.controls)]
    if rated.empty:
        return None
    result = krippendorff_alpha(rated, list(range(1, tax.levels + 1)), n_boot=boot, seed=seed)
    print_agreement(result)
    return result


def _analyze_study(tax, seed: int, boot: int, json_path: Path | None, report: Path | None) -> None:
    from sense7.store.database import Store
    from sense7.research.study_analysis import analyze_study

    cfg = settings()
    result = analyze_study(Store(cfg.store_url), tax, cfg.quality, n_boot=boot, seed=seed)
    print_study(result)
    if json_path:
        _write_json(json_path, result)
        console.print(f"JSON: {json_path}")
    if report:
        from sense7.research.study_report import write_study_report

        console.print(f"Report: {write_study_report(result, report)}")


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate_command)
    app.command("analyze")(analyze_command)
