"""The assignment policy (pure) and its store-backed owner: K, N, no repeats, balance within 1, expired
leases given back and reused, and two entries racing for the last slot."""

from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta, timezone

import pytest

from sense7.crowd.assignment import AssignmentPolicy, Assignments
from sense7.crowd.lifecycle import assignments_of, expire_leases, install_study, start_rating
from sense7.crowd.participants import Participants, Studies
from sense7.store.database import Store
from sense7.taxonomy import load_taxonomy
from tests.support.crowd import write_study

TAX = load_taxonomy()


def _simulate(policy: AssignmentPolicy, participants: int, pool: int = 0,
              turns: dict[str, int] | None = None) -> dict[str, set[int]]:
    """Participants arrive one by one and take what the policy gives them (N conversations from a pool of
    `pool`, or whole conversations within the turn budget when `turns` gives each conversation's length);
    the invariants hold after every arrival."""
    taken = {c: set() for c in turns} if turns else {f"c{i}": set() for i in range(pool)}
    for p in range(participants):
        chosen = policy.choose(taken, f"r{p}", turns=turns) if turns else policy.choose(taken, f"r{p}")
        names = [c for c, _ in chosen]
        assert len(set(names)) == len(names)  # never the same conversation twice
        if turns:
            if any(len(s) < policy.raters_per_conversation for s in taken.values()):
                assert chosen  # while slots remain, everyone gets at least one conversation
            assert sum(turns[c] for c in names) <= policy.turn_budget  # whole conversations within the budget
        for c, slot in chosen:
            assert slot not in taken[c]
            taken[c].add(slot)
        held = [len(s) for s in taken.values()]
        assert max(held) <= policy.raters_per_conversation  # never beyond K
        assert max(held) - min(held) <= 1  # balanced within 1 while slots remain
    return taken


@pytest.mark.parametrize("k,n,pool", [(3, 3, 10), (2, 4, 7), (1, 1, 5), (5, 2, 3)])
def test_policy_gives_n_least_covered_conversations_never_beyond_k(k, n, pool):
    policy = AssignmentPolicy(k, n)
    taken = _simulate(policy, participants=(k * pool) // n, pool=pool)
    # Once the pool is full, nobody gets anything.
    for _ in range(3):
        chosen = policy.choose(taken, "late")
        for c, slot in chosen:
            taken[c].add(slot)
    assert all(len(s) == k for s in taken.values())
    assert policy.choose(taken, "one-more") == []


def test_policy_excludes_what_the_participant_had_and_fills_holes_first():
    policy = AssignmentPolicy(3, 2)
    taken = {"a": {0, 2}, "b": {0}, "c": {0, 1, 2}, "d": set()}
    assert policy.choose(taken, "x") == [("d", 0), ("b", 1)] or policy.choose(taken, "x") == [("d", 0), ("b", 1)]
    assert [c for c, _ in policy.choose(taken, "x", exclude={"d"})] == ["b", "a"]
    assert ("a", 1) in policy.choose({"a": {0, 2}}, "y")  # the freed slot number is reused


@pytest.fixture
def study_store(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    study, n = install_study(store, write_study(tmp_path / "s", pool=6, k=2, n=2, cap=100), TAX)
    assert n == 6
    return store, study


def _seat(store, study, rater: str):
    Participants(store, study).agree(rater, {"platform_id": f"PID{rater}", "platform_study": None,
                                             "platform_session": None})
    return start_rating(store, study, rater)


def test_store_assignments_k_n_and_one_assignment_per_participant(study_store):
    store, study = study_store
    got = {f"r{i}": _seat(store, study, f"r{i}") for i in range(6)}
    assert all(len(v) == 2 for v in got.values())
    coverage = assignments_of(store, study).coverage()
    assert coverage["in_lease"] == 12 and coverage["spread"] == 0
    assert _seat(store, study, "r99") is None  # pool full: 6 conversations x K=2
    assert Participants(store, study).get("r99").state == "full"
    # Asking again returns the same conversations, nothing more.
    assert assignments_of(store, study).assign("r0") == got["r0"]
    assert assignments_of(store, study).coverage()["in_lease"] == 12


def test_expired_leases_give_back_unrated_conversations_to_later_participants(study_store):
    store, study = study_store
    first = _seat(store, study, "gone")
    for i in range(5):
        _seat(store, study, f"r{i}")
    assert _seat(store, study, "late") is None  # full
    later = datetime.now(timezone.utc) + timedelta(minutes=study.lease_minutes + 1)
    expired = expire_leases(store, later)
    assert (expired.participants, expired.released) == (6, 12)  # nothing rated: every slot given back
    assert Participants(store, study).get("gone").state == "abandoned"
    assert assignments_of(store, study).coverage()["released"] == 12
    again = _seat(store, study, "new")
    assert again and set(again) <= {f"pool{i:03d}" for i in range(6)}
    assert first  # the abandoned participant's conversations were among those reusable


def test_two_entries_racing_for_the_last_slot_never_both_get_it(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    study, _ = install_study(store, write_study(tmp_path / "s", pool=1, k=1, n=1, cap=100), TAX)
    owner = Assignments(store, study.study_id, AssignmentPolicy(1, 1))
    results, barrier = {}, threading.Barrier(8)

    def enter(name):
        barrier.wait()
        results[name] = owner.assign(name)

    threads = [threading.Thread(target=enter, args=(f"t{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, got in results.items() if got]
    assert len(winners) == 1 and results[winners[0]] == ["pool000"]
    assert owner.coverage()["in_lease"] == 1


def test_random_interleavings_keep_k_and_balance(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    study, _ = install_study(store, write_study(tmp_path / "s", pool=9, k=3, n=3, cap=1000), TAX)
    owner = assignments_of(store, study)
    rng = random.Random(4)
    for i in range(9):
        owner.assign(f"r{i}")
        held = [len(s) for s in owner.taken().values()]
        assert max(held) - min(held) <= 1 and max(held) <= 3
    assert owner.assign("extra") == []
    for i in rng.sample(range(9), 3):
        owner.release(f"r{i}")
    assert owner.coverage()["released"] == 9
    for i in range(3):
        assert len(owner.assign(f"n{i}")) == 3
    assert all(len(s) == 3 for s in owner.taken().values())


def test_entries_are_not_capped_and_the_seats_taken_at_the_check_are_atomic(tmp_path):
    """Consent holds nothing, so ten entries to a study with a cap of 3 all reach the check; the ten racing
    through it take seats 0, 1 and 2 once each (the store's unique (study, seat) is the compare-and-set),
    the other seven are turned away as full, holding nothing."""
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    study, _ = install_study(store, write_study(tmp_path / "s", pool=30, k=2, n=2, cap=3), TAX)
    participants, outcomes, barrier = Participants(store, study), {}, threading.Barrier(10)
    for i in range(10):
        participants.agree(f"x{i}", {"platform_id": f"P{i}", "platform_study": None, "platform_session": None})
    assert participants.counts()["checking"] == 10 and participants.seated() == 0

    def passes(i):
        barrier.wait()
        outcomes[f"x{i}"] = start_rating(store, study, f"x{i}")

    threads = [threading.Thread(target=passes, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    inside = sorted(r for r, got in outcomes.items() if got)
    assert len(inside) == 3 and participants.seated() == 3
    assert sorted(participants.get(r).seat for r in inside) == [0, 1, 2]
    assert participants.counts()["full"] == 7
    owner = assignments_of(store, study)
    assert all(owner.of(r) == [] and participants.get(r).seat is None for r in outcomes if r not in inside)
    assert Studies(store).get("pilot")[1] is False  # a new study starts closed


# -- a budget of turns instead of N conversations --------------------------------------------------------

@pytest.mark.parametrize("k,budget,seed", [(3, 8, 0), (2, 5, 1), (1, 6, 2), (5, 12, 3), (3, 6, 4)])
def test_a_turn_budget_takes_whole_least_covered_conversations_never_beyond_k(k, budget, seed):
    rng = random.Random(seed)
    turns = {f"c{i}": rng.randint(1, min(6, budget)) for i in range(12)}  # the budget holds the longest
    policy = AssignmentPolicy(k, None, turn_budget=budget)
    taken = _simulate(policy, participants=60, turns=turns)
    assert all(len(s) == k for s in taken.values())  # 60 participants fill the pool
    assert policy.choose(taken, "one-more", turns=turns) == []


def test_a_turn_budget_fills_up_with_what_fits_and_never_leapfrogs_a_less_covered_conversation():
    policy = AssignmentPolicy(3, None, turn_budget=6)
    turns = {"a": 4, "b": 4, "c": 2, "d": 1}
    # All equally covered: the first in order fits, then whatever fits what is left (never a split).
    chosen = [c for c, _ in policy.choose({c: set() for c in turns}, "x", turns=turns)]
    assert sum(turns[c] for c in chosen) <= 6 and len(chosen) >= 2
    # "a" and "d" least covered, together too long: whichever comes first is taken, the other passed over,
    # and then nothing more covered ("c" would fit the budget but would leapfrog the passed-over one).
    taken = {"a": set(), "b": {0}, "c": {0}, "d": set()}
    chosen = [c for c, _ in policy.choose(taken, "x", turns={**turns, "d": 3})]
    assert sorted(chosen) == ["d"] or sorted(chosen) == ["a"]  # d (3) + a (4) > 6: the other is passed over
    assert "b" not in chosen and "c" not in chosen  # never more covered than a passed-over conversation
    # An exact fit spends the budget.
    assert sorted(c for c, _ in policy.choose({"a": set(), "c": set()}, "x", turns={"a": 4, "c": 2})) == ["a", "c"]
    # N may cap the count as well.
    assert len(AssignmentPolicy(3, 1, turn_budget=6).choose({c: set() for c in turns}, "x", turns=turns)) == 1


def test_a_turn_budget_study_assigns_through_the_store_and_checks_the_longest_conversation(tmp_path):
    from sense7.readers.formats import FormatError

    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    study, _ = install_study(store, write_study(tmp_path / "s", pool=6, turns=2, k=2, budget=5), TAX)
    assert study.turns_per_participant == 5 and study.conversations_per_participant is None
    Studies(store).set_open(study.study_id, True)
    assignments = assignments_of(store, study)
    got = [assignments.assign(f"pilot-r{i}") for i in range(6)]
    assert all(len(g) == 2 for g in got)  # 2 + 2 turns fit in 5; a third (2) would not
    assert all(len(s) == 2 for s in assignments.taken().values())  # K=2 x 6 conversations = 12 slots, all taken
    assert assignments.assign("pilot-late") == []
    # A budget below the longest conversation is refused with the file and line; nothing is stored.
    with pytest.raises(FormatError) as error:
        install_study(store, write_study(tmp_path / "t", pool=3, turns=3, k=2, budget=2, study="short"), TAX)
    assert "turns_per_participant" in str(error.value) and "study.yaml:" in str(error.value)
    assert Studies(store).get("short") is None
    # Both N and a budget: refused.
    with pytest.raises(FormatError) as error:
        install_study(store, write_study(tmp_path / "u", pool=3, k=2, budget=4, study="both",
                                         extra="conversations_per_participant: 2\n"), TAX)
    assert "not both" in str(error.value)
