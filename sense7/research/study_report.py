"""The HTML report of a running study (`sense7 analyze --study --report`): anchoring by the pre-fill, the live
accuracy of the models raters met, the gain curve of live pre-fills, rater quality flags with their evidence,
agreement."""

from __future__ import annotations

from pathlib import Path

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sense7.research.report import png_data_uri  # noqa: E402


def _value(block: dict | None, digits: int = 3) -> str:
    """ "v [lo, hi]" of a {"value", "ci"} block."""
    if not block or block.get("value") is None:
        return "n/a"
    lo, hi = block.get("ci") or (None, None)
    ci = "" if lo is None else f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{block['value']:.{digits}f}{ci}"


def _metric(block: dict, name: str) -> str:
    value, ci = block.get(name), block.get(f"{name}_ci") or (None, None)
    if value is None:
        return "n/a"
    return f"{value:.3f}" + ("" if ci[0] is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]")


def _anchoring_plot(anchoring: dict) -> str | None:
    """Share of ratings equal to the prediction, per control and arm: the anchoring is the gap."""
    controls = [c for c in anchoring["controls"] if c != "__all__"]
    if not controls:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(controls)), 3.2))
    x = np.arange(len(controls))
    for k, (arm, colour) in enumerate((("shown", "#d95f02"), ("hidden", "#1b9e77"))):
        shares = [anchoring["controls"][c]["arms"].get(arm, {}).get("share_equal") for c in controls]
        ax.bar(x + (k - 0.5) * 0.38, [np.nan if s is None else s for s in shares], 0.38, label=f"{arm} arm",
               color=colour)
    ax.set_xticks(x, controls, rotation=30, ha="right")
    ax.set_ylabel("rating = prediction")
    ax.set_ylim(0, 1)
    ax.legend(frameon=False)
    fig.tight_layout()
    return png_data_uri(fig)


def _gain_plot(gain: dict) -> str | None:
    """MAE of the live, static and generic predictions by the rater's own earlier ratings, with intervals."""
    bins = gain.get("bins") or []
    if not bins:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    x = np.arange(len(bins))
    for k, (model, colour) in enumerate((("live", "#1b9e77"), ("static", "#d95f02"), ("generic", "#7570b3"))):
        values = np.array([np.nan if b["mae"][model]["value"] is None else b["mae"][model]["value"] for b in bins])
        ci = np.array([[np.nan if v is None else v for v in b["mae"][model]["ci"]] for b in bins], dtype=float)
        ax.errorbar(x + (k - 1) * 0.12, values, yerr=np.abs(np.vstack([values - ci[:, 0], ci[:, 1] - values])),
                    fmt="o-", capsize=3, color=colour, label=model)
    ax.set_xticks(x, [b["own_ratings"] for b in bins])
    ax.set_xlabel("the rater's own earlier ratings")
    ax.set_ylabel("MAE (hidden arm)")
    ax.legend(frameon=False)
    fig.tight_layout()
    return png_data_uri(fig)


TEMPLATE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sense7 study report</title>
<style>
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
.note { color: #555; font-size: 90%; } img { max-width: 100%; }
</style></head><body>
<h1>Study report</h1>
<p>{{ r.n_rated_tasks }} rated tasks by {{ r.n_raters }} raters; {{ r.n_with_prediction }} with a prediction recorded
before they were rated. Pre-fill arms (tasks): shown {{ r.arms.shown }}, hidden {{ r.arms.hidden }}.</p>

<h2>Anchoring by the pre-fill</h2>
{% if anchoring %}
<p class="note">Per control: how often a rating equals the recorded prediction and how far it is from it, by arm.
Shift = mean distance (hidden) minus mean distance (shown): positive means shown raters moved toward the model.
Copy rate = (share equal, shown - share equal, hidden) / (1 - share equal, hidden): the estimated probability
that a rater keeps a shown pre-fill. 95% intervals resample raters.</p>
<table><tr><th>control</th><th>equal (shown)</th><th>equal (hidden)</th><th>distance (shown)</th>
<th>distance (hidden)</th><th>shift toward prediction</th><th>copy rate</th></tr>
{% for row in anchoring %}<tr><td>{{ row.control }}</td><td>{{ row.eq_shown }}</td><td>{{ row.eq_hidden }}</td>
<td>{{ row.d_shown }}</td><td>{{ row.d_hidden }}</td><td>{{ row.shift }}</td><td>{{ row.copy }}</td></tr>
{% endfor %}</table>
<p>Seconds per task, shown minus hidden (median): {{ seconds }}</p>
{% if anchoring_png %}<img alt="Share of ratings equal to the prediction by arm" src="{{ anchoring_png }}">{% endif %}
{% else %}<p>No rating has a recorded prediction yet.</p>{% endif %}

<h2>Live evaluation (hidden arm)</h2>
{% if live %}
<p class="note">Ratings whose prediction was recorded but never shown, compared with the model version that would
have shown it: how good the model the raters actually met was. Rater mean: the mean of the rater's earlier
ratings. 95% intervals resample raters.</p>
<table><tr><th>version</th><th>ratings</th><th>raters</th><th>model</th><th>Spearman</th><th>QWK</th><th>MAE</th></tr>
{% for row in live %}<tr><td>{{ row.version }}</td><td>{{ row.n }}</td><td>{{ row.raters }}</td><td>{{ row.model }}</td>
<td>{{ row.spearman }}</td><td>{{ row.qwk }}</td><td>{{ row.mae }}</td></tr>
{% endfor %}</table>
{% else %}<p>No hidden-arm rating with a recorded prediction yet.</p>{% endif %}

<h2>Live pre-fills: the gain curve (hidden arm)</h2>
{% if gain %}
<p class="note">Each hidden-arm rating scored with the live prediction (the served version with the rater's
posterior updated by their answers so far), the static one (the served version alone: for a new rater the
traits prior) and the generic model, by how many of the rater's own earlier answers the live one used.
MAE of the most likely level; 95% intervals resample raters.</p>
{% if gain_png %}<img src="{{ gain_png }}" alt="MAE by own earlier ratings">{% endif %}
<table><tr><th>own earlier ratings</th><th>ratings</th><th>raters</th><th>MAE live</th><th>MAE static</th><th>MAE generic</th>
<th>live - static</th></tr>
{% for row in gain %}<tr><td>{{ row.bin }}</td><td>{{ row.n }}</td><td>{{ row.raters }}</td><td>{{ row.live }}</td>
<td>{{ row.static }}</td><td>{{ row.generic }}</td><td>{{ row.diff }}</td></tr>
{% endfor %}</table>
{% else %}<p>No live prediction recorded yet (the rater page records one once a rater has answered).</p>{% endif %}

<h2>Rater quality</h2>
<p class="note">Checks that compare a rater only with themselves (never with a majority, which would punish the
individual differences this study measures): too fast, straight-lining, test-retest on repeated turns,
instructed items. Training policy for flagged raters: {{ policy.training }}.</p>
<table><tr><th>rater</th><th>tasks</th><th>median s/task</th><th>longest straight run</th><th>retest (pairs, mean distance)</th>
<th>flags and evidence</th></tr>
{% for row in quality %}<tr><td>{{ row.rater }}</td><td>{{ row.n }}</td><td>{{ row.seconds }}</td><td>{{ row.run }}</td>
<td>{{ row.retest }}</td><td style="text-align:left">{{ row.flags }}</td></tr>
{% endfor %}</table>

<h2>Agreement</h2>
{% if agreement %}
<p class="note">Krippendorff's alpha (ordinal) on turns rated by several raters; 95% intervals resample
conversations.</p>
<table><tr><th>control</th><th>alpha</th><th>turns</th><th>raters</th></tr>
{% for row in agreement %}<tr><td>{{ row.control }}</td><td>{{ row.alpha }}</td><td>{{ row.n }}</td><td>{{ row.raters }}</td></tr>
{% endfor %}</table>
{% else %}<p>No turn was rated by more than one rater.</p>{% endif %}
{% for study in crowd %}
<h2>Crowd study {{ study.study }}: raters per conversation</h2>
<p class="note">Assignment {{ study.policy }}, K {{ study.k }}, floor {{ study.floor }}; raters so far = rated
and held in open leases; why = the policy's reason for the conversation's K.</p>
<table><tr><th>conversation</th><th>raters so far</th><th>rated</th><th>why</th></tr>
{% for cid, c in study.conversations.items() %}<tr><td>{{ cid }}</td><td>{{ c.k_so_far }}</td><td>{{ c.rated }}</td><td>{{ c.reason }}</td></tr>
{% endfor %}</table>
{% endfor %}
</body></html>
""")


def render_study_report(result: dict) -> str:
    anchoring_rows, seconds, png = [], "n/a", None
    if result.get("anchoring"):
        a = result["anchoring"]
        for control, block in a["controls"].items():
            arms = block["arms"]

            def num(arm, key):
                value = (arms.get(arm) or {}).get(key)
                return "n/a" if value is None else f"{value:.3f}"

            anchoring_rows.append({"control": "all controls" if control == "__all__" else control,
                                   "eq_shown": num("shown", "share_equal"), "eq_hidden": num("hidden", "share_equal"),
                                   "d_shown": num("shown", "mean_distance"), "d_hidden": num("hidden", "mean_distance"),
                                   "shift": _value(block["shift_toward_prediction"]), "copy": _value(block["copy_rate"])})
        seconds = _value(a.get("seconds_difference"), 1)
        png = _anchoring_plot(a)
    live_rows = []
    for version, block in ((result.get("live") or {}).get("versions") or {}).items():
        for model, metrics in block["models"].items():
            overall = metrics["overall"]
            live_rows.append({"version": version, "n": block["n_ratings"], "raters": block["n_raters"], "model": model,
                              "spearman": _metric(overall, "spearman"), "qwk": _metric(overall, "qwk"),
                              "mae": _metric(overall, "mae")})
    gain_rows = [{"bin": b["own_ratings"], "n": b["n"], "raters": b["n_raters"], "live": _value(b["mae"]["live"]),
                  "static": _value(b["mae"]["static"]), "generic": _value(b["mae"]["generic"]),
                  "diff": _value(b["live_minus_static"])} for b in (result.get("live_gain") or {}).get("bins", [])]
    gain_png = _gain_plot(result["live_gain"]) if gain_rows else None
    quality_rows = []
    for rater, q in sorted(result["quality"]["raters"].items()):
        retest = q.get("retest")
        quality_rows.append({
            "rater": rater, "n": q["n_tasks"],
            "seconds": "n/a" if q.get("median_seconds") is None else f"{q['median_seconds']:.1f}",
            "run": q.get("straight_line_run", 0),
            "retest": "n/a" if not retest else f"{retest['pairs']}, {retest['mean_distance']:.2f}",
            "flags": "; ".join(f"{f['flag']}: " + ", ".join(f"{k}={v}" for k, v in f["evidence"].items())
                               for f in q["flags"]) or "-"})
    agreement_rows = []
    for control, block in ((result.get("agreement") or {}).get("controls") or {}).items():
        if block.get("alpha") is None:
            continue
        lo, hi = block.get("ci") or (None, None)
        agreement_rows.append({"control": control, "n": block["n_units"], "raters": block["n_raters"],
                               "alpha": f"{block['alpha']:.3f}" + ("" if lo is None else f" [{lo:.3f}, {hi:.3f}]")})
    return TEMPLATE.render(r=result, anchoring=anchoring_rows, seconds=seconds, anchoring_png=png, live=live_rows,
                           gain=gain_rows, gain_png=gain_png,
                           quality=quality_rows, policy=result["quality"]["policy"], agreement=agreement_rows,
                           crowd=result.get("crowd") or [])


def write_study_report(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_study_report(result), encoding="utf-8")
    return path
