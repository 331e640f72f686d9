"""`sense7.research.anchoring` recovers a planted probability of copying a shown pre-fill."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from sense7.research.anchoring import anchoring, simulate_anchored

CONTROLS = ("warmth", "understanding", "continuity")


def _study(copy_probability, n_raters=300, n_tasks=40, seed=0):
    """Per-task randomized arms. A rater's own rating = true level + rater offset + noise (1..5); the
    prediction is a noisy guess of it; in the shown arm each control's pre-fill is kept with
    `copy_probability` (independently per control, as the estimator's per-rating model assumes).
    Shown tasks are planted 20% faster (median 24 s against 30 s)."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n_raters):
        offset = rng.normal(0, 0.7)
        for t in range(n_tasks):
            arm = "shown" if rng.random() < 0.5 else "hidden"
            seconds = rng.lognormal(np.log(30), 0.5) * (0.8 if arm == "shown" else 1.0)
            for control in CONTROLS:
                own = int(np.clip(np.round(rng.uniform(1, 5) + offset + rng.normal(0, 0.5)), 1, 5))
                predicted = int(np.clip(own + np.round(rng.normal(0, 1.0)), 1, 5))
                rating = simulate_anchored(own, predicted if arm == "shown" else None, copy_probability, rng)
                rows.append((f"r{r}", f"t{r}_{t}", arm, control, rating, predicted, seconds))
    return pd.DataFrame(rows, columns=["rater_id", "task_id", "arm", "control", "rating", "predicted",
                                       "lead_time"])


@pytest.fixture(scope="module")
def results():
    return {p: anchoring(_study(p), n_boot=500) for p in (0.0, 0.2, 0.5)}


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5])
def test_copy_rate_recovers_the_planted_copy_probability(results, p):
    result = results[p]
    copy = result["controls"]["__all__"]["copy_rate"]
    # The raw difference of shares would be p * (1 - chance agreement), about 0.6 p here: too low.
    assert copy["value"] == pytest.approx(p, abs=0.05)
    assert copy["ci"][0] <= p <= copy["ci"][1]
    for control in CONTROLS:
        assert result["controls"][control]["copy_rate"]["value"] == pytest.approx(p, abs=0.07)
    hidden = result["controls"]["__all__"]["arms"]["hidden"]["share_equal"]
    assert result["controls"]["__all__"]["share_equal_difference"]["value"] == pytest.approx(
        p * (1 - hidden), abs=0.04)


def test_shift_toward_prediction_is_zero_without_copying_and_positive_with(results):
    lo, hi = results[0.0]["controls"]["__all__"]["shift_toward_prediction"]["ci"]
    assert lo <= 0 <= hi
    shift = results[0.5]["controls"]["__all__"]["shift_toward_prediction"]
    assert shift["ci"][0] > 0.2 and shift["value"] > 0.3


def test_planted_faster_shown_tasks_show_in_seconds_difference(results):
    result = results[0.2]
    assert result["n_raters"] == 300
    assert result["arms"]["shown"]["median_seconds"] == pytest.approx(24, abs=1.5)
    assert result["arms"]["hidden"]["median_seconds"] == pytest.approx(30, abs=1.5)
    difference = result["seconds_difference"]
    assert difference["value"] == pytest.approx(-6, abs=2)
    assert difference["ci"][0] < difference["value"] < difference["ci"][1] < 0


def _tiny():
    rows = [  # rater, task, arm, control, rating, predicted, seconds
        ("r1", "t1", "shown", "c1", 3, 3, 10.0), ("r1", "t1", "shown", "c2", 2, 4, 10.0),
        ("r1", "t2", "hidden", "c1", 1, 3, 20.0), ("r1", "t2", "hidden", "c2", 4, 4, 20.0),
        ("r2", "t3", "shown", "c1", 5, 5, 40.0), ("r2", "t3", "shown", "c2", 5, 5, 40.0),
        ("r2", "t4", "hidden", "c1", 2, 5, np.nan), ("r2", "t4", "hidden", "c2", 4, 5, np.nan),
    ]
    return pd.DataFrame(rows, columns=["rater_id", "task_id", "arm", "control", "rating", "predicted",
                                       "lead_time"])


def test_hand_computed_shares_distances_and_seconds():
    result = anchoring(_tiny(), n_boot=50)
    assert result["n_raters"] == 2
    # Shown times 10 and 40; hidden: 20 (t4's is unknown).
    assert result["arms"] == {"shown": {"n_tasks": 2, "n_raters": 2, "median_seconds": 25.0},
                              "hidden": {"n_tasks": 2, "n_raters": 2, "median_seconds": 20.0}}
    assert result["seconds_difference"]["value"] == 5.0
    c1, c2, pooled = (result["controls"][k] for k in ("c1", "c2", "__all__"))
    assert c1["arms"] == {"shown": {"n": 2, "share_equal": 1.0, "mean_distance": 0.0},
                          "hidden": {"n": 2, "share_equal": 0.0, "mean_distance": 2.5}}
    assert c1["shift_toward_prediction"]["value"] == 2.5 and c1["copy_rate"]["value"] == 1.0
    assert c2["arms"] == {"shown": {"n": 2, "share_equal": 0.5, "mean_distance": 1.0},
                          "hidden": {"n": 2, "share_equal": 0.5, "mean_distance": 0.5}}
    assert c2["shift_toward_prediction"]["value"] == -0.5 and c2["copy_rate"]["value"] == 0.0
    assert pooled["arms"]["shown"] == {"n": 4, "share_equal": 0.75, "mean_distance": 0.5}
    assert pooled["arms"]["hidden"] == {"n": 4, "share_equal": 0.25, "mean_distance": 1.5}
    assert pooled["share_equal_difference"]["value"] == 0.5
    assert pooled["copy_rate"]["value"] == pytest.approx(2 / 3)  # 0.5 / (1 - 0.25)
    json.dumps(result, allow_nan=False)


def test_one_arm_gives_no_differences_and_strict_json():
    frame = _tiny()
    result = anchoring(frame[frame["arm"] == "shown"], n_boot=50)
    assert result["arms"]["hidden"] == {"n_tasks": 0, "n_raters": 0, "median_seconds": None}
    assert result["seconds_difference"] == {"value": None, "ci": [None, None]}
    for control in ("c1", "c2", "__all__"):
        entry = result["controls"][control]
        assert entry["arms"]["hidden"] == {"n": 0, "share_equal": None, "mean_distance": None}
        assert entry["arms"]["shown"]["share_equal"] is not None
        for key in ("shift_toward_prediction", "share_equal_difference", "copy_rate"):
            assert entry[key] == {"value": None, "ci": [None, None]}
    json.dumps(result, allow_nan=False)


def test_hidden_arm_always_equal_leaves_copy_rate_undefined():
    frame = _tiny()
    frame.loc[frame["arm"] == "hidden", "rating"] = frame["predicted"]
    entry = anchoring(frame, n_boot=20)["controls"]["__all__"]
    assert entry["copy_rate"]["value"] is None
    assert math.isclose(entry["share_equal_difference"]["value"], -0.25)
    json.dumps(entry, allow_nan=False)


def test_unknown_arm_is_rejected():
    with pytest.raises(ValueError, match="unknown arm"):
        anchoring(_tiny().assign(arm="both"))


def test_simulate_anchored_copies_only_a_shown_prediction():
    rng = np.random.default_rng(0)
    assert all(simulate_anchored(2, None, 1.0, rng) == 2 for _ in range(20))
    assert all(simulate_anchored(2, 5, 1.0, rng) == 5 for _ in range(20))
    copied = np.mean([simulate_anchored(2, 5, 0.3, rng) == 5 for _ in range(4000)])
    assert copied == pytest.approx(0.3, abs=0.03)
