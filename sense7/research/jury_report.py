"""A self-contained HTML report of a jury (`sense7 jury --report`): one file, plots inline, no network assets.

What a reader needs to trust the numbers comes first: who sits on the panel (how many the model knows from
their own ratings, how many it knows only by their profile, and what they are like), then what the panel
would say per control, how that moves turn by turn (with how much the panel disagrees), and, when two
assistants or two panels are compared, the differences with their bootstrap intervals. Drawn like
sense7.research.report: matplotlib's Agg backend, PNGs embedded as base64.
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import matplotlib

matplotlib.use("Agg")  # headless: the report must build on a server
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sense7.data.dataset import NON_TRAIT_COLUMNS  # noqa: E402
from sense7.research.jury import Comparison, JuryResult  # noqa: E402
from sense7.research.report import png_data_uri  # noqa: E402

COLORS = ("#3b6fb6", "#d0734a")


def describe_panel(members: list[str], raters: pd.DataFrame | None) -> list[tuple[str, str]]:
    """(trait, summary) for the panel: numeric traits as mean and range, choices as their commonest answers."""
    if raters is None or not len(raters.columns):
        return []
    rows = raters.reindex([m for m in members if m in raters.index])
    out = []
    for trait in (c for c in rows.columns if c not in NON_TRAIT_COLUMNS):
        values = rows[trait].dropna()
        if values.empty:
            continue
        numeric = pd.to_numeric(values, errors="coerce")
        if numeric.notna().all():
            text = f"mean {numeric.mean():.2f} (range {numeric.min():g}-{numeric.max():g})"
        else:
            shares = values.astype(str).value_counts(normalize=True)
            text = ", ".join(f"{name} {share:.0%}" for name, share in shares.head(4).items())
            text += ", ..." if len(shares) > 4 else ""
        out.append((str(trait), f"{text}; {len(values)} of {len(members)} answered"))
    return out


def _distribution(jury: JuryResult) -> str:
    """Per control: the panel's mean distribution over levels as one stacked bar, the mean rating written on it."""
    overview = jury.overview()
    columns = jury.level_columns()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(overview) + 1.2))
    colors = plt.get_cmap("coolwarm_r")(np.linspace(0, 1, len(columns)))  # low levels red, high blue
    left = np.zeros(len(overview))
    y = np.arange(len(overview))[::-1]
    for j, (column, level) in enumerate(zip(columns, jury.levels)):
        share = overview[column].to_numpy()
        ax.barh(y, share, left=left, color=colors[j], label=str(level))
        left += share
    for position, mean in zip(y, overview["mean"]):
        ax.text(1.01, position, f"mean {mean:.2f}", va="center", fontsize=8)
    ax.set_yticks(y, overview.index)
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the panel's predicted ratings")
    ax.legend(title="level", fontsize=7, ncol=len(columns), loc="upper center",
              bbox_to_anchor=(0.5, -0.5 / fig.get_size_inches()[1] - 0.08))
    return png_data_uri(fig)


def _turns(juries: list[JuryResult], labels: list[str], control: str) -> str:
    """The panel's mean rating of `control` turn by turn (band: 10th-90th percentile of the members) and
    its dissent; thin lines separate conversations."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    for jury, label, color in zip(juries, labels, COLORS):
        j = jury.controls.index(control)
        summary = jury.summary()
        summary = summary[summary["control"] == control]
        expected = jury.expected()[:, :, j]
        masked = np.where(jury.seats(), expected, np.nan)
        x = np.arange(len(summary))
        top.plot(x, summary["mean"], color=color, linewidth=1, label=label)
        top.fill_between(x, np.nanpercentile(masked, 10, axis=1), np.nanpercentile(masked, 90, axis=1),
                         color=color, alpha=0.2, linewidth=0)
        bottom.plot(x, summary["dissent"], color=color, linewidth=1)
    starts = np.flatnonzero(np.r_[True, juries[0].conversation_ids[1:] != juries[0].conversation_ids[:-1]])
    for start in starts[1:]:
        for ax in (top, bottom):
            ax.axvline(start - 0.5, color="#999", linewidth=0.4)
    top.set_ylabel(f"{control}: panel mean")
    top.set_ylim(float(juries[0].levels[0]) - 0.1, float(juries[0].levels[-1]) + 0.1)
    top.legend(fontsize=7)
    bottom.set_ylabel("dissent")
    bottom.set_ylim(0, 1)
    bottom.set_xlabel(f"assistant turn ({len(starts)} conversations, in file order)")
    return png_data_uri(fig)


def _differences(comparison: Comparison) -> str:
    """Per control: b - a with its bootstrap interval."""
    frame = comparison.frame()
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(frame) + 2), 3.4))
    x = np.arange(len(frame))
    values = frame["difference"].to_numpy()
    errors = np.nan_to_num(np.vstack([values - frame["ci_low"], frame["ci_high"] - values]), nan=0.0).clip(0)
    ax.bar(x, values, yerr=errors, capsize=3, color=[COLORS[1] if v > 0 else COLORS[0] for v in values])
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x, frame["control"], rotation=20)
    ax.set_ylabel("difference in mean rating (b - a)")
    return png_data_uri(fig)


TEMPLATE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sense7 jury{{ title }}</title>
<style>
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
.note { color: #555; font-size: 90%; } img { max-width: 100%; } code { background: #f6f6f6; }
</style></head><body>
<h1>Jury: how would these raters perceive the assistant?</h1>
<p>Predicted by the served rater model{% if version %} <b>{{ version }}</b>{% endif %}: each panel member's
rating distribution of every assistant turn, per control (scale {{ levels[0] }}-{{ levels[-1] }}).
Members the model was trained on are predicted from their own ratings ("personalized"); members with a
profile only, from what raters with those traits tend to do ("traits").</p>
<p class="note">These are model predictions, not ratings: they inherit the model's errors, and a panel of
profile-only members says what raters <i>like them</i> would do. Dissent: the share of members whose most
likely level differs from the panel's most common one.</p>
{% for j in juries %}
<h2>{{ j.name }}</h2>
<p>Panel <code>{{ j.spec }}</code>: {{ j.n_members }} members ({{ j.n_personalized }} personalized,
{{ j.n_traits }} traits only) on {{ j.n_turns }} assistant turns of {{ j.n_conversations }} conversations
{%- if j.same_panel %}: the same panel as above{% endif %}.</p>
{% if j.traits %}<table><tr><th>trait</th><th>the panel</th></tr>
{% for trait, text in j.traits %}<tr><td>{{ trait }}</td><td>{{ text }}</td></tr>{% endfor %}</table>{% endif %}
<h3>Per control</h3>
<table><tr><th>control</th><th>panel mean</th>{% for c in level_columns %}<th>{{ c }}</th>{% endfor %}
<th>mean dissent</th></tr>
{% for row in j.rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>{% endfor %}</table>
<img alt="Panel distribution per control, {{ j.name }}" src="{{ j.distribution_png }}">
{% endfor %}
<h2>Turn by turn: {{ control }}</h2>
<img alt="Panel mean and dissent per turn" src="{{ turns_png }}">
{% if comparison %}
<h2>{{ comparison.title }}</h2>
<p>{{ comparison.n_turns }} matched turns of {{ comparison.n_conversations }} conversations
{%- if comparison.unmatched %}; left out without a counterpart: {{ comparison.unmatched }}{% endif %}.
{{ (comparison.level * 100) | round | int }}% intervals: percentile bootstrap ({{ comparison.n_boot }} resamples)
drawing panel members and conversations independently.</p>
<table><tr><th>control</th><th>a</th><th>b</th><th>b - a</th><th>interval</th></tr>
{% for row in comparison.rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>{% endfor %}</table>
<img alt="Differences per control" src="{{ comparison.png }}">
{% endif %}
</body></html>
""")


def _num(value, digits: int = 2, sign: bool = False) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def render_jury_report(juries: list[JuryResult], specs: list[str], comparison: Comparison | None = None,
                       raters: pd.DataFrame | None = None, version: str = "", labels: list[str] | None = None) -> str:
    """The HTML text: one section per jury (a, then b), the turn-by-turn plot and the comparison if any."""
    labels = labels or [j.label or f"jury {chr(97 + i)}" for i, j in enumerate(juries)]
    first = juries[0]
    control = "overall" if "overall" in first.controls else first.controls[0]
    sections = []
    for i, (jury, spec, label) in enumerate(zip(juries, specs, labels)):
        overview = jury.overview()
        same_panel = i > 0 and sorted(jury.members) == sorted(juries[0].members)
        rows = [[name, _num(row["mean"]), *(f"{row[c]:.0%}" for c in jury.level_columns()), _num(row["dissent"])]
                for name, row in overview.iterrows()]
        sections.append({
            "name": label, "spec": spec, "n_members": len(jury.members),
            "n_personalized": jury.kinds.count("personalized"), "n_traits": jury.kinds.count("traits"),
            "n_turns": len(jury.conversation_ids), "n_conversations": len(set(jury.conversation_ids)),
            "same_panel": same_panel, "traits": [] if same_panel else describe_panel(jury.members, raters),
            "rows": rows, "distribution_png": _distribution(jury),
        })
    compared = None
    if comparison is not None:
        frame = comparison.frame()
        unmatched = comparison.unmatched
        compared = {
            "title": ("Assistant b vs assistant a, same panel" if comparison.kind == "assistants"
                      else "Panel b vs panel a, same transcripts") + f" ({labels[-1]} - {labels[0]})",
            "n_turns": comparison.n_turns, "n_conversations": comparison.n_conversations,
            "unmatched": "" if not any(unmatched) else f"{unmatched[0]} turns of a, {unmatched[1]} of b",
            "level": comparison.level, "n_boot": comparison.n_boot, "png": _differences(comparison),
            "rows": [[r.control, _num(r.mean_a), _num(r.mean_b), _num(r.difference, sign=True),
                      f"[{_num(r.ci_low, sign=True)}, {_num(r.ci_high, sign=True)}]"] for r in frame.itertuples()],
        }
    title = f": {', '.join(labels)}"
    return TEMPLATE.render(title=title, version=version, levels=[int(v) for v in first.levels],
                           level_columns=first.level_columns(), juries=sections, control=control,
                           turns_png=_turns(juries, labels, control), comparison=compared)


def write_jury_report(path, juries: list[JuryResult], specs: list[str], comparison: Comparison | None = None,
                      raters: pd.DataFrame | None = None, version: str = "", labels: list[str] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render_jury_report(juries, specs, comparison, raters, version, labels), encoding="utf-8")
    tmp.replace(path)
    return path
