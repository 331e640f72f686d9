"""`sense7.research.agreement`: alpha from the ratings frame equals the package's alpha on the matching
reliability matrix, recovers planted agreement, and its interval resamples conversations."""

import krippendorff
import numpy as np
import pandas as pd
import pytest

from sense7.research.agreement import krippendorff_alpha
from sense7.research.metrics import percentile_ci

COLUMNS = ["conversation_id", "turn_index", "rater_id", "dimension", "rating"]
LEVELS = [1, 2, 3, 4, 5]


def _planted(n_conversations=200, n_turns=3, n_raters=3, noise_sd=0.7, shared_level=False, seed=0):
    """Every turn rated by every rater: rating = true level + independent noise, rounded and clipped.
    shared_level: all turns of a conversation have the same true level (strong within-cluster correlation)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n_conversations):
        conversation_level = rng.integers(1, 6)
        for t in range(n_turns):
            true = conversation_level if shared_level else rng.integers(1, 6)
            for r in range(n_raters):
                rating = int(np.clip(np.round(true + rng.normal(0, noise_sd)), 1, 5))
                rows.append((f"c{c}", 2 * t + 1, f"r{r}", "overall", rating))
    return pd.DataFrame(rows, columns=COLUMNS)


def _reliability(frame):
    """raters x units matrix (NaN = not rated), the package's own input format."""
    return frame.pivot_table(index="rater_id", columns=["conversation_id", "turn_index"], values="rating").to_numpy()


def test_perfect_agreement_is_one():
    rows = [(f"c{u // 2}", u % 2, f"r{r}", "tone", 1 + u % 5) for u in range(10) for r in range(3)]
    result = krippendorff_alpha(pd.DataFrame(rows, columns=COLUMNS), LEVELS, n_boot=50)
    tone = result["controls"]["tone"]
    assert tone["alpha"] == pytest.approx(1.0)
    assert tone["ci"] == pytest.approx([1.0, 1.0])
    assert (tone["n_units"], tone["n_raters"], tone["n_ratings"]) == (10, 3, 30)
    assert (result["level"], result["cluster"], result["n_boot"]) == ("ordinal", "conversation_id", 50)


def test_frame_to_matrix_matches_the_package_on_a_textbook_example():
    # Krippendorff's ordinal example (the package's docstring: alpha 0.815): 4 raters x 12 units.
    matrix = np.array([
        [1, 2, 3, 3, 2, 1, 4, 1, 2, np.nan, np.nan, np.nan],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, np.nan, 3],
        [np.nan, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, np.nan],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, np.nan],
    ])
    # Units share conversations and turn indices in different ways, so a conversion that keyed units on
    # the conversation or on the turn alone would merge some of them. Unit 11 has one rater only.
    units = [("a", 1), ("a", 3), ("b", 1), ("b", 3), ("c", np.nan), ("c", 1), ("d", 1), ("d", 3), ("e", 5),
             ("e", -1), ("f", 1), ("f", 3)]
    rows = [(conv, turn, f"r{r}", "overall", matrix[r, u])
            for u, (conv, turn) in enumerate(units) for r in range(4) if np.isfinite(matrix[r, u])]
    # A rater who re-rated a unit counts once, with the last rating (the one in the matrix).
    rows.insert(0, ("a", 1, "r0", "overall", 5))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    expected = krippendorff.alpha(reliability_data=matrix, value_domain=LEVELS, level_of_measurement="ordinal")

    got = krippendorff_alpha(frame, LEVELS, n_boot=20)["controls"]["overall"]

    assert expected == pytest.approx(0.815, abs=5e-4)
    assert got["alpha"] == pytest.approx(expected)
    assert got["n_units"] == 11  # the single-rater unit is not pairable
    assert got["n_ratings"] == int(np.isfinite(matrix).sum()) - 1
    assert got["n_raters"] == 4


def test_planted_agreement_is_recovered_and_noise_is_near_zero():
    frame = _planted()
    got = krippendorff_alpha(frame, LEVELS, n_boot=300)["controls"]["overall"]
    lo, hi = got["ci"]
    assert got["alpha"] > 0.5
    assert lo < got["alpha"] < hi and hi - lo > 0
    assert (got["n_units"], got["n_raters"], got["n_ratings"]) == (600, 3, 1800)

    noise = frame.assign(rating=np.random.default_rng(1).integers(1, 6, len(frame)))
    random = krippendorff_alpha(noise, LEVELS, n_boot=100)["controls"]["overall"]
    assert abs(random["alpha"]) < 0.1


def test_interval_resamples_conversations_not_turns():
    frame = _planted(n_conversations=40, n_turns=8, noise_sd=0.8, shared_level=True, seed=3)
    got = krippendorff_alpha(frame, LEVELS, n_boot=500, seed=3)["controls"]["overall"]

    matrix = _reliability(frame)
    rng = np.random.default_rng(3)
    n_units = matrix.shape[1]
    unit_boot = [krippendorff.alpha(reliability_data=matrix[:, rng.integers(0, n_units, n_units)],
                                    value_domain=LEVELS, level_of_measurement="ordinal") for _ in range(500)]
    unit_lo, unit_hi = percentile_ci(unit_boot)

    lo, hi = got["ci"]
    assert got["alpha"] == pytest.approx(
        krippendorff.alpha(reliability_data=matrix, value_domain=LEVELS, level_of_measurement="ordinal"))
    # Turns of a conversation share its true level: resampling turns as if independent understates the
    # uncertainty (about half the width here).
    assert hi - lo > 1.4 * (unit_hi - unit_lo)


def test_dimension_nobody_double_rated_has_no_alpha():
    frame = _planted(n_conversations=10, n_turns=2)
    single = frame[frame["rater_id"] == "r0"].assign(dimension="curiosity")
    got = krippendorff_alpha(pd.concat([frame, single]), LEVELS, n_boot=20)["controls"]
    assert got["curiosity"] == {"alpha": None, "ci": [None, None], "n_units": 0, "n_raters": 0, "n_ratings": 0}
    assert got["overall"]["alpha"] is not None


def test_ratings_outside_the_scale_are_an_error():
    frame = _planted(n_conversations=3, n_turns=1)
    with pytest.raises(ValueError, match="outside the scale"):
        krippendorff_alpha(frame.assign(rating=frame["rating"] + 5), LEVELS, n_boot=10)
