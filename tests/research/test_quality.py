"""`sense7.research.quality` flags careless raters from their own behaviour, never from disagreement."""

import json

import numpy as np
import pandas as pd
import pytest

from sense7.research.quality import QualityPolicy, rater_quality, training_weights

CONTROLS = ("warmth", "understanding", "continuity")


def _tasks(rater, levels, seconds, prefix=None):
    """One row per turn: levels[i] is a level for every control or a tuple of per-control levels."""
    prefix = prefix or rater
    rows = []
    for i, (level, lead) in enumerate(zip(levels, seconds)):
        per_control = level if isinstance(level, tuple) else (level,) * len(CONTROLS)
        rows.append({"rater_id": rater, "task_id": f"{prefix}-t{i}", "order": i, "lead_time": lead,
                     "values": dict(zip(CONTROLS, per_control))})
    return rows


def _honest(rater, n=20, seed=0):
    """Varying ratings (different levels across controls), 10-60 s per task."""
    rng = np.random.default_rng(seed)
    levels = [tuple(int(v) for v in rng.permutation([1, 3, 5])) for _ in range(n)]
    return _tasks(rater, levels, rng.uniform(10, 60, n))


def _flags(entry):
    return {flag["flag"]: flag["evidence"] for flag in entry["flags"]}


def test_a_rushing_rater_is_too_fast_and_honest_raters_are_not():
    rushing = _tasks("rush", [(1, 2, 3), (3, 2, 1)] * 6, [1.0, 1.5, 2.0] * 4)
    untimed = _tasks("untimed", [(1, 2, 3), (3, 2, 1)] * 6, [np.nan] * 12)
    frame = pd.DataFrame(rushing + untimed + _honest("h1", seed=1) + _honest("h2", seed=2))
    quality = rater_quality(frame)
    evidence = _flags(quality["rush"])["too_fast"]
    assert evidence["median_seconds"] == 1.5 and evidence["timed_tasks"] == 12
    assert quality["rush"]["median_seconds"] == 1.5
    assert quality["h1"]["flags"] == [] and quality["h2"]["flags"] == []
    assert 10 <= quality["h1"]["median_seconds"] <= 60
    assert quality["untimed"]["median_seconds"] is None and quality["untimed"]["flags"] == []
    json.dumps(quality, allow_nan=False)


def test_straight_lining_needs_one_level_for_every_control_and_across_the_run():
    varied = [(1, 2, 3), (4, 2, 5)]
    straight = _tasks("straight", varied + [3] * 10 + varied, [20.0] * 14)
    # One level per turn, but a different one each turn: a legitimate rating pattern.
    uniform_turns = _tasks("uniform", [1, 2, 3, 4, 5, 4, 3, 2, 1, 2, 3, 4], [20.0] * 12)
    short = _tasks("short", varied + [4] * 5 + varied, [20.0] * 9)
    exact = _tasks("exact", varied + [2] * 6 + varied, [20.0] * 10)
    quality = rater_quality(pd.DataFrame(straight + uniform_turns + short + exact))
    assert _flags(quality["straight"])["straight_lining"] == {
        "run": 10, "level": 3, "first_task_id": "straight-t2", "last_task_id": "straight-t11",
        "share_of_turns": 0.714, "straight_line_turns": 6, "straight_line_share": 0.5}
    assert quality["uniform"]["flags"] == [] and quality["uniform"]["straight_line_run"] == 1
    assert quality["short"]["flags"] == [] and quality["short"]["straight_line_run"] == 5
    assert "straight_lining" in _flags(quality["exact"])


def test_a_run_at_the_floor_that_is_a_minority_of_the_turns_is_not_straight_lining():
    # An honest rater whose assistant kept failing for 8 turns (all 1s), among 25 varied turns: a run long
    # enough, but 32% of their turns (the paper-scale demo saw 5 such honest raters); the same run over
    # most of the turns is flagged.
    varied = [(1, 2, 3), (4, 2, 5), (3, 4, 2), (5, 3, 4)]
    honest = _tasks("honest", varied * 2 + [1] * 8 + varied * 2 + [(2, 3, 4)], [20.0] * 25)
    lazy = _tasks("lazy", varied[:2] + [1] * 8, [20.0] * 10)
    quality = rater_quality(pd.DataFrame(honest + lazy))
    assert quality["honest"]["straight_line_run"] == 8 and quality["honest"]["flags"] == []
    assert _flags(quality["lazy"])["straight_lining"]["share_of_turns"] == 0.8
    assert "straight_lining" in _flags(rater_quality(pd.DataFrame(honest), QualityPolicy(straight_line_share=0.3))["honest"])


def test_turns_are_taken_in_order_not_in_row_order():
    # Rows arrive shuffled; by `order` the 2s are consecutive. A row-order scan would see no run.
    rows = _tasks("r", [(1, 2, 3)] * 2 + [2] * 8 + [(5, 4, 3)] * 2, [20.0] * 12)
    frame = pd.DataFrame(rows).sample(frac=1.0, random_state=3)
    assert rater_quality(frame)["r"]["straight_line_run"] == 8
    rows = _tasks("r", [2, (1, 2, 3)] * 6, [20.0] * 12)
    frame = pd.DataFrame(rows).sort_values("values", key=lambda v: v.map(lambda d: len(set(d.values()))))
    assert rater_quality(frame)["r"]["straight_line_run"] == 1


def _retest_frame(rater, first_levels, repeat_levels):
    """Honest turns, plus originals and later repeats with the given per-control levels."""
    rows = _honest(rater, n=10)
    for i, (a, b) in enumerate(zip(first_levels, repeat_levels)):
        rows += [{"rater_id": rater, "task_id": f"{rater}-o{i}", "order": 100 + i, "lead_time": 20.0,
                  "values": dict(zip(CONTROLS, a))},
                 {"rater_id": rater, "task_id": f"{rater}-rep{i}", "order": 200 + i, "lead_time": 20.0,
                  "values": dict(zip(CONTROLS, b))}]
    pairs = [{"rater_id": rater, "task_id": f"{rater}-o{i}", "repeat_task_id": f"{rater}-rep{i}"}
             for i in range(len(first_levels))]
    return rows, pairs


def test_retest_flags_random_repeats_but_not_consistent_ones_or_a_single_pair():
    consistent = _retest_frame("steady", [(1, 3, 5), (2, 4, 4), (5, 1, 2)], [(1, 4, 5), (2, 4, 3), (5, 1, 2)])
    random = _retest_frame("random", [(1, 5, 1), (5, 1, 5), (1, 1, 5)], [(5, 1, 4), (1, 5, 2), (4, 5, 1)])
    single = _retest_frame("single", [(1, 1, 1)], [(5, 5, 5)])
    rows = consistent[0] + random[0] + single[0]
    # A pair whose repeat the rater never rated is ignored.
    pairs = consistent[1] + random[1] + single[1] + [
        {"rater_id": "steady", "task_id": "steady-o0", "repeat_task_id": "missing"}]
    quality = rater_quality(pd.DataFrame(rows), repeats=pd.DataFrame(pairs))

    assert quality["steady"]["retest"] == {"pairs": 3, "mean_distance": pytest.approx(2 / 9),
                                           "exact_share": pytest.approx(7 / 9)}
    assert quality["steady"]["flags"] == []
    evidence = _flags(quality["random"])["inconsistent"]
    assert evidence["pairs"] == 3 and evidence["mean_distance"] == pytest.approx(33 / 9)
    assert evidence["task_pairs"] == [["random-o0", "random-rep0"], ["random-o1", "random-rep1"],
                                      ["random-o2", "random-rep2"]]
    assert quality["single"]["retest"]["pairs"] == 1 and quality["single"]["retest"]["mean_distance"] == 4.0
    assert quality["single"]["flags"] == []  # one pair is too few to judge
    assert rater_quality(pd.DataFrame(rows))["random"]["retest"] is None
    json.dumps(quality, allow_nan=False)


def test_failed_instructed_items_are_flagged_with_the_items():
    rows = _honest("careless", seed=4) + _honest("careful", seed=5)
    instructed = pd.DataFrame([
        {"rater_id": "careless", "task_id": "careless-t3", "item": "attention_1", "answered": 4, "expected": 2},
        {"rater_id": "careless", "task_id": "careless-t9", "item": "attention_2", "answered": 5, "expected": 5},
        {"rater_id": "careful", "task_id": "careful-t3", "item": "attention_1", "answered": 2, "expected": 2},
        {"rater_id": "careful", "task_id": "careful-t9", "item": "attention_2", "answered": 5, "expected": 5},
    ])
    quality = rater_quality(pd.DataFrame(rows), instructed=instructed)
    evidence = _flags(quality["careless"])["failed_instructed"]
    assert evidence["items"] == 2 and evidence["share_correct"] == 0.5
    assert evidence["failed"] == [{"task_id": "careless-t3", "item": "attention_1", "answered": 4, "expected": 2}]
    assert quality["careful"]["instructed"] == {"items": 2, "share_correct": 1.0}
    assert quality["careful"]["flags"] == []
    lenient = rater_quality(pd.DataFrame(rows), QualityPolicy(instructed_min_share=0.5), instructed=instructed)
    assert lenient["careless"]["flags"] == []
    json.dumps(quality, allow_nan=False)


def test_no_flag_on_fewer_than_min_tasks():
    rows = _tasks("new", [3] * 4, [1.0] * 4)
    quality = rater_quality(pd.DataFrame(rows))
    assert quality["new"]["n_tasks"] == 4 and quality["new"]["median_seconds"] == 1.0
    assert quality["new"]["flags"] == []
    permissive = rater_quality(pd.DataFrame(rows), QualityPolicy(min_tasks=4, straight_line_turns=4))
    assert set(_flags(permissive["new"])) == {"too_fast", "straight_lining"}


def test_training_weights_follow_the_policy():
    rows = _tasks("rush", [(1, 2, 3)] * 8, [1.0] * 8) + _honest("honest")
    quality = rater_quality(pd.DataFrame(rows))
    assert training_weights(quality, QualityPolicy()) == {"rush": 0.0, "honest": 1.0}
    assert training_weights(quality, QualityPolicy(training="keep")) == {"rush": 1.0, "honest": 1.0}
    assert training_weights({}, QualityPolicy()) == {}


def test_policy_from_env_parses_and_names_the_bad_variable():
    policy = QualityPolicy.from_env({
        "SENSE7_QUALITY_MIN_MEDIAN_SECONDS": "2.5", "SENSE7_QUALITY_MIN_TASKS": "3",
        "SENSE7_QUALITY_TRAINING": " Keep ",
        "SENSE7_QUALITY_RETEST_MAX_DISTANCE": "", "OTHER": "x"})
    assert policy == QualityPolicy(min_median_seconds=2.5, min_tasks=3, training="keep")
    assert QualityPolicy.from_env({}) == QualityPolicy()
    bad = {"SENSE7_QUALITY_MIN_MEDIAN_SECONDS": "fast", "SENSE7_QUALITY_MIN_TASKS": "2.5",
           "SENSE7_QUALITY_TRAINING": "downweight", "SENSE7_QUALITY_INSTRUCTED_MIN_SHARE": "1.5",
           "SENSE7_QUALITY_RETEST_MAX_DISTANCE": "nan"}
    for variable, value in bad.items():
        with pytest.raises(ValueError, match=variable):
            QualityPolicy.from_env({variable: value})
    with pytest.raises(ValueError, match="training"):
        QualityPolicy(training="drop")
