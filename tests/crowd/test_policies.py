"""Assignment policies (sense7.crowd.policies): every policy obeys the caps and the floor whatever the state
(property tests), learn_rater prefers the conversation whose answer teaches the most about the rater,
settle_items stops settled conversations and keeps uncertain ones open, random is seeded, and the study
file picks a policy (an unknown one is refused with file:line)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sense7.crowd.policies import POLICIES, conversation_state, item_levels, make_policy, ordinal_information
from sense7.crowd.replay import planted_disagreement, replay
from sense7.crowd.study import load_study
from sense7.readers.formats import FormatError
from tests.support.crowd import write_study

NAMES = sorted(POLICIES)


@st.composite
def pool_states(draw):
    """A pool mid-study: K max, a floor, slots held, the answers behind them and a participant's history."""
    k = draw(st.integers(1, 5))
    floor = draw(st.integers(0, k))
    n_conv = draw(st.integers(1, 12))
    raters = [f"r{i}" for i in range(draw(st.integers(1, 8)))]
    taken, ratings = {}, {}
    for c in range(n_conv):
        holders = draw(st.lists(st.sampled_from(raters), max_size=k, unique=True))
        taken[f"c{c}"] = set(range(len(holders)))
        ratings[f"c{c}"] = {r: float(draw(st.integers(1, 5))) for r in holders}
    me = draw(st.sampled_from(raters + ["new"]))
    exclude = {c for c, by in ratings.items() if me in by}
    allowed = draw(st.one_of(st.none(), st.sets(st.sampled_from(sorted(taken)))))
    n = draw(st.integers(1, 4))
    return k, floor, n, taken, ratings, me, exclude, allowed


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=pool_states())
def test_every_policy_obeys_the_cap_the_floor_and_the_participants_history(name, state):
    k, floor, n, taken, ratings, me, exclude, allowed = state
    policy = make_policy(name, k, n, None, floor)
    chosen = policy.choose(taken, me, exclude=exclude, ratings=ratings, allowed=allowed)
    names = [c for c, _ in chosen]
    assert len(names) <= n and len(set(names)) == len(names)
    for c, slot in chosen:
        assert c not in exclude and (allowed is None or c in allowed)
        assert len(taken[c]) < k and 0 <= slot < k and slot not in taken[c]  # never beyond K max
    could = [c for c in taken if c not in exclude and len(taken[c]) < k and (allowed is None or c in allowed)]
    anchors = policy.anchors if name == "learn_rater" else 0  # learn_rater's first picks are exempt from the floor
    free = [c for c in could if c not in names[:anchors]]
    below = [c for c in free if len(taken[c]) < floor]
    if below:  # the floor: nothing at or above it while the participant could take one below it
        after = names[anchors:]
        assert all(len(taken[c]) < floor for c in after[:len(below)])
        assert sum(len(taken[c]) < floor for c in after) == min(len(after), len(below))
    if name != "settle_items":  # only settle_items closes conversations: the others give while any is open
        assert len(names) == min(n, len(could))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=pool_states(), lengths=st.lists(st.integers(1, 6), min_size=12, max_size=12), budget=st.integers(6, 14))
def test_every_policy_keeps_whole_conversations_within_a_turn_budget(name, state, lengths, budget):
    k, floor, _, taken, ratings, me, exclude, allowed = state
    turns = {c: lengths[i] for i, c in enumerate(taken)}
    policy = make_policy(name, k, None, budget, floor)
    chosen = policy.choose(taken, me, exclude=exclude, turns=turns, ratings=ratings, allowed=allowed)
    names = [c for c, _ in chosen]
    assert sum(turns[c] for c in names) <= budget and len(set(names)) == len(names)
    assert all(c not in exclude and len(taken[c]) < k and (allowed is None or c in allowed) for c in names)
    could = [c for c in taken if c not in exclude and len(taken[c]) < k and (allowed is None or c in allowed)]
    if could and name != "settle_items":  # a budget of at least the longest conversation: someone gets one
        assert names


@pytest.mark.parametrize("name", NAMES)
def test_a_filled_pool_gives_nothing_and_every_conversation_reaches_the_floor(name):
    """Participants arrive until nobody gets anything: every conversation has at least the floor, none more
    than K max, whichever policy (settle_items may stop below K max, never below the floor)."""
    k, floor = 4, 2
    policy = make_policy(name, k, 2, None, floor)
    taken = {f"c{i}": set() for i in range(7)}
    ratings: dict = {c: {} for c in taken}
    for p in range(40):
        rater = f"p{p}"
        for c, slot in policy.choose(taken, rater, ratings=ratings):
            taken[c].add(slot)
            ratings[c][rater] = float(1 + (p * 7 + int(c[1:])) % 5 if c in ("c0", "c1") else 3)
    assert all(floor <= len(s) <= k for s in taken.values())
    assert policy.choose(taken, "late", ratings=ratings) == []
    if name != "settle_items":
        assert all(len(s) == k for s in taken.values())


def test_learn_rater_prefers_a_conversation_others_settled_at_an_extreme_level():
    """The rater rated one conversation. Left: one nobody rated (its level unknown: teaches nothing), one two
    raters put in the middle, one four raters agree is at the bottom of the scale. The last one says most
    about this rater's leniency and scale use, the unrated one least."""
    policy = make_policy("learn_rater", 6, 1, None, 0)
    ratings = {"seen": {"me": 4.0, "a": 3.0, "b": 3.0},
               "unrated": {},
               "middle": {"a": 3.0, "b": 3.0},
               "bottom": {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}}
    taken = {c: set(range(len(by))) for c, by in ratings.items()}
    gains = policy.gains(["unrated", "middle", "bottom"], "me", ratings)
    assert gains["bottom"] > gains["middle"] > gains["unrated"]
    assert policy.choose(taken, "me", exclude={"seen"}, ratings=ratings) == [("bottom", 4)]
    # least_covered picks the opposite: the one nobody rated
    assert make_policy("least_covered", 6, 1, None, 0).choose(taken, "me", exclude={"seen"}) == [("unrated", 0)]


def test_learn_rater_learns_less_from_a_conversation_raters_disagree_on():
    policy = make_policy("learn_rater", 9, 1, None, 0)
    ratings = {"agreed": {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0},
               "split": {"a": 1.0, "b": 5.0, "c": 1.0, "d": 5.0, "e": 1.0, "f": 5.0, "g": 1.0, "h": 5.0}}
    gains = policy.gains(["agreed", "split"], "me", ratings)
    assert gains["agreed"] > gains["split"]


def test_learn_rater_gives_a_conversation_rated_once_before_one_five_raters_agree_on():
    """Issue 41: counting only what an answer teaches about the rater, learn_rater fed the conversations it
    already knew (five raters agree) and left the ones rated once, which teach nobody until a second rater
    comes (on the planted disagreement data: worse than random). The answer to `once` also teaches about
    `f` (their only rating) and the conversation's level, so it comes first."""
    policy = make_policy("learn_rater", 6, 1, None, 0)
    ratings = {"seen": {"me": 4.0, "a": 3.0, "b": 3.0, "c": 2.0},
               "settled": {"a": 3.0, "b": 3.0, "c": 3.0, "d": 3.0, "e": 3.0},
               "once": {"f": 3.0}}
    taken = {c: set(range(len(by))) for c, by in ratings.items()}
    assert policy.choose(taken, "me", exclude={"seen"}, ratings=ratings) == [("once", 1)]
    alone = make_policy("learn_rater", 6, 1, None, 0, shared=False)  # the rater's own gain only
    assert alone.choose(taken, "me", exclude={"seen"}, ratings=ratings) == [("settled", 5)]


def test_a_rating_expected_beyond_the_end_of_the_scale_teaches_little():
    inside, top, beyond = (ordinal_information(m, 0.7, 1, 5) for m in (3.0, 5.0, 6.0))
    assert 0.8 < inside <= 1.0 and beyond < top < inside
    assert ordinal_information(3.0, 0.7, 1, 50) == pytest.approx(ordinal_information(3.0, 0.7, -50, 5), abs=0.01)


def test_settle_items_keeps_uncertain_conversations_open_and_settles_agreed_ones():
    policy = make_policy("settle_items", 8, 2, None, 2, settled_sd=0.4)
    ratings = {"agreed": {f"r{i}": 2.0 for i in range(5)},
               "split": {"r0": 1.0, "r1": 5.0, "r2": 1.0, "r3": 5.0, "r4": 2.0},
               "fresh": {"r0": 3.0}}
    taken = {c: set(range(len(by))) for c, by in ratings.items()}
    chosen = [c for c, _ in policy.choose(taken, "new", ratings=ratings)]
    assert chosen == ["fresh", "split"]  # below the floor first, then the uncertain one; the agreed one is settled
    state = conversation_state(policy, {c: len(s) for c, s in taken.items()}, ratings)
    assert state["agreed"]["reason"] == "settled" and state["split"]["reason"] == "uncertain"
    assert state["fresh"]["reason"] == "below_floor"
    assert state["split"]["level_sd"] > state["agreed"]["level_sd"]
    capped = conversation_state(policy, {"agreed": 8}, ratings)
    assert capped["agreed"]["reason"] == "capped"


def test_settle_items_is_ordinal_a_far_disagreement_is_less_settled_than_a_near_one():
    near = item_levels({"x": {"a": 2.0, "b": 3.0, "c": 2.0, "d": 3.0}})
    far = item_levels({"x": {"a": 1.0, "b": 5.0, "c": 1.0, "d": 5.0}})
    # the same number of distinct answers (two levels, two raters each): only their distance differs
    assert far.level_var["x"] > near.level_var["x"] * 1.5 or far.noise > near.noise * 4


def test_random_is_seeded_and_differs_between_seeds():
    taken = {f"c{i}": set() for i in range(30)}
    first = make_policy("random", 3, 5, None, 1, seed=1).choose(taken, "r")
    assert first == make_policy("random", 3, 5, None, 1, seed=1).choose(taken, "r")
    assert first != make_policy("random", 3, 5, None, 1, seed=2).choose(taken, "r")


def test_replay_only_hands_a_rater_what_they_rated_and_never_beyond_k():
    data = planted_disagreement(n_units=60, n_raters=8, seed=3)
    rated = set(zip(data.ratings["unit"], data.ratings["rater"]))
    for name in NAMES:
        run = replay(data, make_policy(name, 3, None, None, 1), seed=0, budget=150, checkpoints=[50, 150])
        assert all((u, r) in rated for u, r, _ in run.order)
        per_unit = {}
        for u, r, _ in run.order:
            per_unit.setdefault(u, set()).add(r)
        assert max(len(s) for s in per_unit.values()) <= 3
        assert len(run.order) == len(set((u, r) for u, r, _ in run.order))  # never the same pair twice
        assert [p["ratings"] for p in run.checkpoints] == [50, 150]


def _study(tmp_path, assignment: str) -> object:
    path = write_study(tmp_path / "s", pool=4, k=2, n=2, cap=10)
    path.write_text(path.read_text() + assignment)
    return path


def test_the_study_file_picks_a_policy_with_its_floor_and_parameters(tmp_path):
    path = _study(tmp_path, "assignment:\n  policy: settle_items\n  floor: 1\n  settled_sd: 0.3\n")
    study = load_study(path)
    assert study.assignment == {"policy": "settle_items", "floor": 1, "settled_sd": 0.3}
    policy = study.policy()
    assert policy.name == "settle_items" and policy.floor == 1 and policy.settled_sd == 0.3
    assert policy.raters_per_conversation == 2 and policy.conversations_per_participant == 2
    assert load_study(_study(tmp_path / "b", "assignment: learn_rater\n")).policy().name == "learn_rater"
    assert load_study(write_study(tmp_path / "c", pool=4, k=2, n=2, cap=10)).policy().name == "least_covered"


@pytest.mark.parametrize("text,field,reason", [
    ("assignment: smartest\n", "assignment", "unknown policy 'smartest'"),
    ("assignment:\n  policy: nope\n", "assignment.policy", "unknown policy 'nope'"),
    ("assignment:\n  policy: random\n  floor: 3\n", "assignment.floor", "from 0 to raters_per_conversation (2)"),
    ("assignment:\n  policy: random\n  settled_sd: 0.3\n", "assignment.settled_sd", "unknown setting of random"),
    ("assignment:\n  policy: settle_items\n  settled_sd: -1\n", "assignment.settled_sd", "positive number"),
    ("assignment: [1, 2]\n", "assignment", "must be a policy name"),
    ("assignment:\n  policy: learn_rater\n  anchors: -1\n", "assignment.anchors", "whole number from 0"),
])
def test_the_study_file_refuses_a_bad_assignment_with_file_and_line(tmp_path, text, field, reason):
    path = _study(tmp_path, text)
    lines = path.read_text().splitlines()
    with pytest.raises(FormatError) as caught:
        load_study(path)
    problem = next(p for p in caught.value.problems if p.field == field)
    assert reason in problem.reason and problem.path == str(path)
    key = field.split(".")[-1]
    assert lines[problem.line - 1].lstrip().startswith(f"{key}:")
