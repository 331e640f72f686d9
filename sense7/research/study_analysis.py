"""What a running study's store says about its ratings: anchoring by the pre-fill, the live accuracy of the
models raters met, rater quality, agreement and progress (`sense7 analyze --study`, `sense7 status`).

Everything is read from sense7's store (sense7.store.database / sense7.store.study_design): synced annotations with
their lead time and creation time, the arm each task drew, and the predictions recorded before its rater
saw it. A rating is compared with the prediction recorded last at or before the rating was made: the one
a shown-arm rater saw (up to the rater page's queue refresh) and, in the hidden arm, the one the served
model would have shown.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd
from sqlalchemy import select

from sense7.data.conversations import task_key
from sense7.research.agreement import krippendorff_alpha
from sense7.research.anchoring import anchoring
from sense7.research.live_evaluation import live_evaluation
from sense7.research.live_gain import gain_curve
from sense7.research.quality import QualityPolicy, rater_quality, training_weights
from sense7.store.database import Store
from sense7.store.rater_page_tables import InstructedAnswers, Outbox
from sense7.store.study_design import LIVE_KIND, REPEAT_SUFFIX, SHOWN, StudyRecords
from sense7.store.tables import annotations, ratings


def rated_tasks(store: Store) -> pd.DataFrame:
    """One row per live annotation credited to a rater: annotation_id, task_id, conversation_id, turn_index,
    rater_id, lead_time, created (UTC timestamp), repeat_of, task_key, values ({control: level}), arm.
    lead_time of a rating given on the rater page is the page's own measure (the outbox's), never Label
    Studio's lead_time field, which any staff account can set."""
    query = (select(annotations.c.annotation_id, annotations.c.task_id, annotations.c.conversation_id,
                    annotations.c.turn_index, annotations.c.rater_id, annotations.c.lead_time,
                    annotations.c.created_at, annotations.c.updated_at, annotations.c.repeat_of)
             .where(annotations.c.deleted.is_(False), annotations.c.rater_id.is_not(None),
                    annotations.c.quarantine.is_(None)))
    with store.engine.connect() as conn:
        rows = pd.DataFrame(conn.execute(query).mappings().all(),
                            columns=["annotation_id", "task_id", "conversation_id", "turn_index", "rater_id",
                                     "lead_time", "created_at", "updated_at", "repeat_of"])
        values = pd.DataFrame(conn.execute(select(ratings.c.annotation_id, ratings.c.control, ratings.c.value)).all(),
                              columns=["annotation_id", "control", "value"])
    if rows.empty:
        return rows.assign(created=pd.Series(dtype="datetime64[ns, UTC]"), task_key=[], values=[], arm=[])
    page = Outbox(store).page_seconds()
    rows["lead_time"] = [np.nan if page.get(a, t) is None else float(page.get(a, t))
                         for a, t in zip(rows["annotation_id"], rows["lead_time"])]
    # Label Studio's creation time; annotations synced before it was kept fall back to their update time.
    rows["created"] = pd.to_datetime(rows["created_at"].fillna(rows["updated_at"]), utc=True, format="ISO8601")
    by_annotation = {a: dict(zip(g["control"], g["value"].astype(int))) for a, g in values.groupby("annotation_id")}
    rows["values"] = [by_annotation.get(a, {}) for a in rows["annotation_id"]]
    rows["task_key"] = [r + REPEAT_SUFFIX if isinstance(r, str) and r else task_key(c, int(t), rid)
                        for r, c, t, rid in zip(rows["repeat_of"], rows["conversation_id"], rows["turn_index"],
                                                rows["rater_id"])]
    arms = StudyRecords(store).arms_frame()
    arm_of_key = dict(zip(arms["task_key"], arms["arm"])) if len(arms) else {}
    rows["arm"] = [arm_of_key.get(k, SHOWN) for k in rows["task_key"]]  # no arm drawn: imported before, shown
    return rows.sort_values(["created", "annotation_id"]).reset_index(drop=True)


def with_predictions(tasks: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """Each original (not repeat) rated task joined to the prediction recorded last at or before it was
    rated; tasks without such a prediction are left out."""
    originals = tasks[tasks["repeat_of"].isna()]
    if originals.empty or predictions.empty:
        return pd.DataFrame()
    preds = predictions.assign(recorded=pd.to_datetime(predictions["recorded_at"], utc=True))
    preds = preds.sort_values("recorded")
    left = originals.sort_values("created")
    joined = pd.merge_asof(left, preds.drop(columns=["rater_id", "conversation_id", "turn_index", "arm"]),
                           left_on="created", right_on="recorded", by="task_key", direction="backward")
    return joined[joined["version"].notna()].sort_values(["created", "annotation_id"]).reset_index(drop=True)


def _long(joined: pd.DataFrame, controls: list[str]) -> pd.DataFrame:
    """One row per (rated task, control) present in both the rating and the prediction."""
    rows = []
    for r in joined.itertuples(index=False):
        for c in controls:
            if c in r.values and c in (r.levels or {}):
                rows.append({"rater_id": r.rater_id, "task_id": int(r.task_id), "conversation_id": r.conversation_id,
                             "turn_index": int(r.turn_index), "arm": r.arm, "control": c, "rating": int(r.values[c]),
                             "predicted": int(r.levels[c]), "predicted_level": int(r.levels[c]),
                             "predicted_expected": float(r.expected[c]),
                             "generic_level": int(r.generic_levels[c]),
                             "generic_expected": float(r.generic_expected[c]), "version": r.version, "kind": r.kind,
                             "lead_time": np.nan if pd.isna(r.lead_time) else float(r.lead_time)})
    return pd.DataFrame(rows)


def _prior_means(tasks: pd.DataFrame, controls: list[str]) -> dict[tuple[int, str], float]:
    """(annotation_id, control) -> the mean of the rater's earlier original ratings of that control (NaN if
    none): the rater-mean baseline knows only the past."""
    out = {}
    originals = tasks[tasks["repeat_of"].isna()]
    for _, group in originals.groupby("rater_id", sort=False):
        sums = dict.fromkeys(controls, 0.0)
        counts = dict.fromkeys(controls, 0)
        for a, values in zip(group["annotation_id"], group["values"]):
            for c in controls:
                out[(a, c)] = sums[c] / counts[c] if counts[c] else np.nan
                if c in values:
                    sums[c] += values[c]
                    counts[c] += 1
    return out


def quality_inputs(tasks: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tasks, repeats) frames for sense7.research.quality.rater_quality."""
    frame = pd.DataFrame({"rater_id": tasks["rater_id"], "task_id": tasks["task_id"].astype(int),
                          "order": tasks["created"], "lead_time": tasks["lead_time"].astype(float),
                          "values": tasks["values"]})
    originals = tasks[tasks["repeat_of"].isna()]
    first = {(c, int(t), r): int(task) for c, t, r, task in zip(originals["conversation_id"], originals["turn_index"],
                                                                  originals["rater_id"], originals["task_id"])}
    repeats = [{"rater_id": r.rater_id, "task_id": first[(r.conversation_id, int(r.turn_index), r.rater_id)],
                "repeat_task_id": int(r.task_id)}
               for r in tasks[tasks["repeat_of"].notna()].itertuples(index=False)
               if (r.conversation_id, int(r.turn_index), r.rater_id) in first]
    return frame, pd.DataFrame(repeats, columns=["rater_id", "task_id", "repeat_task_id"])


def _live(tasks, joined, long, controls, levels, n_boot: int, seed: int) -> dict | None:
    """live_evaluation on the hidden arm's ratings, with the rater-mean baseline from earlier ratings."""
    hidden = long[long["arm"] != SHOWN] if len(long) else long
    if not len(hidden):
        return None
    prior = _prior_means(tasks, controls)
    ids = joined.set_index("task_id")["annotation_id"].to_dict()
    hidden = hidden.assign(rater_mean=[prior.get((ids[t], c), np.nan) for t, c in zip(hidden["task_id"], hidden["control"])])
    return live_evaluation(hidden, levels, n_boot=n_boot, seed=seed)


def live_by_version(store: Store, taxonomy, n_boot: int = 200, seed: int = 0) -> dict:
    """version -> its live evaluation block (sense7.research.live_evaluation) on the study's hidden-arm ratings."""
    controls, levels = list(taxonomy.controls), list(range(1, taxonomy.levels + 1))
    tasks = rated_tasks(store)
    joined = with_predictions(tasks, static_predictions(StudyRecords(store).predictions_frame()))
    long = _long(joined, controls) if len(joined) else pd.DataFrame()
    live = _live(tasks, joined, long, controls, levels, n_boot, seed)
    return (live or {}).get("versions") or {}


def static_predictions(predictions: pd.DataFrame) -> pd.DataFrame:
    """The served versions' own records (live pre-fills, kind live, left out): what the live evaluation
    per version scores; the live ones are scored against them by `live_gain`."""
    return predictions[predictions["kind"] != LIVE_KIND] if len(predictions) else predictions


def live_gain(tasks: pd.DataFrame, predictions: pd.DataFrame, controls: list[str], n_boot: int = 1000,
              seed: int = 0) -> dict | None:
    """The gain curve of live pre-fills (sense7.research.live_gain) on the hidden arm's ratings: each rating
    scored with the live prediction recorded last before it (kind live; none: the rater had no answers new
    to the version, so live = static, 0 own ratings), the static one (the served version's) and the
    generic one. None when the study recorded no live prediction."""
    if predictions.empty or not (predictions["kind"] == LIVE_KIND).any():
        return None
    is_live = predictions["kind"] == LIVE_KIND
    hidden = tasks[tasks["arm"] != SHOWN] if len(tasks) else tasks
    static = with_predictions(hidden, static_predictions(predictions))
    if static.empty:
        return None
    live = with_predictions(hidden, predictions[is_live]).set_index("annotation_id")
    rows = []
    for r in static.itertuples(index=False):
        seen = live.loc[r.annotation_id] if r.annotation_id in live.index else None
        live_levels = seen["levels"] if seen is not None else r.levels
        own = int(seen["own_ratings"]) if seen is not None and pd.notna(seen["own_ratings"]) else 0
        for c in controls:
            if c in r.values and c in (r.levels or {}) and c in (live_levels or {}):
                y = int(r.values[c])
                rows.append({"rater_id": r.rater_id, "own_ratings": own, "abs_error_live": abs(live_levels[c] - y),
                             "abs_error_static": abs(r.levels[c] - y), "abs_error_generic": abs(r.generic_levels[c] - y)})
    if not rows:
        return None
    return {**gain_curve(pd.DataFrame(rows), n_boot=n_boot, seed=seed), "n_ratings": len(rows),
            "arm": "hidden", "metric": "mae of the most likely level"}


def analyze_study(store: Store, taxonomy, policy: QualityPolicy | None = None, n_boot: int = 1000,
                  seed: int = 0) -> dict:
    """The study's anchoring, live evaluation, rater quality and agreement, as strict JSON."""
    policy = policy or QualityPolicy()
    controls = list(taxonomy.controls)
    levels = list(range(1, taxonomy.levels + 1))
    tasks = rated_tasks(store)
    records = StudyRecords(store)
    predictions = records.predictions_frame()
    # Anchoring pairs each rating with what its rater saw (a live pre-fill when one was recorded); the live
    # evaluation per version scores the served versions' own predictions; live_gain compares the two.
    joined = with_predictions(tasks, predictions)
    long = _long(joined, controls) if len(joined) else pd.DataFrame()
    static = with_predictions(tasks, static_predictions(predictions))
    static_long = _long(static, controls) if len(static) else pd.DataFrame()
    result: dict = {"n_rated_tasks": int(len(tasks)), "n_raters": int(tasks["rater_id"].nunique()) if len(tasks) else 0,
                    "arms": records.arm_counts(), "n_with_prediction": int(len(joined))}
    result["anchoring"] = anchoring(long, n_boot=n_boot, seed=seed) if len(long) else None
    result["live"] = _live(tasks, static, static_long, controls, levels, n_boot, seed)
    result["live_gain"] = live_gain(tasks, predictions, controls, n_boot, seed)
    quality = _quality(store, tasks, policy)
    result["quality"] = {"policy": asdict(policy), "raters": quality,
                         "flagged": sorted(r for r, q in quality.items() if q["flags"])}
    frame = store.ratings_frame()
    frame = frame[frame["dimension"].isin(controls)]
    result["agreement"] = krippendorff_alpha(frame, levels, n_boot=n_boot, seed=seed) if len(frame) else None
    result["crowd"] = crowd_coverage(store)
    return result


def crowd_coverage(store: Store) -> list[dict]:
    """Per crowd study (sense7.crowd): its assignment policy and K (the most raters a conversation may get), and
    each conversation's raters so far (`k_so_far`: slots rated or held in open leases; `rated`) and why it
    stands there (`reason`: below_floor, uncertain, settled, capped, as the policy says; `level_sd`: how
    uncertain its level is from the answers so far); [] without a crowd study."""
    from sense7.crowd.lifecycle import status

    out = []
    for row in status(store):
        c = row["coverage"]
        out.append({"study": row["study"], "policy": c.get("policy", "least_covered"), "floor": c.get("floor", 1),
                    "k": c["raters_per_conversation"], "reasons": dict(c.get("reasons") or {}),
                    "conversations": {cid: {"k_so_far": int(v["k"]), "rated": int(v["rated"]), "reason": v["reason"],
                                            "level_sd": v.get("level_sd")}
                                      for cid, v in sorted((c.get("per_conversation") or {}).items())}})
    return out


def _quality(store: Store, tasks: pd.DataFrame, policy: QualityPolicy) -> dict[str, dict]:
    """rater_quality on the store's rated tasks, repeats and instructed-item answers."""
    if tasks.empty:
        return {}
    frame, repeats = quality_inputs(tasks)
    instructed = InstructedAnswers(store).frame()
    return rater_quality(frame, policy, repeats=repeats, instructed=instructed if len(instructed) else None)


def flagged_weights(store: Store, policy: QualityPolicy) -> dict[str, float]:
    """Training weight of each rater under the quality policy (1.0 unless flagged)."""
    return training_weights(_quality(store, rated_tasks(store), policy), policy)


def study_status(store: Store, assigned: dict[str, int], policy: QualityPolicy | None = None) -> dict:
    """What a project manager asks: per rater, tasks assigned (Label Studio's count, given), done (live
    annotations credited to them, repeats included), last activity, median seconds per task and quality
    flags; totals and per-arm counts. Documented in docs/guides/researchers.md ("sense7 status --json")."""
    policy = policy or QualityPolicy()
    tasks = rated_tasks(store)
    quality = _quality(store, tasks, policy)
    raters = sorted(set(assigned) | set(tasks["rater_id"]) if len(tasks) else set(assigned))
    per_rater = []
    for rater in raters:
        own = tasks[tasks["rater_id"] == rater] if len(tasks) else tasks
        seconds = own["lead_time"].dropna() if len(own) else pd.Series(dtype=float)
        per_rater.append({
            "rater_id": rater, "assigned": int(assigned.get(rater, 0)), "done": int(len(own)),
            "last_activity": own["created"].max().isoformat() if len(own) else None,
            "median_seconds": round(float(seconds.median()), 2) if len(seconds) else None,
            "flags": [f["flag"] for f in (quality.get(rater) or {}).get("flags", [])],
        })
    arms = StudyRecords(store).arm_counts()
    done_by_arm = {arm: int((tasks[tasks["repeat_of"].isna()]["arm"] == arm).sum()) if len(tasks) else 0
                   for arm in arms}
    return {"raters": per_rater,
            "totals": {"raters": len(per_rater), "assigned": sum(r["assigned"] for r in per_rater),
                       "done": sum(r["done"] for r in per_rater),
                       "flagged": sum(bool(r["flags"]) for r in per_rater)},
            "arms": {arm: {"tasks": arms[arm], "done": done_by_arm[arm]} for arm in arms}}
