"""A self-contained HTML report of an `evaluate` result: one file, plots inline, no network assets.

Figures are drawn with matplotlib's Agg backend and embedded as base64 PNG, so the report opens offline
and can be mailed around. The SENSE-7 paper's figures are drawn as reference lines and always labelled as
coming from another data set: they are context, not a target the numbers here are comparable to.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import jinja2
import matplotlib

matplotlib.use("Agg")  # no display, no GUI toolkit: the report must build on a headless server
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sense7.model.catalog import CATALOG, Catalog  # noqa: E402

PAPER_LABEL = "SENSE-7 paper, another data set (LLM classifier)"
PAPER_SPEARMAN = 0.369
PAPER_ACCURACY = 0.487  # on 5 levels
SPLIT_LABELS = {"known_rater": "Known raters (folds by conversation)",
                "cold_start": "Cold start (folds by rater)"}  # the live replay has its own section


def png_data_uri(fig) -> str:
    """A matplotlib figure as a data: URI (the reports are one self-contained HTML file); closes the figure."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


# Model names, labels, colours, order and roles come from the catalog (sense7.model.catalog): every
# function below takes the catalog to read, the shared CATALOG by default.


def _models(split: dict, catalog: Catalog = CATALOG) -> list[str]:
    """The split's models in catalog order; models the catalog does not know come last, under their name."""
    return catalog.order(split["models"])


def _bars(split: dict, metric: str, reference: float | None, reference_note: str = "",
          catalog: Catalog = CATALOG) -> str:
    """Per-control bars for each model, with the bootstrap CI on Spearman, and the paper's line."""
    models = _models(split, catalog)
    controls = list(next(iter(split["models"].values()))["per_control"])
    groups = controls + (["(average)"] if len(controls) > 1 else [])
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(groups) + 2), 3.6))
    x = np.arange(len(groups))
    for i, name in enumerate(models):
        blocks = [split["models"][name]["per_control"][c] for c in controls]
        if len(controls) > 1:
            blocks.append(split["models"][name]["overall"])
        values = np.array([b[metric] if b[metric] is not None else np.nan for b in blocks], float)
        errors = None
        if metric == "spearman":
            lo = np.array([b["spearman_ci"][0] if b["spearman_ci"][0] is not None else np.nan for b in blocks])
            hi = np.array([b["spearman_ci"][1] if b["spearman_ci"][1] is not None else np.nan for b in blocks])
            errors = np.nan_to_num(np.vstack([values - lo, hi - values]), nan=0.0).clip(0)
        positions = x + (i - (len(models) - 1) / 2) * width
        ax.bar(positions, np.nan_to_num(values), width, yerr=errors, capsize=2,
               label=catalog.label(name), color=catalog.color(name))
        for position, value in zip(positions, values):
            if not np.isfinite(value):  # e.g. Spearman of a constant prediction: undefined, not zero
                ax.text(position, 0.01, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
    if reference is not None:
        ax.axhline(reference, color="black", linestyle="--", linewidth=1,
                   label=f"{PAPER_LABEL}{reference_note}: {reference}")
    ax.set_xticks(x, groups, rotation=20)
    ax.set_ylabel(metric)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    return png_data_uri(fig)


def _confusions(split: dict, levels: list[int], control: str, catalog: Catalog = CATALOG) -> str | None:
    """Confusion matrices of the rater models (role "rater" in the catalog; baselines are left out)."""
    models = [m for m in _models(split, catalog) if catalog.role(m) == "rater" and m in split.get("confusion", {})]
    if not models:
        return None
    fig, axes = plt.subplots(1, len(models), figsize=(3.6 * len(models), 3.3), squeeze=False)
    for ax, name in zip(axes[0], models):
        counts = np.asarray(split["confusion"][name][control], float)
        rows = counts / np.clip(counts.sum(axis=1, keepdims=True), 1, None)  # share of each true level
        ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
        for (i, j), n in np.ndenumerate(counts):
            ax.text(j, i, int(n), ha="center", va="center", fontsize=7,
                    color="white" if rows[i, j] > 0.5 else "black")
        ax.set_xticks(range(len(levels)), levels)
        ax.set_yticks(range(len(levels)), levels)
        ax.set_xlabel("predicted level")
        ax.set_ylabel("rated level")
        ax.set_title(f"{catalog.label(name)}: {control}", fontsize=9)
    return png_data_uri(fig)


def _gain(split: dict, catalog: Catalog = CATALOG) -> str | None:
    bins = [b for b in split.get("by_train_ratings", []) if b.get("gain_spearman") is not None]
    if len(bins) < 2:  # e.g. cold start: every rater has 0 training ratings, there is no curve
        return None
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = np.arange(len(bins))
    for name in _models(split, catalog):  # models constant within a fold have no Spearman and no line
        values = [b["models"].get(name, {}).get("spearman") for b in bins]
        if any(v is not None for v in values):
            ax.plot(x, [np.nan if v is None else v for v in values], marker="o", label=catalog.label(name),
                    color=catalog.color(name))
    ax.bar(x, [b["gain_spearman"] for b in bins], color=catalog.color("personalized") or "#d0734a", alpha=0.25,
           label="gain (personalized - generic)")
    ax.set_xticks(x, [f"{b['bin']}\n({b['n_raters']} raters)" for b in bins], fontsize=7)
    ax.set_xlabel("the rater's ratings in the training folds")
    ax.set_ylabel("Spearman")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend(fontsize=7)
    return png_data_uri(fig)


def _fmt(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _with_ci(block: dict | None, signed: bool = False) -> str:
    """"0.123 [0.100, 0.150]" from a {mean, ci} block; n/a when there is none."""
    if not block or block.get("mean") is None:
        return "n/a"
    spec = "+.3f" if signed else ".3f"
    lo, hi = block["ci"]
    return f"{block['mean']:{spec}}" + ("" if lo is None else f" [{lo:{spec}}, {hi:{spec}}]")


def _perspectivist_rows(split: dict, catalog: Catalog = CATALOG) -> list[dict]:
    """One table row per model: LeWiDi 2025's ANAD and soft-label Wasserstein, then sense7's per-rater
    distance over K - 1 (mean with CI, quartiles over raters) and its 0-1 Wasserstein on multi-rater turns."""
    block = split.get("perspectivist") or {}
    rows = []
    for name in catalog.order(block.get("models", {})):
        m = block["models"][name]
        d = m["rater_mean_distance"] or {}
        q = d.get("quantiles", {})
        rows.append({"label": catalog.label(name), "anad": _with_ci(m.get("lewidi_anad")),
                     "lewidi_wasserstein": _with_ci(m.get("lewidi_wasserstein")), "distance": _with_ci(d),
                     "spread": "n/a" if q.get("p10") is None else
                     f"{q['p10']:.3f} / {q['p50']:.3f} / {q['p90']:.3f}",
                     "wasserstein": _with_ci(m["wasserstein_01"]),
                     "turns": (m["wasserstein_01"] or {}).get("n_turns", 0)})
    return rows


def _gain_text(gain: dict | None, what: str) -> str | None:
    if not gain:
        return None
    return (f"{what}: {_with_ci(gain, signed=True)}; of {gain['n_raters']} raters {gain['share_gain']:.0%} gain, "
            f"{gain['share_loss']:.0%} lose (median {gain['quantiles']['p50']:+.3f})")


def _rater_gain_histogram(split: dict, catalog: Catalog = CATALOG) -> str | None:
    """Histograms over raters of the personalization gain, on distance and on within-rater Spearman."""
    gain = (split.get("perspectivist") or {}).get("personalization_gain") or {}
    panels = [(key, title, gain[key]) for key, title in
              (("distance", "normalized distance: generic - personalized"),
               ("spearman", "within-rater Spearman: personalized - generic")) if gain.get(key)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.0), squeeze=False)
    for ax, (_, title, block) in zip(axes[0], panels):
        ax.hist(block["values"], bins=min(30, max(5, len(block["values"]) // 3)),
                color=catalog.color("personalized") or "#d0734a", alpha=0.8)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.axvline(block["mean"], color="black", linestyle="--", linewidth=1, label=f"mean {block['mean']:+.3f}")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("gain per rater (> 0: personalization helps)", fontsize=8)
        ax.set_ylabel("raters")
        ax.legend(fontsize=7)
    return png_data_uri(fig)


def _audit_bars(units: list[dict], title: str) -> str | None:
    """Horizontal bars of trait importance (cold-start MAE increase) with their 95% CI whiskers."""
    units = [u for u in units if u.get("importance") is not None]
    if not units:
        return None
    units = units[::-1]  # largest at the top
    values = np.array([u["importance"] for u in units])
    lo = np.array([np.nan if u["ci"][0] is None else u["ci"][0] for u in units])
    hi = np.array([np.nan if u["ci"][1] is None else u["ci"][1] for u in units])
    errors = np.nan_to_num(np.vstack([values - lo, hi - values]), nan=0.0).clip(0)
    fig, ax = plt.subplots(figsize=(6.5, 0.28 * len(units) + 1.2))
    y = np.arange(len(units))
    ax.barh(y, values, xerr=errors, capsize=2, color=["#d0734a" if v > 0 else "#999999" for v in values])
    ax.set_yticks(y, [u["name"] for u in units], fontsize=7)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlabel("cold-start MAE increase when shuffled (> 0: the trait helps)")
    ax.set_title(title, fontsize=9)
    return png_data_uri(fig)


TEMPLATE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sense7 evaluation: {{ r.dataset }}</title>
<style>
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
.note { color: #555; font-size: 90%; } img { max-width: 100%; }
</style></head><body>
<h1>Rater model evaluation: {{ r.dataset or "unnamed data set" }}</h1>
<p>{{ r.n_ratings }} ratings ({{ r.n_items }} rated items) by {{ r.n_raters }} raters on {{ r.n_conversations }}
conversations; controls: {{ r.controls | join(", ") }}; scale {{ r.levels[0] }}-{{ r.levels[-1] }}.
{{ r.n_folds }}-fold cross-validation (seed {{ r.seed }}), {{ r.n_boot }} bootstrap resamples.</p>
<p class="note">Metrics are computed within each test fold and averaged over folds. Spearman compares the rating
with the model's expected rating; accuracy, quadratic weighted kappa (QWK) and MAE use the most likely level.
"Overall" averages the controls. n/a: undefined (a constant prediction ranks nothing).
95% intervals resample whole conversations (known raters) or raters (cold start).
Reference figures: {{ paper_label }}: Spearman {{ paper_spearman }}, accuracy {{ paper_accuracy }} on 5 levels
{%- if r.levels | length != 5 %} (this data set has {{ r.levels | length }} levels, so accuracy is not
comparable){% endif %}.</p>
{% for split_name, split in splits %}
<h2>{{ split_labels.get(split_name, split_name) }}</h2>
<table><tr><th>model</th><th>Spearman</th><th>95% CI</th><th>accuracy</th><th>QWK</th><th>MAE</th></tr>
{% for row in split.rows %}<tr><td>{{ row.label }}</td><td>{{ row.spearman }}</td><td>{{ row.ci }}</td>
<td>{{ row.accuracy }}</td><td>{{ row.qwk }}</td><td>{{ row.mae }}</td></tr>
{% endfor %}</table>
{% if split.paired %}<p>Personalized minus generic (Spearman, paired bootstrap): <b>{{ split.paired }}</b></p>
{% endif %}
<h3>Spearman per control</h3><img alt="Spearman per control, {{ split_name }}" src="{{ split.spearman_png }}">
<h3>Accuracy per control</h3><img alt="Accuracy per control, {{ split_name }}" src="{{ split.accuracy_png }}">
{% if split.confusion_png %}<h3>Confusion matrices ({{ split.confusion_control }})</h3>
<img alt="Confusion matrices, {{ split_name }}" src="{{ split.confusion_png }}">{% endif %}
{% if split.gain_png %}<h3>Personalization gain by the rater's number of training ratings</h3>
<img alt="Gain by training ratings, {{ split_name }}" src="{{ split.gain_png }}">{% endif %}
{% if split.perspectivist %}<h3>Per rater and per turn (perspectivist metrics)</h3>
<p class="note">LeWiDi 2025's scores, as the task computes them: ANAD = |predicted level - rated level| / levels,
averaged over each turn's raters, then over turns; Wasserstein = on turns rated by several raters, the earth
mover's distance in levels between the predicted distribution of their ratings (mean of their predicted
probabilities) and the observed one (95% CI: conversations resampled). sense7's own summaries (not
comparable with published figures): distance per rater = |predicted - rated| / (levels - 1), averaged over
each rater's ratings, then over raters (95% CI: raters resampled; p10 / median / p90 over raters);
Wasserstein 0-1 = the same Wasserstein divided by levels - 1. Lower is better for all.</p>
<table><tr><th>model</th><th>ANAD (LeWiDi)</th><th>Wasserstein (LeWiDi)</th><th>distance per rater</th>
<th>p10 / median / p90</th><th>Wasserstein 0-1</th><th>turns</th></tr>
{% for row in split.perspectivist %}<tr><td>{{ row.label }}</td><td>{{ row.anad }}</td>
<td>{{ row.lewidi_wasserstein }}</td><td>{{ row.distance }}</td><td>{{ row.spread }}</td>
<td>{{ row.wasserstein }}</td><td>{{ row.turns }}</td></tr>
{% endfor %}</table>
{% for line in split.rater_gain_lines %}<p>Personalization gain per rater, {{ line }}</p>
{% endfor %}
{% if split.rater_gain_png %}<img alt="Personalization gain per rater, {{ split_name }}"
src="{{ split.rater_gain_png }}">{% endif %}{% endif %}
{% endfor %}
{% if replay %}<h2>Live replay: new raters' answers replayed in their order (folds by rater)</h2>
<p class="note">{{ replay.n_folds }} folds by rater; each test rater's answers in {{ replay.order }}. After k of
their first answers, the live posterior (what the rater page's live pre-fills serve) predicts all their later
answers (at least {{ replay.min_targets }}; the same answers at every k); static = the served prediction
without their answers (traits prior or generic), running mean / median = the mean / median of their first k
answers (the training folds' at k = 0). MAE on the median level per rater, mean over raters; Spearman of the expected rating within each
fold's raters pooled. 95% intervals resample raters; live minus another model is paired. A rater counts at k
with k + {{ replay.min_targets }} answers or more ({{ replay.n_eligible }} of {{ replay.n_raters }} raters at
k = 0, {{ replay.n_full_stream }} with the whole stream of {{ replay.stream_length }}).</p>
<table><tr><th>k</th><th>raters</th><th>MAE live</th><th>static</th><th>running mean</th><th>running median</th>
<th>generic</th><th>global mean</th><th>live - static</th><th>live - running mean</th><th>live - running median</th>
<th>Spearman live</th><th>static</th><th>running mean</th></tr>
{% for row in replay.rows %}<tr><td>{{ row.k }}</td><td>{{ row.n_raters }}</td>{% for cell in row.cells %}<td>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% if replay.png %}<img alt="Live replay curve" src="{{ replay.png }}">{% endif %}
{% endif %}
{% if audit %}<h2>Trait audit: what each trait and questionnaire item is worth for new raters</h2>
<p class="note">Cold start (folds by rater), {{ audit.model }}, {{ audit.method }}
{%- if audit.n_repeats %} ({{ audit.n_repeats }} shuffles){% endif %}: the increase of the cold-start MAE of the
expected rating when a trait is shuffled across the test raters (or, method drop, left out of the fit);
averaged over controls, mean over {{ audit.n_raters }} raters with 95% CI (raters resampled). Baseline MAE
{{ audit.baseline_mae }}, Spearman {{ audit.baseline_spearman }}.</p>
{% for chart in audit.charts %}<img alt="Trait audit: {{ chart.title }}" src="{{ chart.png }}">
{% endfor %}{% endif %}
</body></html>
""")


def render_report(result: dict, catalog: Catalog = CATALOG) -> str:
    """The HTML text for an `evaluate` result; model labels, colours and order from `catalog`."""
    levels = result["levels"]
    five_levels = len(levels) == 5
    splits = []
    for split_name, split in result["splits"].items():
        rows = []
        for name in _models(split, catalog):
            o = split["models"][name]["overall"]
            ci = o["spearman_ci"]
            rows.append({"label": catalog.label(name), "spearman": _fmt(o["spearman"]),
                         "ci": "n/a" if ci[0] is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]",
                         "accuracy": _fmt(o["accuracy"]), "qwk": _fmt(o["qwk"]), "mae": _fmt(o["mae"])})
        paired = split.get("paired", {}).get("personalized_minus_generic")
        paired_text = None
        if paired and paired["spearman"] is not None:
            ci = paired["ci"]
            paired_text = f"{paired['spearman']:+.3f}" + ("" if ci[0] is None else f" [{ci[0]:+.3f}, {ci[1]:+.3f}]")
        control = "overall" if "overall" in result["controls"] else result["controls"][0]
        gains = (split.get("perspectivist") or {}).get("personalization_gain") or {}
        repeated = (split.get("perspectivist") or {}).get("personalization_gain_repeated")
        splits.append((split_name, {
            "rows": rows,
            "paired": paired_text,
            "spearman_png": _bars(split, "spearman", PAPER_SPEARMAN, catalog=catalog),
            # The paper's accuracy is on 5 levels: only meaningful as a line on a 5-level scale.
            "accuracy_png": _bars(split, "accuracy", PAPER_ACCURACY if five_levels else None, " (5 levels)",
                                  catalog=catalog),
            "confusion_png": _confusions(split, levels, control, catalog),
            "confusion_control": control,
            "gain_png": _gain(split, catalog),
            "perspectivist": _perspectivist_rows(split, catalog),
            "rater_gain_lines": [line for line in (
                _gain_text(gains.get("distance"), "normalized distance (generic - personalized)"),
                _gain_text(gains.get("spearman"), "within-rater Spearman (personalized - generic)"),
                _gain_text(repeated, f"within-rater Spearman over {repeated['repeats']} fold assignments"
                           if repeated else "")) if line],
            "rater_gain_png": _rater_gain_histogram(split, catalog),
        }))
    return TEMPLATE.render(r=result, splits=splits, split_labels=SPLIT_LABELS, paper_label=PAPER_LABEL,
                           paper_spearman=PAPER_SPEARMAN, paper_accuracy=PAPER_ACCURACY,
                           audit=_audit_view(result.get("trait_audit")),
                           replay=_replay_view(result.get("live_replay")))


def _value_ci(block: dict, signed: bool = False) -> str:
    """"0.512 [0.480, 0.550]" from a {value, ci} block; n/a when there is none."""
    if block["value"] is None:
        return "n/a"
    spec = "+.3f" if signed else ".3f"
    lo, hi = block["ci"]
    return f"{block['value']:{spec}}" + ("" if lo is None else f" [{lo:{spec}}, {hi:{spec}}]")


REPLAY_LINES = (("live", "live posterior", "#d0734a"), ("static", "static (no answers)", "#4a7bd0"),
                ("running_mean", "the rater's running mean", "#5a9a5a"),
                ("running_median", "the rater's running median", "#9a5ab0"), ("generic", "generic", "#888888"))


def _replay_view(replay: dict | None) -> dict | None:
    """What the template shows of result["live_replay"]: a table per k and the MAE curve with its CIs."""
    if not replay:
        return None
    rows = []
    for point in replay["curve"]:
        mae, rho, minus = point["mae"], point["spearman"], point["live_minus"]
        rows.append({"k": point["k"], "n_raters": point["n_raters"], "cells": [
            *(_value_ci(mae[m])
              for m in ("live", "static", "running_mean", "running_median", "generic", "global_mean")),
            *(_value_ci(minus[m]["mae"], signed=True) for m in ("static", "running_mean", "running_median")),
            *(_value_ci(rho[m]) for m in ("live", "static", "running_mean"))]})
    return {**{key: replay[key] for key in ("n_folds", "order", "min_targets", "n_eligible", "n_raters",
                                            "n_full_stream", "stream_length")},
            "rows": rows, "png": _replay_curve(replay)}


def _replay_curve(replay: dict) -> str | None:
    """MAE against k for live, static, running mean and generic, 95% bands; all raters and whole streams."""
    panels = [("curve", "raters with k + targets answers"), ("curve_full_stream", "raters with the whole stream")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    drawn = False
    for ax, (key, title) in zip(axes, panels):
        points = [p for p in replay.get(key, []) if p["mae"]["live"]["value"] is not None]
        if len(points) < 2:
            continue
        x = np.arange(len(points))
        for name, label, color in REPLAY_LINES:
            values = np.array([p["mae"][name]["value"] for p in points], float)
            lo = np.array([np.nan if p["mae"][name]["ci"][0] is None else p["mae"][name]["ci"][0] for p in points])
            hi = np.array([np.nan if p["mae"][name]["ci"][1] is None else p["mae"][name]["ci"][1] for p in points])
            ax.plot(x, values, marker="o", label=label, color=color)
            ax.fill_between(x, lo, hi, color=color, alpha=0.12)
        ax.set_xticks(x, [f"{p['k']}\n({p['n_raters']})" for p in points], fontsize=7)
        ax.set_xlabel("the rater's answers so far (raters)")
        ax.set_title(title, fontsize=9)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    axes[0].set_ylabel("MAE on later answers")
    axes[0].legend(fontsize=7)
    return png_data_uri(fig)


def _audit_view(audit: dict | None) -> dict | None:
    """What the template shows of `result["trait_audit"]`: the numbers in words and one chart per level."""
    if not audit:
        return None
    levels = (("items", "questionnaire items"), ("features", "trait features (what the model sees)"))
    charts = [{"title": title, "png": _audit_bars(audit[level], title)} for level, title in levels]
    return {"model": audit["model"], "method": audit["method"], "n_repeats": audit.get("n_repeats"),
            "n_raters": audit["n_raters"], "baseline_mae": _fmt(audit["baseline"]["mae"]),
            "baseline_spearman": _fmt(audit["baseline"]["spearman"]), "charts": [c for c in charts if c["png"]]}


def write_report(result: dict, path: str | Path, catalog: Catalog = CATALOG) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(result, catalog), encoding="utf-8")
    return path
