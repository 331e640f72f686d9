"""Assignment policies: which conversations of the pool a participant rates next (the study file's `assignment:`).

Every policy is a small class: its parameters in `__init__` (a frozen dataclass), one method
`choose(taken, rater_id, exclude, turns, ratings, allowed) -> [(conversation, slot number)]`, no hidden
state: the same call in the running study (sense7.crowd.assignment.Assignments reads the state from the
store) and in the replay (sense7.crowd.replay) gives the same answer. A policy only *orders* the open
conversations; the base class applies what every policy must obey:

- the cap: never a conversation beyond `raters_per_conversation` (K max), never one this participant had
  (`exclude`), never one outside `allowed` (the replay: only what this rater rated in the data);
- the floor: while a conversation this participant could take has fewer than `floor` raters, no
  conversation at or above the floor is given to them (conversations below it come first, in the policy's
  order), so no conversation starves; `floor=0` lets the policy leave conversations unrated;
- N conversations per participant, or whole conversations within a budget of assistant turns.

Policies (`POLICIES`):
- `least_covered` (the default; the rule before issue 41): least covered first, ties by a hash of (rater,
  conversation) so simultaneous participants spread out; with a turn budget it never leapfrogs a long,
  less covered conversation (coverage stays balanced within 1).
- `random`: a seeded shuffle per (seed, rater), no other input.
- `learn_rater`: the conversations whose answer most reduces the study's posterior uncertainty, given the
  answers so far (`ratings`); its first `anchors` picks for a participant (default 1) are chosen for what
  they teach about this participant and are exempt from the floor, the others obey it. The rater model is
  the live posterior's (sense7.model.live_posterior) in the form it takes without a text model: a rating is
  the conversation's level m_c plus the rater's intercept and slope, y = m_c + a + s (m_c - m) + noise, with
  (a, s) a Gaussian posterior (precision T^-1 + sum d d' / v, d = [1, m_c - m]); m_c is estimated from the
  other raters' answers (leniency removed, `item_levels`) and its uncertainty adds to the noise v of a
  rating of it. A conversation's score (log-determinants, summed): the participant's own gain
  log(1 + w d' P^-1 d / v) (w: what the scale keeps of the rating where they are expected to give it,
  `ordinal_information`: an answer expected at the end of the scale is censored), the gain of each earlier
  rater of it (the new answer narrows its level, so their answer says more about them), and, after the
  anchors, its level's own (log(var before / var after)). The participant's gain alone (issue 41) fed
  conversations already settled, often ones that only looked extreme because their raters disagreed, and
  was worse than random on the planted disagreement data (docs/BENCHMARKS.md).
- `settle_items`: K varies per conversation within [floor, K max]: the conversations whose level is least
  certain come first (posterior sd of m_c, which grows with the raters' disagreement on it: a per-item noise
  shrunk to the pool's), and a conversation whose sd fell below `settled_sd` (scale points) once it has
  `floor` raters is settled: offered to nobody. Ordinal-aware: ratings are scale positions (distances
  between levels count), not unordered categories.

`conversation_state` tells, per conversation, its K so far and why it stands there (capped, settled,
uncertain, below floor), for `sense7 crowd status`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np
from scipy.special import ndtr

Ratings = Mapping[str, Mapping[str, float]]  # conversation -> rater -> rating (scale position; mean over turns)


def _tie(rater_id: str, conversation: str, salt: str = "") -> str:
    return hashlib.sha256(f"{salt}{rater_id}\0{conversation}".encode()).hexdigest()


@dataclass(frozen=True)
class ItemLevels:
    """What the answers so far say about each conversation and rater: `level` (m_c), `level_var` (its
    posterior variance), `leniency` (a rater's intercept a), `mean` (m, all ratings), `noise` (pooled)."""

    level: dict
    level_var: dict
    leniency: dict
    mean: float
    noise: float
    prior_var: float
    item_noise: dict = None  # conversation -> its own noise (disagreement), shrunk to the pool's `noise`

    def noise_of(self, conversation: str) -> float:
        return (self.item_noise or {}).get(conversation, self.noise)


def item_levels(ratings: Ratings, leniency_sd: float = 0.5, noise_prior: float = 4.0,
                iterations: int = 4) -> ItemLevels:
    """Conversation levels and rater leniencies from the answers so far (additive model y = m_c + a_r + e,
    Gaussian priors, a few alternating ridge steps: the E-step of sense7.model.rater_effects without text).

    A conversation's noise is its own leniency-free spread shrunk to the pool's (`noise_prior`: weight of
    the pool's, in ratings), so a conversation raters disagree on stays uncertain with more raters."""
    conv, rater, y = [], [], []
    for c, by in ratings.items():
        for r, value in by.items():
            if value is not None and np.isfinite(value):
                conv.append(c)
                rater.append(r)
                y.append(float(value))
    if not y:
        return ItemLevels({}, {}, {}, float("nan"), 1.0, 1.0)
    y = np.asarray(y)
    conv_codes, conv_names = _codes(conv)
    rater_codes, rater_names = _codes(rater)
    mean = float(y.mean())
    total_var = float(y.var()) if len(y) > 1 else 1.0
    prior_var = max(total_var, 0.25)  # spread of conversation levels before any rating (scale points^2)
    noise = max(0.5 * total_var, 0.05)
    lam_item = noise / prior_var
    lam_rater = noise / max(leniency_sd ** 2, 1e-6)
    n_c = np.bincount(conv_codes, minlength=len(conv_names)).astype(float)
    n_r = np.bincount(rater_codes, minlength=len(rater_names)).astype(float)
    a = np.zeros(len(rater_names))
    for _ in range(iterations):
        m = mean + np.bincount(conv_codes, y - mean - a[rater_codes], len(conv_names)) / (n_c + lam_item)
        a = np.bincount(rater_codes, y - m[conv_codes], len(rater_names)) / (n_r + lam_rater)
    resid = y - a[rater_codes]
    # per conversation: spread of leniency-free ratings (0 with one rater), shrunk to the pool's noise
    sums = np.bincount(conv_codes, resid, len(conv_names))
    sq = np.bincount(conv_codes, resid ** 2, len(conv_names))
    within = np.maximum(sq - sums ** 2 / np.maximum(n_c, 1), 0.0)  # sum of squared deviations
    pooled = float(within.sum() / max((n_c - 1).clip(min=0).sum(), 1)) if (n_c > 1).any() else noise
    noise = max(pooled, 0.05)
    item_noise = (noise_prior * noise + within) / (noise_prior + np.maximum(n_c - 1, 0))
    var = 1.0 / (1.0 / prior_var + n_c / item_noise)
    return ItemLevels(dict(zip(conv_names, m.tolist())), dict(zip(conv_names, var.tolist())),
                      dict(zip(rater_names, a.tolist())), mean, noise, prior_var,
                      dict(zip(conv_names, item_noise.tolist())))


def _codes(values: list) -> tuple[np.ndarray, list]:
    names = list(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(names)}
    return np.fromiter((index[v] for v in values), int, len(values)), names


@dataclass(frozen=True)
class RaterPosterior:
    """A rater's (intercept, slope) posterior: `mean` (2,), `precision` (2, 2); `design(m_c)` its d."""

    mean: np.ndarray
    precision: np.ndarray
    centre: float

    def design(self, level: float) -> np.ndarray:
        return np.array([1.0, level - self.centre])

    def predict(self, level: float) -> float:
        """The rater's expected rating of a conversation at `level`."""
        return float(level + self.design(level) @ self.mean)


def rater_posterior(rater_id: str, ratings: Ratings, levels: ItemLevels, leniency_sd: float = 0.5,
                    slope_sd: float = 0.3) -> RaterPosterior:
    """The live posterior (sense7.model.live_posterior) with the conversation's level in place of the text score:
    precision = T^-1 + sum_i d_i d_i' / v_i, d_i = [1, m_i - m], v_i = noise_i + var(m_i) (noise_i: the
    conversation's own, larger where raters disagree on it); the level m_i is
    estimated from the *other* raters' answers (this rater's own answer removed), so a conversation only
    this rater rated says nothing about them."""
    centre = levels.mean if np.isfinite(levels.mean) else 0.0
    T_inv = np.diag([1.0 / leniency_sd ** 2, 1.0 / slope_sd ** 2])
    precision, rhs = T_inv.copy(), np.zeros(2)
    for c, by in ratings.items():
        y = by.get(rater_id)
        if y is None or not np.isfinite(y):
            continue
        others = [v - levels.leniency.get(r, 0.0) for r, v in by.items() if r != rater_id and np.isfinite(v)]
        noise = levels.noise_of(c)  # raters who disagree on it: its answer says less about this rater
        level, var = others_level(others, levels, centre, noise)
        d = np.array([1.0, level - centre])
        v = noise + var
        precision += np.outer(d, d) / v
        rhs += d * (y - level) / v
    return RaterPosterior(np.linalg.solve(precision, rhs), precision, centre)


def others_level(others: list[float], levels: ItemLevels, centre: float | None = None,
                 noise: float | None = None) -> tuple[float, float]:
    """(level, variance) of a conversation from other raters' leniency-free answers (normal prior centred on
    `centre`, by default the mean of every rating; `noise`: the conversation's own, default the pool's)."""
    if centre is None:
        centre = levels.mean if np.isfinite(levels.mean) else 0.0
    prior_var, noise = levels.prior_var, levels.noise if noise is None else noise
    precision = 1.0 / prior_var + len(others) / noise
    return (centre / prior_var + sum(others) / noise) / precision, 1.0 / precision


def ordinal_information(mean: float, sd: float, low: float, high: float, step: float = 1.0) -> float:
    """The share of a continuous rating's information about its mean (Fisher's, sd known) that is kept when
    the rating, normal(mean, sd), is recorded on the scale's positions low, low + step, ..., high (rounded
    to the nearest; the ends take everything beyond them). Near 1 inside the scale; towards 0 where the
    rating is expected beyond an end: a rater who puts a conversation at the top of the scale says the same
    whatever their leniency, so such a rating teaches little about them."""
    cuts = np.arange(low + step / 2, high, step)
    z = (cuts - mean) / max(sd, 1e-9)
    cdf = np.concatenate([[0.0], ndtr(z), [1.0]])
    pdf = np.concatenate([[0.0], np.exp(-0.5 * z ** 2) / np.sqrt(2 * np.pi), [0.0]])
    share = np.diff(cdf)
    slope = np.diff(pdf)  # -(d share / d mean) * sd
    keep = share > 1e-12
    return float(np.clip(np.sum(slope[keep] ** 2 / share[keep]), 0.0, 1.0))


@dataclass(frozen=True)
class Policy:
    """The caps and the walk shared by every policy; a subclass gives `order` (and may close conversations
    with `settled`). K max = `raters_per_conversation`; N = `conversations_per_participant` (or None with a
    `turn_budget` of assistant turns); `floor`: raters every conversation gets before any gets more."""

    raters_per_conversation: int
    conversations_per_participant: int | None
    turn_budget: int | None = None
    floor: int = 1

    name = "policy"
    uses_ratings = False  # whether `choose` reads the answers so far (the store is then read for them)
    balanced = False  # least_covered's turn-budget rule: never leapfrog a less covered conversation

    def order(self, open_: list[str], taken, rater_id: str, ratings: Ratings | None) -> list[str]:
        raise NotImplementedError

    def settled(self, ratings: Ratings | None, levels: ItemLevels | None = None) -> set[str]:
        """Conversations this policy offers to nobody any more (below K max, at or above the floor)."""
        return set()

    def exempt(self, ordered: list[str]) -> list[str]:
        """The first picks this policy makes whatever the floor (learn_rater's `anchors`); none by default."""
        return []

    def choose(self, taken: Mapping[str, set], rater_id: str, exclude=frozenset(), turns: Mapping[str, int] | None = None,
               ratings: Ratings | None = None, allowed=None) -> list[tuple[str, int]]:
        """(conversation, free slot number) for up to N conversations (or a turn budget's worth: `turns` gives
        every pool conversation's assistant turns). `taken`: every pool conversation -> slot numbers held;
        `exclude`: conversations this participant had; `ratings`: the answers so far (conversation -> rater
        -> rating), read by the policies that learn from them; `allowed`: the only conversations this
        participant may get (None: any)."""
        k = self.raters_per_conversation
        closed = self.settled(ratings) if ratings is not None else set()
        open_ = [c for c in taken if c not in exclude and len(taken[c]) < k
                 and (allowed is None or c in allowed)
                 and not (c in closed and len(taken[c]) >= self.floor)]
        ordered = self.order(open_, taken, rater_id, ratings)
        first = self.exempt(ordered)
        rest = [c for c in ordered if c not in first]
        below = [c for c in rest if len(taken[c]) < self.floor]
        # the floor: conversations below it first, in the policy's order (after the exempt picks)
        ordered = first + below + [c for c in rest if len(taken[c]) >= self.floor]
        chosen: list[str] = []
        left, ceiling = self.turn_budget, None
        for conversation in ordered:
            if self.conversations_per_participant is not None and len(chosen) >= self.conversations_per_participant:
                break
            if left is not None:
                coverage = len(taken[conversation])
                if left <= 0 or (self.balanced and ceiling is not None and coverage > ceiling):
                    break
                length = (turns or {}).get(conversation, 1)
                if length > left:
                    ceiling = coverage if ceiling is None else ceiling
                    continue
                left -= length
            chosen.append(conversation)
        return [(c, min(set(range(k)) - set(taken[c]))) for c in chosen]


@dataclass(frozen=True)
class LeastCovered(Policy):
    name = "least_covered"
    balanced = True

    def order(self, open_, taken, rater_id, ratings):
        return sorted(open_, key=lambda c: (len(taken[c]), _tie(rater_id, c)))


@dataclass(frozen=True)
class RandomOrder(Policy):
    seed: int = 0
    name = "random"

    def order(self, open_, taken, rater_id, ratings):
        return sorted(open_, key=lambda c: _tie(rater_id, c, f"{self.seed}\0"))


@dataclass(frozen=True)
class LearnRater(Policy):
    leniency_sd: float = 0.5  # prior sd of a rater's intercept (scale points)
    # prior sd of a rater's slope on the conversation's level: 0.15, half the per-rater model's, because a
    # slope is learnt from conversations that look extreme, and with few raters a conversation looks extreme
    # mostly when they disagree on it (the planted camps: 0.3 made learn_rater worse than random there)
    slope_sd: float = 0.15
    anchors: int = 1  # picks per participant made for what they teach, whatever the floor (the rest: under it)
    ordinal: bool = True  # weigh a rating by what the scale keeps of it (False: the scale as unbounded)
    scale: tuple | None = None  # (lowest, highest) scale position; None: the lowest and highest rating so far
    shared: bool = True  # count what the answer teaches about the conversation's earlier raters too
    levels: bool = True  # and about the conversation's level (after the anchors)
    name = "learn_rater"
    uses_ratings = True

    def exempt(self, ordered):
        return ordered[:self.anchors]

    def gains(self, candidates, rater_id: str, ratings: Ratings | None) -> dict[str, float]:
        """Each candidate's reduction of posterior uncertainty (log-determinant of the precision) if this
        rater rated it next: their own, log(1 + w d' P^-1 d / v) (w: the share of a rating's information
        the scale keeps where they are expected to rate it, `ordinal_information`), plus, with `shared`,
        each earlier rater's of that conversation: the new answer narrows its level, so their answer to it
        says more about them (v falls). Without the second term the policy keeps feeding the
        conversations it already knows and leaves the ones rated once, which teach nobody until a second
        rater comes."""
        ratings = ratings or {}
        levels = item_levels(ratings, self.leniency_sd)
        posterior = rater_posterior(rater_id, ratings, levels, self.leniency_sd, self.slope_sd)
        cov = np.linalg.inv(posterior.precision)
        centre = posterior.centre
        seen = [v for by in ratings.values() for v in by.values() if v is not None and np.isfinite(v)]
        low, high = (self.scale if self.scale is not None else
                     (min(seen), max(seen)) if seen else (None, None))
        ordinal = self.ordinal and low is not None and high > low
        others_cov: dict[str, np.ndarray] = {}  # an earlier rater's posterior covariance, made once per call
        out = {}
        for c in candidates:
            by = ratings.get(c) or {}
            others = [v - levels.leniency.get(r, 0.0) for r, v in by.items() if r != rater_id and np.isfinite(v)]
            noise = levels.noise_of(c)
            level, var = others_level(others, levels, centre, noise)
            d = posterior.design(level)
            spread = float(d @ cov @ d)
            kept = ordinal_information(posterior.predict(level), np.sqrt(noise + var + spread), low, high) if ordinal else 1.0
            gain = float(np.log1p(kept * spread / (noise + var)))
            if self.shared:
                for r, v in by.items():
                    if r == rater_id or not np.isfinite(v):
                        continue
                    if r not in others_cov:
                        others_cov[r] = np.linalg.inv(rater_posterior(r, ratings, levels, self.leniency_sd,
                                                                      self.slope_sd).precision)
                    rest = [w - levels.leniency.get(q, 0.0) for q, w in by.items()
                            if q not in (r, rater_id) and np.isfinite(w)]
                    level_r, var_before = others_level(rest, levels, centre, noise)
                    var_after = 1.0 / (1.0 / var_before + 1.0 / noise)  # one more answer to the level
                    d_r = np.array([1.0, level_r - centre])
                    more = 1.0 / (noise + var_after) - 1.0 / (noise + var_before)  # precision along d_r
                    gain += float(np.log1p(more * (d_r @ others_cov[r] @ d_r)))
            out[c] = gain
        return out

    def level_gains(self, candidates, ratings: Ratings | None) -> dict[str, float]:
        """Each candidate's reduction of its level's posterior uncertainty if one more rater rated it:
        log(var before / var after), on the same scale as `gains`. Largest for a conversation few raters
        rated; it stays large where they disagree (its own noise)."""
        levels = item_levels(ratings or {}, self.leniency_sd)
        out = {}
        for c in candidates:
            var = levels.level_var.get(c, levels.prior_var)
            out[c] = float(np.log1p(var / levels.noise_of(c)))  # 1/var_after = 1/var + 1/noise
        return out

    def order(self, open_, taken, rater_id, ratings):
        """The `anchors` first by what they teach about this rater alone; the others by what they teach
        the study: this rater, the conversation's earlier raters and (with `levels`) its level."""
        gain = self.gains(open_, rater_id, ratings)
        rank = lambda score: sorted(open_, key=lambda c: (-round(score[c], 12), len(taken[c]), _tie(rater_id, c)))
        first = rank(gain)[:self.anchors]
        if self.levels:
            level = self.level_gains(open_, ratings)
            gain = {c: gain[c] + level[c] for c in open_}
        return first + [c for c in rank(gain) if c not in first]


@dataclass(frozen=True)
class SettleItems(Policy):
    settled_sd: float = 0.35  # a conversation whose level's posterior sd is below this (scale points) is settled
    leniency_sd: float = 0.5
    name = "settle_items"
    uses_ratings = True

    def level_sd(self, ratings: Ratings | None, levels: ItemLevels | None = None) -> dict[str, float]:
        """Posterior sd of each rated conversation's level (unrated ones: absent, i.e. the prior's)."""
        levels = levels or item_levels(ratings or {}, self.leniency_sd)
        return {c: float(np.sqrt(v)) for c, v in levels.level_var.items()}

    def settled(self, ratings, levels=None):
        return {c for c, sd in self.level_sd(ratings, levels).items() if sd < self.settled_sd}

    def order(self, open_, taken, rater_id, ratings):
        sd = self.level_sd(ratings)
        return sorted(open_, key=lambda c: (-round(sd.get(c, np.inf), 12), len(taken[c]), _tie(rater_id, c)))


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (LeastCovered, RandomOrder, LearnRater, SettleItems)}
DEFAULT_POLICY = "least_covered"
PARAMETERS = {"least_covered": set(), "random": {"seed"}, "learn_rater": {"leniency_sd", "slope_sd", "anchors"},
              "settle_items": {"settled_sd", "leniency_sd"}}


def make_policy(name: str, raters_per_conversation: int, conversations_per_participant: int | None,
                turn_budget: int | None = None, floor: int = 1, **params) -> Policy:
    """The policy called `name` (a key of POLICIES) with the study's caps and its own parameters."""
    return POLICIES[name](raters_per_conversation, conversations_per_participant, turn_budget, floor, **params)


def conversation_state(policy: Policy, coverage: Mapping[str, int], ratings: Ratings | None) -> dict[str, dict]:
    """Per conversation: `k` (raters so far: slots held), `reason` and, where answers exist, `level_sd`
    (posterior sd of its level, scale points). Reasons: `capped` (at K max), `settled` (settle_items closed
    it), `below_floor` (fewer than the floor), `uncertain` (open: still taking raters)."""
    levels = item_levels(ratings or {}, getattr(policy, "leniency_sd", 0.5))
    closed = policy.settled(ratings, levels) if ratings is not None else set()
    out = {}
    for c, k in coverage.items():
        if k >= policy.raters_per_conversation:
            reason = "capped"
        elif k < policy.floor:
            reason = "below_floor"
        elif c in closed:
            reason = "settled"
        else:
            reason = "uncertain"
        var = levels.level_var.get(c)
        out[c] = {"k": int(k), "reason": reason, "level_sd": None if var is None else round(float(np.sqrt(var)), 3)}
    return out
