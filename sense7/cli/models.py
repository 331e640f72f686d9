"""`sense7 models list`: the trained model versions, their held-out metrics and their live accuracy.
`sense7 models encoder`: make (or find) the static text encoder's table ahead of its first use."""

from __future__ import annotations

import typer

from sense7.cli._common import console, resolve_taxonomy, settings

models_app = typer.Typer(help="Trained model versions and their held-out metrics.", no_args_is_help=True)


@models_app.command("list")
def list_models() -> None:
    """Model versions (oldest first) with held-out metrics, the served version's and the baseline's."""
    from rich.table import Table

    from sense7.model.registry import ModelRegistry

    cfg = settings()
    registry = ModelRegistry.from_settings(cfg)
    versions = registry.list_versions()
    if not versions:
        console.print("No model versions in the store yet: run `sense7 retrain`.")
        return

    def fmt(value) -> str:
        return "-" if value is None else f"{value:.3f}"

    live = _live_metrics(cfg)
    table = Table("version", "serving", "trained", "reason", "items", "Spearman", "accuracy", "served Spearman",
                  "baseline acc.", "promoted", "live Spearman: pers. / generic / rater mean (n)",
                  caption="Spearman..promoted: held-out slice at training time. Live: ratings of the study's hidden "
                          "arm, predicted by that version before the rater saw the task.")
    for v in versions:
        m = v.metrics or {}
        macro = (m.get("holdout") or {}).get("macro") or {}
        served = (m.get("served_on_holdout") or {})
        baseline = ((m.get("baseline_majority") or {}).get("macro") or {})
        table.add_row(v.name, "*" if v.current else "", m.get("trained_at", "-"), str(m.get("reason", "-")),
                      str(m.get("n_train_items", "-")), fmt(macro.get("spearman")), fmt(macro.get("accuracy")),
                      f"{served.get('version')}: {fmt((served.get('macro') or {}).get('spearman'))}" if served else "-",
                      fmt(baseline.get("accuracy")), {True: "yes", False: "no"}.get(m.get("promoted"), "-"),
                      _live_cell(live.get(v.name), fmt))
    console.print(table)


def _live_metrics(cfg) -> dict:
    """Live evaluation per version from the store (empty when the store has none or cannot be read)."""
    from sense7.store.database import Store
    from sense7.research.study_analysis import live_by_version

    return live_by_version(Store(cfg.store_url), resolve_taxonomy(cfg=cfg))


def _live_cell(block: dict | None, fmt) -> str:
    if not block:
        return "-"
    spearman = [fmt(((block["models"].get(m) or {}).get("overall") or {}).get("spearman"))
                for m in ("personalized", "generic", "rater_mean")]
    return f"{' / '.join(spearman)} ({block['n_ratings']})"


@models_app.command("encoder")
def build_encoder() -> None:
    """Make the static text encoder's table from the packaged MiniLM once (or find it): a minute or two on
    2 cores the first time, then read from its cache file (sense7.model.static_embeddings)."""
    from sense7.cli._common import fail
    from sense7.model.static_embeddings import build

    try:
        made = build()
    except (ImportError, FileNotFoundError, ValueError) as exc:
        raise fail(f"static text encoder: {exc}", 1)
    verb = f"built in {made['seconds']:.1f} s" if made["built"] else "already built"
    console.print(f"static text encoder: {made['shape'][0]} tokens x {made['shape'][1]} dimensions, {verb}: "
                  f"{made['path']}", highlight=False, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
