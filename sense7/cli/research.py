"""`sense7 evaluate` and `sense7 analyze`: what researchers run on their ratings (or on WASSA 2024)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from sense7.cli._common import console, fail, progress
from sense7.model.catalog import CATALOG

CONVERSATIONS_HELP = "conversations.jsonl (native format)"
RATINGS_HELP = "ratings.csv: conversation_id, turn_index, rater_id, dimension, rating"
RATERS_HELP = "raters.csv: rater_id, email, profile fields (optional)"
WASSA_HELP = "a directory with the WASSA 2024 CSV files (instead of the native files)"
ASSIGNMENTS_HELP = ("CSV conversation_id,rater_id: more raters for a conversation line (as `sense7 import "
                    "--assignments`; a rater in ratings.csv without a line of their own shares the conversation's)")
TAXONOMY_HELP = "the study's taxonomy YAML: its controls and scale (default: SENSE7_TAXONOMY, else the packaged one)"


def _taxonomy(path: Path | None):
    """The study's taxonomy (--taxonomy, else SENSE7_TAXONOMY, else the packaged file); exits 2 when bad."""
    from sense7.taxonomy import TaxonomyError, study_taxonomy

    try:
        return study_taxonomy(path=path)
    except TaxonomyError as exc:
        raise fail(str(exc), 2)


def _load(conversations: Path | None, ratings: Path | None, raters: Path | None, wassa: Path | None,
          need_conversations: bool = True, taxonomy=None, assignments: Path | None = None):
    """(RatingData or ratings frame, data set name); exits 2 with file:line: field: reason on bad input."""
    from sense7.data.dataset import load_native
    from sense7.data.formats import read_ratings

    if wassa and (conversations or ratings or raters):
        raise fail("give either --wassa2024 or the native files (--conversations/--ratings/--raters), not both", 2)
    try:
        if wassa:
            from sense7.data.wassa import load_wassa

            return load_wassa(wassa), "wassa2024"
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
        return (load_native(conversations, ratings, raters, taxonomy, assignments),
                Path(ratings).parent.name or Path(ratings).stem)
    except ValueError as exc:  # sense7.data.formats.FormatError: file:line: field: reason
        raise fail(str(exc), 2)


def _ci(ci) -> str:
    return "n/a" if ci is None or ci[0] is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _share(value: float, ci) -> str:
    if ci[0] is None:
        return f"{value:.0%}"
    return f"{value:.0%} [{ci[0]:.0%}-{ci[1]:.0%}]"


def _change(row: dict) -> str:
    """A compact "mean ± half-CI" cell, so four offsets fit an 80-column terminal."""
    if not row["n"] or row["mean_change"] is None:
        return "n/a"
    lo, hi = row["ci"]
    return f"{row['mean_change']:+.2f} ±{(hi - lo) / 2:.2f}"


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    tmp.replace(path)


def _print_perspectivist(split: dict) -> None:
    """Per-rater and per-turn metrics (sense7.research.perspectivist) under a split's main table."""
    block = split.get("perspectivist")
    if not block:
        return
    table = Table(title="per rater and per turn (lower is better)",
                  caption="dist. = |predicted - rated level| / (levels - 1), mean over raters [95% CI, raters "
                          "resampled]; W1 = Wasserstein-1 on turns with several raters [95% CI, conversations]")
    for column in ("model", "dist.", "95% CI", "median", "W1", "95% CI ", "turns"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for model in CATALOG.order(block["models"]):
        d = block["models"][model]["rater_distance"] or {}
        w = block["models"][model]["wasserstein"] or {}
        table.add_row(model, _num(d.get("mean")), _ci(d.get("ci")), _num((d.get("quantiles") or {}).get("p50")),
                      _num(w.get("mean")), _ci(w.get("ci")), str(w.get("n_turns", 0)))
    console.print(table)
    gain = block.get("personalization_gain") or {}
    for key, what in (("distance", "distance (generic - personalized)"),
                      ("spearman", "within-rater Spearman (personalized - generic)")):
        if gain.get(key):
            g = gain[key]
            console.print(f"personalization gain per rater, {what}: {g['mean']:+.3f} {_ci(g['ci'])}; "
                          f"of {g['n_raters']} raters {g['share_gain']:.0%} gain, {g['share_loss']:.0%} lose")


def _plus_minus(value, ci) -> str:
    """"+0.012 ±0.004": a value and half its CI's width, narrow enough for an 80-column terminal."""
    if value is None:
        return "n/a"
    return f"{value:+.3f}" + ("" if ci[0] is None else f" ±{(ci[1] - ci[0]) / 2:.3f}")


def _trait_audit(data, tax, folds: int, seed: int, boot: int) -> dict:
    """`evaluate --trait-audit`: each questionnaire item's and trait's cold-start importance, as a table
    sorted by importance (features that are not an item of their own, e.g. Big Five scores, below)."""
    from sense7.research.trait_audit import audit_rating_data

    with progress() as bar:
        job = bar.add_task("Trait audit", total=folds)
        try:
            audit = audit_rating_data(data, tax, n_folds=folds, seed=seed, n_boot=boot,
                                      progress=lambda label: bar.update(job, advance=1, description=label))
        except ValueError as exc:
            raise fail(f"--trait-audit: {exc}", 2)
    if not audit["features"]:
        console.print("Trait audit: the raters have no traits, nothing to audit.")
        return audit
    table = Table(title=f"Trait audit: cold-start MAE increase when shuffled ({audit['method']}; > 0 = the trait "
                        "helps new raters)",
                  caption=f"mean over {audit['n_raters']} raters ± half the 95% CI (raters resampled; exact bounds "
                          f"in --json); baseline MAE {_num(audit['baseline']['mae'])}; d rho = Spearman lost")
    items = {u["name"] for u in audit["items"]}
    rows = []
    for u in audit["items"] + [{**u, "level": "feature"} for u in audit["features"] if u["name"] not in items]:
        feeds = "(trait feature)" if u.get("level") == "feature" else ", ".join(u.get("features", []))
        rows.append([u["name"], _plus_minus(u["importance"], u["ci"]), _num(u["importance_spearman"]),
                     "" if feeds == u["name"] else feeds])
    columns = ("trait", "importance", "d rho", "feeds") if any(row[3] for row in rows) else ("trait", "importance",
                                                                                            "d rho")
    for column in columns:
        table.add_column(column, justify="right" if column in ("importance", "d rho") else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row[:len(columns)])
    console.print(table)
    return audit


def evaluate_command(
    conversations: Path = typer.Option(None, help=CONVERSATIONS_HELP),
    ratings: Path = typer.Option(None, help=RATINGS_HELP),
    raters: Path = typer.Option(None, help=RATERS_HELP),
    assignments: Path = typer.Option(None, help=ASSIGNMENTS_HELP),
    wassa2024: Path = typer.Option(None, "--wassa2024", help=WASSA_HELP),
    splits: str = typer.Option("known_rater,cold_start", help="comma-separated: known_rater, cold_start"),
    folds: int = typer.Option(5, min=2, help="cross-validation folds"),
    seed: int = typer.Option(0, help="seed of the fold assignment and the bootstrap"),
    boot: int = typer.Option(1000, min=0, help="bootstrap resamples for the confidence intervals"),
    models: str = typer.Option(None, show_default=False,
                               help="comma-separated subset of the registered models (quicker iterations); "
                                    f"default all: {', '.join(CATALOG.names())}"),
    list_models: bool = typer.Option(False, "--list-models", help="list the registered models and exit"),
    jobs: int = typer.Option(1, min=1, help="fit folds in parallel processes (same results)"),
    json_path: Path = typer.Option(None, "--json", help="write the full result as JSON"),
    report: Path = typer.Option(None, help="write a self-contained HTML report"),
    taxonomy: Path = typer.Option(None, help=TAXONOMY_HELP),
    trait_audit: bool = typer.Option(False, "--trait-audit",
                                     help="also audit the raters' traits: how much each trait and questionnaire "
                                          "item lowers the personalized model's cold-start error"),
) -> None:
    """Cross-validate the rater models and the trivial baselines; print metrics with 95% CIs.

    Known raters: folds grouped by conversation. Cold start: folds grouped by rater. Every model is refitted
    on each training fold."""
    from sense7.research.evaluation import SPLITS, default_models, evaluate

    if list_models:
        for kind in CATALOG:
            console.print(f"{kind.name:<14} {kind.role:<9} {kind.label}: {kind.description}".rstrip(": "),
                          highlight=False, markup=False, soft_wrap=True)
        return

    chosen = [s.strip() for s in splits.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SPLITS]
    if unknown or not chosen:
        raise fail(f"--splits: unknown split(s) {', '.join(unknown) or '(none given)'}; "
                   f"choose from {', '.join(SPLITS)}", 2)
    try:
        estimators = default_models(None if models is None else [m.strip() for m in models.split(",") if m.strip()])
    except ValueError as exc:
        raise fail(f"--models: {exc}", 2)
    tax = _taxonomy(taxonomy)
    data, name = _load(conversations, ratings, raters, wassa2024, taxonomy=tax, assignments=assignments)
    with progress() as bar:
        job = bar.add_task("Cross-validating", total=len(chosen) * len(estimators) * folds)
        try:
            result = evaluate(data, splits=chosen, n_folds=folds, seed=seed, n_boot=boot, models=estimators,
                              n_jobs=jobs, taxonomy=tax,
                              dataset=name, progress=lambda label: bar.update(job, advance=1, description=label))
        except ValueError as exc:
            raise fail(str(exc), 2)
    console.print(f"{result['dataset']}: {result['n_ratings']} ratings, {result['n_items']} items, "
                  f"{result['n_raters']} raters, {result['n_conversations']} conversations; "
                  f"controls {', '.join(result['controls'])}; scale {result['levels'][0]}-{result['levels'][-1]}")
    for split_name, split in result["splits"].items():
        table = Table(title=f"{split_name} ({split['n_folds']} folds by {split['cluster']}), "
                            "overall = mean over controls",
                      caption="acc. = accuracy; fit s = seconds to fit and predict all folds")
        for column in ("model", "Spearman", "95% CI", "acc.", "QWK", "MAE", "fit s"):
            table.add_column(column, justify="left" if column == "model" else "right")
        for model in CATALOG.order(split["models"]):
            o = split["models"][model]["overall"]
            table.add_row(model, _num(o["spearman"]), _ci(o["spearman_ci"]), _num(o["accuracy"]), _num(o["qwk"]),
                          _num(o["mae"]), f"{split['fit_predict_seconds'][model]:.1f}")
        console.print(table)
        paired = split["paired"].get("personalized_minus_generic")
        if paired and paired["spearman"] is not None:
            console.print(f"personalized - generic Spearman: {paired['spearman']:+.3f} {_ci(paired['ci'])} "
                          "(paired bootstrap)")
        _print_perspectivist(split)
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
    taxonomy: Path = typer.Option(None, help=TAXONOMY_HELP),
    study: bool = typer.Option(False, "--study", help="analyze the running study in SENSE7_HOME's store instead of "
                               "files: anchoring by the pre-fill, live accuracy, rater quality, agreement"),
    report: Path = typer.Option(None, help="with --study: write an HTML report here"),
) -> None:
    """Variance shares (rater / conversation / turn), rating changes after failures, agreement.

    Per control: method-of-moments shares of rating variance due to the rater, the conversation and the
    rest; how ratings move on and after a continuity failure (continuity <= 2) or an unmet expectation,
    against the rater's baseline and against the same conversation's earlier turns; Krippendorff's alpha
    where turns have several raters. With --study: the running study's anchoring, live evaluation and
    rater quality (sense7.research.study)."""
    from sense7.research.analysis import analyze

    tax = _taxonomy(taxonomy)
    if study:
        return _analyze_study(tax, seed, boot, json_path, report)
    if report:
        raise fail("--report needs --study (for files, `sense7 evaluate --report` draws the model comparison)", 2)
    loaded, name = _load(conversations, ratings, raters, wassa2024, need_conversations=False, taxonomy=tax,
                         assignments=assignments)
    frame = getattr(loaded, "ratings", loaded)
    try:
        result = analyze(frame, n_boot=boot, seed=seed, dataset=name, taxonomy=tax)
    except ValueError as exc:  # e.g. no ratings in the file
        raise fail(str(exc), 2)
    console.print(f"{name}: {result['n_ratings']} ratings by {result['n_raters']} raters")
    components = result["variance_components"]
    levels = sorted({vc["level"] for vc in components.values()})
    sizes = sorted({vc["n"] for vc in components.values()})
    table = Table(title="Variance shares (method of moments; residual = what rater and conversation do not "
                        "explain: turn-to-turn differences, rater x conversation, noise)",
                  caption=f"[95% CI, raters resampled]; ratings of "
                          f"{' / '.join('single turns' if v == 'turn' else 'whole conversations' for v in levels)}, "
                          f"n = {', '.join(map(str, sizes[:3]))}{'...' if len(sizes) > 3 else ''} per control")
    table.add_column("control", min_width=15)
    for column in ("rater", "conversation", "residual"):
        table.add_column(column, justify="right")
    for control, vc in components.items():
        table.add_row(control, *(_share(vc["share"][k], vc["share_ci"][k])
                                 for k in ("rater", "conversation", "residual")))
    console.print(table)
    for event, info in result["after_events"].items():
        what = f"{event.replace('_', ' ')} ({info['n_events']} events, {info['n_raters']} raters)"
        for title, pick in ((f"Change after {what}, vs the rater's baseline", lambda r: r),
                            (f"Change after {what}, vs the same conversation's earlier turns",
                             lambda r: r["vs_earlier"])):
            table = Table(title=title,
                          caption="± = half the width of the 95% CI (raters resampled); exact bounds in --json")
            table.add_column("control", min_width=15)
            offsets = [row["offset"] for row in next(iter(info["controls"].values()), [])]
            for k in offsets:
                table.add_column("that turn" if k == 0 else f"+{k} turn{'s' if k > 1 else ''}", justify="right")
            for control, rows in info["controls"].items():
                table.add_row(control, *(_change(pick(r)) for r in rows))
            console.print(table)
    if not result["after_events"]:
        console.print("No per-turn continuity or expectation ratings: nothing to say about failures.")
    result["agreement"] = _agreement(frame, tax, boot, seed)
    if json_path:
        _write_json(json_path, result)
        console.print(f"JSON: {json_path}")


def _agreement(frame, tax, boot: int, seed: int) -> dict | None:
    """Krippendorff's alpha per control where turns have several raters, printed; None when none has."""
    from sense7.research.agreement import krippendorff_alpha

    rated = frame[frame["dimension"].isin(tax.controls)]
    if rated.empty:
        return None
    result = krippendorff_alpha(rated, list(range(1, tax.levels + 1)), n_boot=boot, seed=seed)
    rows = [(c, b) for c, b in result["controls"].items() if b["alpha"] is not None]
    if not rows:
        console.print("No turn was rated by more than one rater: no agreement to measure.")
        return result
    table = Table(title="Agreement: Krippendorff's alpha (ordinal) on turns with several raters",
                  caption="[95% CI, conversations resampled]")
    for column in ("control", "alpha", "95% CI", "turns", "raters"):
        table.add_column(column, justify="left" if column == "control" else "right")
    for control, b in rows:
        table.add_row(control, _num(b["alpha"]), _ci(b["ci"]), str(b["n_units"]), str(b["n_raters"]))
    console.print(table)
    return result


def _analyze_study(tax, seed: int, boot: int, json_path: Path | None, report: Path | None) -> None:
    from sense7.cli._common import settings
    from sense7.data.store import Store
    from sense7.research.study import analyze_study

    cfg = settings()
    result = analyze_study(Store(cfg.store_url), tax, cfg.quality, n_boot=boot, seed=seed)
    console.print(f"{result['n_rated_tasks']} rated tasks by {result['n_raters']} raters; pre-fill arms: "
                  f"{result['arms']['shown']} shown, {result['arms']['hidden']} hidden tasks", highlight=False)
    anchoring = result["anchoring"]
    if anchoring:
        table = Table(title="Anchoring: ratings vs the recorded prediction, by pre-fill arm",
                      caption="shift = distance (hidden) - distance (shown); copy rate = estimated probability "
                              "of keeping a shown pre-fill; [95% CI, raters resampled]")
        for column in ("control", "equal: shown", "equal: hidden", "shift toward prediction", "copy rate"):
            table.add_column(column, justify="left" if column == "control" else "right")
        for control, block in anchoring["controls"].items():
            arms = block["arms"]
            table.add_row("all controls" if control == "__all__" else control,
                          *(_num((arms.get(a) or {}).get("share_equal")) for a in ("shown", "hidden")),
                          *(f"{_num(block[k]['value'])} {_ci(block[k]['ci'])}" for k in
                            ("shift_toward_prediction", "copy_rate")))
        console.print(table)
    live = result["live"]
    if live and live.get("versions"):
        table = Table(title="Live evaluation on hidden-arm ratings (the models the raters met)",
                      caption="[95% CI, raters resampled]")
        for column in ("version", "ratings", "model", "Spearman", "QWK", "MAE"):
            table.add_column(column, justify="left" if column in ("version", "model") else "right")
        for version, block in live["versions"].items():
            for model, metrics in block["models"].items():
                o = metrics["overall"]
                table.add_row(version, str(block["n_ratings"]), model, f"{_num(o['spearman'])} {_ci(o['spearman_ci'])}",
                              _num(o["qwk"]), _num(o["mae"]))
        console.print(table)
    else:
        console.print("Live evaluation: no hidden-arm rating with a recorded prediction yet.")
    flagged = result["quality"]["flagged"]
    raters = result["quality"]["raters"]
    console.print("Rater quality: " + ("; ".join(f"{r}: {', '.join(f['flag'] for f in raters[r]['flags'])}"
                                                  for r in flagged) or "no rater flagged"), highlight=False)
    if json_path:
        _write_json(json_path, result)
        console.print(f"JSON: {json_path}")
    if report:
        from sense7.research.study_report import write_study_report

        console.print(f"Report: {write_study_report(result, report)}")


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate_command)
    app.command("analyze")(analyze_command)
