"""Rater quality without a majority.

The study exists to find how raters differ, so agreement with a majority (or a gold answer) is no measure
of quality here: it would punish exactly the individual differences being studied. Every check below
compares a rater only with themselves or with an answer the item itself dictates:

- too_fast: the rater's median time per task is below what reading a turn takes.
- straight_lining: a long run of consecutive turns given one level on every control, the same level
  throughout (clicking through, not rating). One level across the controls of a single turn, or the
  same profile for a few turns, is a legitimate rating and not flagged.
- inconsistent: turns shown again later (test-retest) get very different ratings from the same rater.
- failed_instructed: instructed-response items ("for this turn, choose 2") answered otherwise.

Each flag carries the numbers and task ids that justify it, so a person can check it before acting;
`training_weights` turns flags into per-rater weights according to the policy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sense7.settings import QualityPolicy

NO_REPEATS = pd.DataFrame(columns=["rater_id", "task_id", "repeat_task_id"])
NO_INSTRUCTED = pd.DataFrame(columns=["rater_id", "task_id", "item", "answered", "expected"])


def _plain(value):
    """numpy scalars (task ids, levels) as Python ones, for JSON."""
    return value.item() if isinstance(value, np.generic) else value


def _longest_straight_run(task_ids: list, values: list[dict]) -> dict | None:
    """The longest run of consecutive tasks in which every control got one level, the same throughout:
    {"run", "level", "first_task_id", "last_task_id"}, or None when no task has a single level."""
    best, run, level, start = None, 0, None, 0
    for i, ratings in enumerate(values):
        levels = set(ratings.values()) if ratings else set()
        here = levels.pop() if len(levels) == 1 else None
        if here is None:
            run, level = 0, None
            continue
        if here == level:
            run += 1
        else:
            run, level, start = 1, here, i
        if best is None or run > best["run"]:
            best = {"run": run, "level": _plain(level), "first_task_id": _plain(task_ids[start]),
                    "last_task_id": _plain(task_ids[i])}
    return best


def _retest(pairs: pd.DataFrame, values_of: dict) -> tuple[dict | None, list]:
    """Test-retest agreement over the repeat pairs both of whose tasks the rater rated: |first - repeat|
    pooled over pairs and the controls both showings have. Returns (summary or None, the pairs used)."""
    distances, used = [], []
    for task_id, repeat_id in zip(pairs["task_id"], pairs["repeat_task_id"]):
        first, repeat = values_of.get(task_id), values_of.get(repeat_id)
        if first is None or repeat is None:
            continue
        common = [c for c in first if c in repeat]
        if not common:
            continue
        distances += [abs(float(first[c]) - float(repeat[c])) for c in common]
        used.append([_plain(task_id), _plain(repeat_id)])
    if not used:
        return None, used
    distances = np.array(distances)
    return {"pairs": len(used), "mean_distance": float(distances.mean()),
            "exact_share": float(np.mean(distances == 0))}, used


def _instructed(rows: pd.DataFrame) -> tuple[dict | None, list]:
    """Share of instructed-response items answered as instructed, and the items that were not."""
    if rows.empty:
        return None, []
    correct = (rows["answered"].to_numpy(float) == rows["expected"].to_numpy(float))
    failed = [{"task_id": _plain(t), "item": _plain(i), "answered": _plain(a), "expected": _plain(e)}
              for t, i, a, e, ok in zip(rows["task_id"], rows["item"], rows["answered"], rows["expected"], correct)
              if not ok]
    return {"items": int(len(rows)), "share_correct": float(correct.mean())}, failed


def rater_quality(tasks: pd.DataFrame, policy: QualityPolicy = QualityPolicy(), repeats: pd.DataFrame | None = None,
                  instructed: pd.DataFrame | None = None) -> dict[str, dict]:
    """{rater_id: {"n_tasks", "median_seconds", "straight_line_run", "retest", "instructed", "flags"}};
    strict JSON.

    `tasks`: one row per rated task: rater_id, task_id, order (sortable; a rater's turns are taken in
    this order), lead_time (seconds, NaN unknown), values ({control: level}). `repeats` (optional):
    rater_id, task_id, repeat_task_id; pairs with a task the rater did not rate are ignored. `instructed`
    (optional): rater_id, task_id, item, answered, expected. Raters are those in `tasks`.

    median_seconds is None when no lead time is known (and then the rater is not "too_fast");
    straight_line_run is the longest run (0 if none); retest is {"pairs", "mean_distance", "exact_share"}
    and instructed {"items", "share_correct"}, None without data. flags: [{"flag", "evidence"}], empty
    for a rater with fewer than `policy.min_tasks` tasks (too little to judge). Test-retest is judged
    from `policy.retest_min_pairs` pairs on: one repeat can differ by honest hesitation.
    """
    repeats = NO_REPEATS if repeats is None else repeats
    instructed = NO_INSTRUCTED if instructed is None else instructed
    repeats_of = {str(k): g for k, g in repeats.groupby(repeats["rater_id"].astype(str))}
    instructed_of = {str(k): g for k, g in instructed.groupby(instructed["rater_id"].astype(str))}
    out = {}
    for rater, rows in tasks.groupby(tasks["rater_id"].astype(str), sort=True):
        rows = rows.sort_values("order", kind="stable")
        task_ids, values = list(rows["task_id"]), list(rows["values"])
        seconds = rows["lead_time"].to_numpy(float)
        seconds = seconds[np.isfinite(seconds)]
        median = float(np.median(seconds)) if len(seconds) else None
        straight = _longest_straight_run(task_ids, values)
        retest, pairs = _retest(repeats_of.get(rater, NO_REPEATS), dict(zip(task_ids, values)))
        answered, failed = _instructed(instructed_of.get(rater, NO_INSTRUCTED))

        flags = []
        if median is not None and median < policy.min_median_seconds:
            flags.append({"flag": "too_fast", "evidence": {
                "median_seconds": median, "timed_tasks": int(len(seconds)),
                "min_median_seconds": policy.min_median_seconds}})
        if straight is not None and straight["run"] >= policy.straight_line_turns \
                and straight["run"] >= policy.straight_line_share * len(task_ids):
            flags.append({"flag": "straight_lining", "evidence": {
                **straight, "share_of_turns": round(straight["run"] / len(task_ids), 3),
                "straight_line_turns": policy.straight_line_turns, "straight_line_share": policy.straight_line_share}})
        if retest is not None and retest["pairs"] >= policy.retest_min_pairs \
                and retest["mean_distance"] > policy.retest_max_distance:
            flags.append({"flag": "inconsistent", "evidence": {
                **retest, "task_pairs": pairs, "retest_max_distance": policy.retest_max_distance}})
        if answered is not None and answered["share_correct"] < policy.instructed_min_share:
            flags.append({"flag": "failed_instructed", "evidence": {
                **answered, "failed": failed, "instructed_min_share": policy.instructed_min_share}})
        out[rater] = {
            "n_tasks": int(len(rows)),
            "median_seconds": median,
            "straight_line_run": straight["run"] if straight else 0,
            "retest": retest,
            "instructed": answered,
            "flags": flags if len(rows) >= policy.min_tasks else [],
        }
    return out


def training_weights(quality: dict[str, dict], policy: QualityPolicy) -> dict[str, float]:
    """{rater_id: weight of their ratings in training}: 1.0 unflagged; flagged: 0.0 ("exclude"),
    `policy.downweight` ("downweight") or 1.0 ("keep", e.g. to compare models with and without)."""
    flagged = {"exclude": 0.0, "keep": 1.0}[policy.training]
    return {rater: flagged if entry["flags"] else 1.0 for rater, entry in quality.items()}
