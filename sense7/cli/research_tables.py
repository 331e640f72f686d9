"""The research commands' results as tables (`sense7 evaluate`, `sense7 analyze`, `analyze --study`).

Each function prints one result dict of sense7.research (the same dict `--json` writes) on the console;
nothing here computes anything.
"""

from __future__ import annotations

from rich.table import Table

from sense7.cli._common import console
from sense7.model.catalog import CATALOG


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


def _plus_minus(value, ci) -> str:
    """"+0.012 ±0.004": a value and half its CI's width, narrow enough for an 80-column terminal."""
    if value is None:
        return "n/a"
    return f"{value:+.3f}" + ("" if ci[0] is None else f" ±{(ci[1] - ci[0]) / 2:.3f}")


def print_evaluation(result: dict) -> None:
    """`evaluate`: the data set, then per split the models' overall metrics, the paired personalized -
    generic difference and the per-rater and per-turn metrics."""
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
    if result.get("live_replay"):
        print_live_replay(result["live_replay"])


def print_live_replay(replay: dict) -> None:
    """`evaluate --splits live_replay`: per k, the models' MAE on the same later answers, live minus the others
    (paired, "value ±half the 95% CI") and Spearman; every figure's CI is in --json and the report."""
    table = Table(title=f"live_replay ({replay['n_folds']} folds by rater): MAE on each rater's later answers",
                  caption=f"raters: with k + {replay['min_targets']} answers or more ({replay['n_eligible']} of "
                          f"{replay['n_raters']} at k = 0, {replay['n_full_stream']} with all "
                          f"{replay['stream_length']}); answers in {replay['order']}; mean over raters")
    models = ("live", "static", "running_mean", "running_median", "generic", "global_mean")
    for column in ("k", "raters", "live", "static", "run. mean", "run. median", "generic", "global mean"):
        table.add_column(column, justify="right")
    for point in replay["curve"]:
        table.add_row(str(point["k"]), str(point["n_raters"]), *(_num(point["mae"][m]["value"]) for m in models))
    console.print(table)
    minus = Table(title="live_replay: live minus each (paired, ±half the 95% CI)")
    others = ("static", "running_mean", "running_median", "generic")
    for column in ("k", "MAE - static", "- run. mean", "- run. median", "- generic", "Spearman - static"):
        minus.add_column(column, justify="right")
    for point in replay["curve"]:
        diff = point["live_minus"]
        minus.add_row(str(point["k"]), *(_plus_minus(diff[m]["mae"]["value"], diff[m]["mae"]["ci"]) for m in others),
                      _plus_minus(diff["static"]["spearman"]["value"], diff["static"]["spearman"]["ci"]))
    console.print(minus)
    ranks = Table(title="live_replay: Spearman (expected rating; a fold's raters pooled)")
    for column in ("k", "live", "static", "run. mean", "generic"):
        ranks.add_column(column, justify="right")
    for point in replay["curve"]:
        ranks.add_row(str(point["k"]), *(_num(point["spearman"][m]["value"])
                                         for m in ("live", "static", "running_mean", "generic")))
    console.print(ranks)


def _print_perspectivist(split: dict) -> None:
    """Per-rater and per-turn metrics (sense7.research.perspectivist) under a split's main table."""
    block = split.get("perspectivist")
    if not block:
        return
    table = Table(title="per rater and per turn (lower is better)",
                  caption="mean ± half its 95% CI. ANAD, WS = LeWiDi 2025's scores (|d| / levels per turn's "
                          "raters, mean over turns; Wasserstein in levels on turns with several raters; "
                          "conversations resampled); sense7's own: dist. = |d| / (levels - 1), mean over raters "
                          "(raters resampled); W 0-1 = WS / (levels - 1). Distances use the predicted median.")
    for column in ("model", "ANAD", "WS", "dist.", "W 0-1", "turns"):
        table.add_column(column, justify="left" if column == "model" else "right", no_wrap=True)

    def cell(block: dict | None) -> str:  # "0.145 ±0.017": the mean and half its 95% CI (exact in --json)
        block = block or {}
        if block.get("mean") is None:
            return "n/a"
        lo, hi = block.get("ci") or (None, None)
        return f"{block['mean']:.3f}" + ("" if lo is None else f" ±{(hi - lo) / 2:.3f}")

    for model in CATALOG.order(block["models"]):
        m = block["models"][model]
        table.add_row(model, cell(m.get("lewidi_anad")), cell(m.get("lewidi_wasserstein")),
                      cell(m["rater_mean_distance"]), cell(m["wasserstein_01"]),
                      str((m["wasserstein_01"] or {}).get("n_turns", 0)))
    console.print(table)
    gain = block.get("personalization_gain") or {}
    for key, what in (("distance", "distance (generic - personalized)"),
                      ("spearman", "within-rater Spearman (personalized - generic)")):
        if gain.get(key):
            g = gain[key]
            console.print(f"personalization gain per rater, {what}: {g['mean']:+.3f} {_ci(g['ci'])}; "
                          f"of {g['n_raters']} raters {g['share_gain']:.0%} gain, {g['share_loss']:.0%} lose")
    repeated = block.get("personalization_gain_repeated")
    if repeated:
        each = ", ".join("n/a" if v is None else f"{v:+.3f}" for v in repeated["per_assignment"])
        console.print(f"within-rater Spearman gain over {repeated['repeats']} fold assignments (seeds "
                      f"{repeated['seeds'][0]}-{repeated['seeds'][-1]}): {repeated['mean']:+.3f} {_ci(repeated['ci'])}; "
                      f"of {repeated['n_raters']} raters {repeated['share_gain']:.0%} gain; each assignment alone: {each}")
        means = ", ".join(f"{name} {block['mean']:.3f}" for name, block in (repeated.get("model_spearman") or {}).items()
                          if block.get("mean") is not None)
        if means:
            console.print(f"Spearman averaged over the {repeated['repeats']} fold assignments: {means}")


def print_trait_audit(audit: dict) -> None:
    """`evaluate --trait-audit`: each questionnaire item's and trait's cold-start importance, sorted by
    importance (features that are not an item of their own, e.g. Big Five scores, below)."""
    if not audit["features"]:
        console.print("Trait audit: the raters have no traits, nothing to audit.")
        return
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


def print_analysis(result: dict) -> None:
    """`analyze` on files: variance shares per control and the rating changes after failures."""
    console.print(f"{result['dataset']}: {result['n_ratings']} ratings by {result['n_raters']} raters")
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


def print_agreement(result: dict) -> None:
    """Krippendorff's alpha per control, or why there is none."""
    rows = [(c, b) for c, b in result["controls"].items() if b["alpha"] is not None]
    if not rows:
        console.print("No turn was rated by more than one rater: no agreement to measure.")
        return
    table = Table(title="Agreement: Krippendorff's alpha (ordinal) on turns with several raters",
                  caption="[95% CI, conversations resampled]")
    for column in ("control", "alpha", "95% CI", "turns", "raters"):
        table.add_column(column, justify="left" if column == "control" else "right")
    for control, b in rows:
        table.add_row(control, _num(b["alpha"]), _ci(b["ci"]), str(b["n_units"]), str(b["n_raters"]))
    console.print(table)


def print_crowd_coverage(studies: list[dict]) -> None:
    """Per crowd study: how many conversations have how many raters so far, and why (the policy's reasons)."""
    from sense7.cli.crowd import reasons_text

    for study in studies:
        by_k: dict[int, int] = {}
        for conversation in study["conversations"].values():
            by_k[conversation["k_so_far"]] = by_k.get(conversation["k_so_far"], 0) + 1
        console.print(f"crowd study {study['study']} ({study['policy']}, K {study['k']}, floor {study['floor']}): "
                      "conversations with " + ", ".join(f"{k} raters: {n}" for k, n in sorted(by_k.items()))
                      + "; why: " + reasons_text(study["reasons"]), highlight=False)


def print_study(result: dict) -> None:
    """`analyze --study`: the arms, anchoring, live evaluation and rater quality of the running study."""
    console.print(f"{result['n_rated_tasks']} rated tasks by {result['n_raters']} raters; pre-fill arms: "
                  f"{result['arms']['shown']} shown, {result['arms']['hidden']} hidden tasks", highlight=False)
    print_crowd_coverage(result.get("crowd") or [])
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
    gain = result.get("live_gain")
    if gain and gain.get("bins"):
        table = Table(title="Live pre-fills: MAE on hidden-arm ratings by the rater's own earlier ratings",
                      caption="live = served version + the rater's answers so far; static = served version; "
                              "[95% CI, raters resampled]")
        for column in ("own earlier ratings", "ratings", "raters", "live", "static", "generic", "live - static"):
            table.add_column(column, justify="left" if column == "own earlier ratings" else "right")
        for b in gain["bins"]:
            table.add_row(b["own_ratings"], str(b["n"]), str(b["n_raters"]),
                          *(_num(b["mae"][m]["value"]) for m in ("live", "static", "generic")),
                          f"{_num(b['live_minus_static']['value'])} {_ci(b['live_minus_static']['ci'])}")
        console.print(table)
    flagged = result["quality"]["flagged"]
    raters = result["quality"]["raters"]
    console.print("Rater quality: " + ("; ".join(f"{r}: {', '.join(f['flag'] for f in raters[r]['flags'])}"
                                                  for r in flagged) or "no rater flagged"), highlight=False)
