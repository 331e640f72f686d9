"""Benchmark the crowd assignment policies by replay on ratings that exist (issue 41): ConvAbuse and WASSA 2024
when present (../shared/data), and planted data with high disagreement (sense7.crowd.replay).

    .venv/bin/python scripts/bench_assignment.py                      # every data set, 3 seeds
    .venv/bin/python scripts/bench_assignment.py --data planted --seeds 5 --out figures.json

A policy may only hand a rater units that rater rated in the data (sense7.crowd.replay). For each policy
and data set: curves (mean and 95% interval over seeds) of per-rater MAE on held-out units, item-level MAE
on the pool and the width of Krippendorff's alpha's 95% CI (ordinal, sense7.research.agreement) against
the ratings spent; and the ratings each policy needs to reach least_covered's and random's figure at a
given budget (saving = 1 - needed / budget; per seed, then mean and interval). Prints Markdown tables for
docs/BENCHMARKS.md on stderr and the JSON document on stdout.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from sense7.crowd.policies import make_policy
from sense7.crowd.replay import ReplayData, from_rating_data, planted_disagreement, ratings_to_reach, replay
from sense7.research.agreement import krippendorff_alpha

from benchkit import argument_parser, emit, logger

# ../shared/data next to the checkout (a worktree under /work/wt/NAME finds /work/shared too)
SHARED = next((p / "shared" / "data" for p in Path(__file__).resolve().parents if (p / "shared" / "data").is_dir()),
              Path(__file__).resolve().parents[1].parent / "shared" / "data")
METRICS = ("per_rater_mae", "item_mae", "alpha_ci_width")
LABELS = {"per_rater_mae": "per-rater MAE", "item_mae": "item MAE", "alpha_ci_width": "alpha CI width"}
# The policies replayed: (label, policy name, floor, its own parameters)
POLICIES = [("least_covered", "least_covered", 1, {}), ("random", "random", 1, {}),
            ("learn_rater", "learn_rater", 1, {}), ("learn_rater_floor0", "learn_rater", 0, {}),
            ("settle_items", "settle_items", 1, {})]  # learn_rater: anchors=1, its default
log = logger("bench_assignment")


def datasets(which: list[str], convabuse: Path, wassa: Path) -> list[tuple[ReplayData, dict]]:
    """(data, replay settings: K max, per visit, budget) for each data set asked for and present."""
    found = []
    if "convabuse" in which and (convabuse / "ConvAbuseEMNLPfull.csv").exists():
        from sense7.readers.convabuse import load_convabuse
        found.append((from_rating_data("convabuse", load_convabuse(convabuse)),
                      {"k_max": 5, "per_visit": 5, "budget": 3000}))
    elif "convabuse" in which:
        log(f"ConvAbuse not found under {convabuse}: skipped")
    if "wassa" in which and (wassa / "trac1_CONVD_train.csv").exists():
        from sense7.readers.wassa import load_wassa
        found.append((from_rating_data("wassa2024", load_wassa(wassa)), {"k_max": 2, "per_visit": 2, "budget": 700}))
    elif "wassa" in which:
        log(f"WASSA 2024 not found under {wassa}: skipped")
    if "planted" in which:
        found.append((planted_disagreement(seed=0), {"k_max": 6, "per_visit": 5, "budget": 1600}))
    return found


def alpha_width(frame: pd.DataFrame, levels, boot: int, seed: int) -> float:
    """Width of the ordinal alpha's 95% CI on the collected ratings (NaN while undefined)."""
    if frame.empty:
        return float("nan")
    long = pd.DataFrame({"conversation_id": frame["unit"], "turn_index": -1, "rater_id": frame["rater"],
                         "dimension": "rating", "rating": frame["rating"]})
    ci = krippendorff_alpha(long, levels, n_boot=boot, seed=seed)["controls"]["rating"]["ci"]
    return float(ci[1] - ci[0]) if ci[0] is not None else float("nan")


def interval(values) -> dict:
    """Mean and 95% t-interval over seeds (None where undefined)."""
    values = np.asarray([v for v in values if v is not None and np.isfinite(v)], float)
    if len(values) == 0:
        return {"mean": None, "ci": [None, None], "n": 0}
    mean = float(values.mean())
    if len(values) < 2:
        return {"mean": mean, "ci": [None, None], "n": 1}
    from scipy import stats
    half = float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))
    return {"mean": mean, "ci": [mean - half, mean + half], "n": int(len(values))}


def bench_one(data: ReplayData, settings: dict, seeds: int, points: int, boot: int) -> dict:
    budget = min(settings["budget"], int(0.7 * len(data.ratings)))
    # evenly spaced, plus two early ones (a policy that learns fast is told apart there)
    marks = sorted({int(round(budget * (i + 1) / points)) for i in range(points)}
                   | {int(round(budget / 16)), int(round(budget / 8))})
    runs: dict[str, list] = {}
    seconds: dict[str, float] = {}
    for label, name, floor, params in POLICIES:
        runs[label] = []
        t0 = time.perf_counter()
        for seed in range(seeds):
            extra = {"seed": seed} if name == "random" else {}
            policy = make_policy(name, settings["k_max"], None, None, floor, **params, **extra)
            run = replay(data, policy, seed, budget, marks, per_visit=settings["per_visit"])
            for point in run.checkpoints:
                point["alpha_ci_width"] = alpha_width(run.collected_frame(point["ratings"]), data.levels, boot, seed)
            runs[label].append(run)
        seconds[label] = round(time.perf_counter() - t0, 1)
        last = runs[label][0].checkpoints[-1]
        log(f"{data.name} {label}: {seconds[label]} s for {seeds} seed(s); at {last['ratings']} ratings "
            f"per-rater MAE {last['per_rater_mae']:.3f}, item MAE {last['item_mae']:.3f}")
    curves = {label: {metric: [interval([r.checkpoints[i][metric] for r in rs]) for i in range(len(marks))]
                      for metric in METRICS} for label, rs in runs.items()}
    exhausted = {label: [r.checkpoints[-1].get("exhausted") for r in rs] for label, rs in runs.items()}
    savings = {}
    for reference in ("least_covered", "random"):
        for label, rs in runs.items():
            if label == reference:
                continue
            for metric in METRICS:
                for at in _saving_marks(marks):
                    per_seed = []
                    for seed, (mine, ref) in enumerate(zip(rs, runs[reference])):
                        i = marks.index(at)
                        target = ref.checkpoints[i][metric]
                        if not np.isfinite(target):
                            continue
                        needed = ratings_to_reach(marks, [p[metric] for p in mine.checkpoints], target)
                        per_seed.append(1 - needed / at if needed is not None else -np.inf)
                    reached = [s for s in per_seed if np.isfinite(s)]
                    savings.setdefault(f"{label}_vs_{reference}", {}).setdefault(metric, {})[str(at)] = {
                        **interval(reached), "seeds_never_reached": len(per_seed) - len(reached)}
    return {"data": data.summary(), "settings": {**settings, "budget": budget, "checkpoints": marks, "seeds": seeds,
                                                  "alpha_boot": boot}, "seconds": seconds, "curves": curves,
            "savings": savings, "exhausted_at": exhausted}


def _nearest(marks: list[int], share: float) -> int:
    return min(marks, key=lambda m: abs(m - share * marks[-1]))


def _saving_marks(marks: list[int]) -> list[int]:
    """The reference budgets savings are measured at: about a quarter, a half and three quarters of the
    budget (at the full budget a policy can only tie: the curves stop there)."""
    return sorted({_nearest(marks, f) for f in (0.25, 0.5, 0.75)})


def markdown(name: str, result: dict) -> str:
    marks = result["settings"]["checkpoints"]
    show = [marks[0], _nearest(marks, 0.25), marks[-1]]
    at = _saving_marks(marks)
    lines = [f"\n{name}: {result['data']['units']} units, {result['data']['raters']} raters, "
             f"{result['data']['ratings']} ratings; budget {result['settings']['budget']}, "
             f"{result['settings']['seeds']} seeds\n",
             "| policy | " + " | ".join(f"per-rater MAE @{m}" for m in show) + " | "
             + " | ".join(f"item MAE @{m}" for m in show) + f" | alpha CI width @{show[-1]} |",
             "| --- |" + " --- |" * 7]

    def cell(v):
        return "n/a" if v["mean"] is None else (f"{v['mean']:.3f}" if v["ci"][0] is None
                                                else f"{v['mean']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]")
    for label, curve in result["curves"].items():
        row = [cell(curve["per_rater_mae"][marks.index(m)]) for m in show]
        row += [cell(curve["item_mae"][marks.index(m)]) for m in show]
        row += [cell(curve["alpha_ci_width"][-1])]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    lines.append("\nratings saved for the same figure as the reference at the budget shown (1 - needed/budget; "
                 "mean [95% CI] over seeds; `never` = seeds where it never got there):\n")
    columns = [("per_rater_mae", m) for m in at] + [("item_mae", at[-1]), ("alpha_ci_width", at[-1])]
    lines.append("| policy vs reference | " + " | ".join(f"{LABELS[metric]} @{m}" for metric, m in columns) + " |")
    lines.append("| --- |" + " --- |" * len(columns))
    for pair, body in result["savings"].items():
        cells = []
        for metric, where in columns:
            s = body[metric][str(where)]
            text = "n/a" if s["mean"] is None else (f"{s['mean']:+.0%}" if s["ci"][0] is None else
                                                    f"{s['mean']:+.0%} [{s['ci'][0]:+.0%}, {s['ci'][1]:+.0%}]")
            cells.append(text + (f" ({s['seeds_never_reached']} never)" if s["seeds_never_reached"] else ""))
        lines.append(f"| {pair.replace('_vs_', ' vs ')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--data", nargs="+", default=["convabuse", "wassa", "planted"],
                        choices=["convabuse", "wassa", "planted"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--convabuse-seeds", type=int, default=3, help="seeds on ConvAbuse (the slow one)")
    parser.add_argument("--points", type=int, default=8, help="checkpoints along the budget")
    parser.add_argument("--alpha-boot", type=int, default=100, help="bootstrap draws of alpha's CI per checkpoint")
    parser.add_argument("--convabuse", type=Path, default=SHARED / "convabuse")
    parser.add_argument("--wassa", type=Path, default=SHARED / "wassa2024")
    args = parser.parse_args()
    t0 = time.perf_counter()
    figures = {"command": "scripts/bench_assignment.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                                    vars(args).items() if k in ("seeds", "convabuse_seeds", "points", "alpha_boot")),
               "datasets": {}}
    tables = []
    for data, settings in datasets(args.data, args.convabuse, args.wassa):
        log(f"{data.name}: {data.summary()}")
        seeds = args.convabuse_seeds if data.name == "convabuse" else args.seeds
        result = bench_one(data, settings, seeds, args.points, args.alpha_boot)
        figures["datasets"][data.name] = result
        tables.append(markdown(data.name, result))
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    for table in tables:
        print(table, file=__import__("sys").stderr)
    emit(figures, args.out)


if __name__ == "__main__":
    main()
