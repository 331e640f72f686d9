"""`sense7.research.analysis` recovers planted variance shares and planted post-failure drops."""

import numpy as np
import pandas as pd
import pytest

from sense7.research.analysis import after_events, analyze, variance_components
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

COLUMNS = ["conversation_id", "turn_index", "rater_id", "dimension", "rating"]


def _components(n_raters=100, n_convs=12, n_turns=6, var=(0.3, 0.2, 0.5), crossed=False, seed=0):
    """Ratings = rater effect + conversation effect + turn noise; returns the frame and realized variances."""
    rng = np.random.default_rng(seed)
    rater = rng.normal(0, np.sqrt(var[0]), n_raters)
    n_conv_ids = n_convs * (4 if crossed else n_raters)
    conv = rng.normal(0, np.sqrt(var[1]), n_conv_ids)
    rows, noise = [], []
    for r in range(n_raters):
        ids = rng.choice(n_conv_ids, n_convs, replace=False) if crossed else r * n_convs + np.arange(n_convs)
        for c in ids:
            for t in range(n_turns):
                e = rng.normal(0, np.sqrt(var[2]))
                noise.append(e)
                rows.append((f"c{c}", 2 * t + 1, f"r{r}", "overall", 3 + rater[r] + conv[c] + e))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    used = pd.unique(frame["conversation_id"].str[1:].astype(int))
    realized = np.array([np.var(rater, ddof=1), np.var(conv[used], ddof=1), np.var(noise, ddof=1)])
    return frame, realized / realized.sum()


@pytest.mark.parametrize("crossed", [False, True], ids=["nested", "crossed"])
def test_variance_shares_match_the_planted_ones(crossed):
    ratings, truth = _components(crossed=crossed)
    result = variance_components(ratings, n_boot=100)["overall"]
    share = result["share"]
    assert sum(share.values()) == pytest.approx(1.0)
    got = np.array([share["rater"], share["conversation"], share["residual"]])
    # Naive shares (variance of rater means, of conversation means) would overstate both by ~0.05-0.1.
    assert got == pytest.approx(truth, abs=0.03)
    for name, value in zip(("rater", "conversation", "residual"), truth):
        lo, hi = result["share_ci"][name]
        assert lo <= share[name] <= hi and lo <= value <= hi


def test_integer_ratings_still_give_roughly_the_planted_shares():
    ratings, truth = _components(var=(0.6, 0.4, 1.0), seed=2)
    ratings["rating"] = ratings["rating"].round().clip(1, 7)
    share = variance_components(ratings, n_boot=0)["overall"]["share"]
    # Rounding adds about 1/12 to the residual: allow for it.
    assert share["rater"] == pytest.approx(truth[0], abs=0.05)
    assert share["conversation"] == pytest.approx(truth[1], abs=0.05)


def test_no_rater_effect_gives_a_near_zero_rater_share():
    ratings, _ = _components(var=(0.0, 0.3, 0.7), seed=3)
    assert variance_components(ratings, n_boot=0)["overall"]["share"]["rater"] < 0.02


def _turns(drop=(0.0, -1.0, -1.0, 0.0), p_failure=0.1, n_raters=60, n_convs=10, n_turns=10, seed=0):
    """Per-turn ratings: after a continuity failure (continuity = 1), overall moves by drop[k] k turns on."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n_raters):
        lenient = rng.normal(0, 0.7)
        for c in range(n_convs):
            failures = rng.random(n_turns) < p_failure
            unmet = rng.random(n_turns) < 0.1  # answered, but planted with no effect
            for t in range(n_turns):
                shift = sum(drop[k] for k in range(len(drop)) if t - k >= 0 and failures[t - k])
                key = (f"c{r}_{c}", 2 * t + 1, f"r{r}")
                rows.append((*key, "overall", 3.5 + lenient + shift + rng.normal(0, 0.5)))
                rows.append((*key, "continuity", 1 if failures[t] else int(rng.integers(3, 6))))
                rows.append((*key, "expectation_met", 1 if unmet[t] else 3))
    return pd.DataFrame(rows, columns=COLUMNS)


def test_a_planted_post_failure_drop_is_detected_and_located():
    result = after_events(_turns(), n_boot=300)
    rows = result["continuity_failure"]["controls"]["overall"]
    by_offset = {row["offset"]: row for row in rows}
    for k in (1, 2):
        assert -1.35 < by_offset[k]["mean_change"] < -0.85
        assert by_offset[k]["ci"][1] < 0  # clearly below the rater's baseline
    for k in (0, 3):
        assert abs(by_offset[k]["mean_change"]) < 0.3
    assert result["continuity_failure"]["n_events"] > 300


def test_no_planted_effect_gives_intervals_around_zero():
    result = after_events(_turns(drop=(0.0,)), n_boot=300)
    for event in ("continuity_failure", "unmet_expectation"):
        for row in result[event]["controls"]["overall"]:
            assert row["ci"][0] < 0 < row["ci"][1], (event, row)


def test_baseline_is_each_raters_own():
    # A strict rater with many failures and a lenient one with none: without a per-rater baseline the
    # strict rater's low ratings would look like a post-failure drop.
    rows = []
    for c in range(20):
        for t in range(6):
            key = (f"s{c}", 2 * t + 1, "strict")
            rows += [(*key, "overall", 2), (*key, "continuity", 1 if t == 2 else 4)]
            key = (f"l{c}", 2 * t + 1, "lenient")
            rows += [(*key, "overall", 5), (*key, "continuity", 5)]
    result = after_events(pd.DataFrame(rows, columns=COLUMNS), n_boot=50)
    assert all(row["mean_change"] == pytest.approx(0) for row in result["continuity_failure"]["controls"]["overall"])


def test_analyze_is_json_ready_and_handles_conversation_level_data():
    ratings = pd.DataFrame({"conversation_id": [f"c{i // 2}" for i in range(40)], "turn_index": pd.NA,
                            "rater_id": [f"r{i % 7}" for i in range(40)], "dimension": "perceived_empathy",
                            "rating": [1 + (i * 7) % 7 for i in range(40)]})
    result = analyze(ratings, n_boot=20, taxonomy=TAXONOMY)
    assert set(result["variance_components"]) == {"perceived_empathy"}
    assert result["after_events"] == {}


def test_whole_conversation_ratings_do_not_mix_into_per_turn_shares():
    ratings, truth = _components(seed=4)
    whole = ratings.drop_duplicates(["conversation_id", "rater_id"]).assign(turn_index=pd.NA, rating=100.0)
    mixed = pd.concat([ratings, whole], ignore_index=True)
    got = variance_components(mixed, n_boot=0)["overall"]
    assert got["level"] == "turn" and got["n"] == len(ratings)
    assert got["share"]["rater"] == pytest.approx(truth[0], abs=0.03)


def test_within_conversation_comparison_separates_weak_conversations_from_the_failure():
    # Failures happen mostly in weak conversations: against the rater's baseline every turn of such a
    # conversation looks "after a failure"; against the same conversation's earlier turns only the
    # planted drop (turns +1 and +2) remains.
    rng = np.random.default_rng(5)
    rows = []
    for r in range(60):
        lenient = rng.normal(0, 0.5)
        for c in range(10):
            quality = rng.normal(0, 0.8)
            failures = rng.random(12) < (0.12 if quality < 0 else 0.01)
            failures[:3] = False  # leave a few clean turns to compare against
            for t in range(12):
                shift = -1.0 * ((t >= 1 and failures[t - 1]) + (t >= 2 and failures[t - 2]))
                key = (f"c{r}_{c}", 2 * t + 1, f"r{r}")
                rows.append((*key, "overall", 3.5 + lenient + quality + shift + rng.normal(0, 0.4)))
                rows.append((*key, "continuity", 1 if failures[t] else 4))
    result = after_events(pd.DataFrame(rows, columns=COLUMNS), n_boot=200)
    by_offset = {row["offset"]: row for row in result["continuity_failure"]["controls"]["overall"]}
    assert by_offset[3]["mean_change"] < -0.4  # confounded by conversation quality
    assert abs(by_offset[3]["vs_earlier"]["mean_change"]) < 0.25
    assert by_offset[1]["vs_earlier"]["mean_change"] < -0.7 and by_offset[1]["vs_earlier"]["ci"][1] < 0
