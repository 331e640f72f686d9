"""`sense7 jury` on a synthetic study with planted rater effects: the jury's panel means follow the planted
raters', lenient raters judge more kindly than strict ones, a planted difference between two assistants is
recovered with an interval that covers it, panel specs select what they say, and the command writes what
it promises (or nothing, on bad input)."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.data.conversations import Conversation, Message
from sense7.data.dataset import RatingData
from sense7.data.items import task_columns, trait_table
from sense7.labelstudio.protocol import rating_tasks
from sense7.model import PersonalizedRater
from sense7.model.bundle import train_bundle
from sense7.model.oracle import SynthOracle
from sense7.model.registry import ModelRegistry
from sense7.research.jury import (
    Composition,
    JuryResult,
    compare,
    compare_panels,
    jury_predict,
    parse_panel,
    select_panel,
)
from sense7.research.jury_report import render_jury_report
from sense7.store.database import Store
from sense7.synthetic.synth import CUE_WEIGHT, CUES, generate
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

N_RATERS = 20
runner = CliRunner()


@pytest.fixture(scope="module")
def study():
    """Every rater rated every conversation (so the truth holds every rater's latent mean of every turn); the
    model is trained on 40 conversations with 6 raters each and judges the 20 others."""
    synth = generate(60, N_RATERS, seed=11, raters_per_conversation=N_RATERS, taxonomy=TAXONOMY)
    data = synth.rating_data()
    ids = sorted({c.conversation_id for c in synth.conversations})
    raters = sorted(synth.raters["rater_id"])
    rng = np.random.default_rng(0)
    pairs = {(cid, r) for cid in ids[:40] for r in rng.choice(raters, 6, replace=False)}
    rated = [pair in pairs for pair in zip(data.ratings["conversation_id"], data.ratings["rater_id"])]
    train = RatingData({k: v for k, v in data.conversations.items() if k in pairs},
                       data.ratings[rated].reset_index(drop=True), data.raters)
    held = {}
    for conv in synth.conversations:  # one transcript per held-out conversation: its first rater's line
        if conv.conversation_id in ids[40:]:
            held.setdefault(conv.conversation_id, conv)
    return SimpleNamespace(synth=synth, bundle=train_bundle(train, "v1", TAXONOMY), held=list(held.values()),
                           raters=data.raters, members=raters, train=train)


@pytest.fixture(scope="module")
def jury(study):
    return jury_predict(study.bundle, study.held, study.members, study.raters, TAXONOMY)


def planted_expected(synth, jury: JuryResult, truth=None) -> np.ndarray:
    """(turns, members, controls): the true expected rating of each member for each turn (the oracle)."""
    n_members = len(jury.members)
    X = pd.DataFrame({"conversation_id": np.repeat(jury.conversation_ids, n_members),
                      "turn_index": np.repeat(jury.turn_indices, n_members),
                      "rater_id": np.tile(jury.members, len(jury.conversation_ids))})
    expected = SynthOracle(truth or synth.truth).predict_expected(X, jury.controls).to_numpy()
    assert np.isfinite(expected).all()
    return expected.reshape(len(jury.conversation_ids), n_members, len(jury.controls))


# ---------------------------------------------------------------------------------------------------
# The served model, vectorized over the panel

@pytest.mark.parametrize("own_weights", [False, True], ids=["default", "rater-ridge"])
@pytest.mark.slow
def test_predict_panel_equals_predict_on_the_replicated_items(study, own_weights):
    """own_weights: a model that gives each known rater content weights of their own (rater_ridge)."""
    bundle = train_bundle(study.train, "v2", TAXONOMY, personalized=PersonalizedRater(
        rater_ridge=3.0, rater_ridge_from="text")) if own_weights else study.bundle
    compiled = bundle.compile()
    newcomer = study.raters.iloc[[0]].set_axis(["new-profile-only"])  # traits, no ratings: the trait prior
    raters = pd.concat([study.raters, newcomer])
    table = compiled.rater_table(trait_table(raters, TAXONOMY))
    members = ["r003", "new-profile-only", "r017", "r001"]
    convs = study.held[:3]
    datas = [t["data"] for c in convs for t in rating_tasks(c)]
    contexts = {(c.conversation_id, c.rater_id): c.context for c in convs}
    # The items replicated per member, each read with its conversation's own context, as the jury reads them.
    replicated = [dict(d, rater_id=m) for d in datas for m in members]
    own = {c.conversation_id: c.context for c in convs}
    replicated_contexts = {(d["conversation_id"], m): own[d["conversation_id"]] for d in datas for m in members}
    reference = compiled.predict(task_columns(replicated, replicated_contexts, TAXONOMY), table)
    got = compiled.predict_panel(task_columns(datas, contexts, TAXONOMY), table, members)
    assert got.shape == (len(datas), len(members), len(compiled.controls), len(compiled.levels))
    np.testing.assert_allclose(got, reference.probs.reshape(got.shape), rtol=0, atol=1e-10)
    assert reference.kinds[:len(members)] == ["personalized", "traits", "personalized", "personalized"]
    with pytest.raises(ValueError, match="nobody-at-all"):
        compiled.predict_panel(task_columns(datas, contexts, TAXONOMY), table, ["r001", "nobody-at-all"])


def test_a_member_the_model_cannot_predict_is_an_error_listing_them(study):
    with pytest.raises(ValueError, match=r"2 panel member\(s\) .*ghost-1, ghost-2"):
        jury_predict(study.bundle, study.held[:2], ["r001", "ghost-1", "ghost-2"], study.raters, TAXONOMY)


# ---------------------------------------------------------------------------------------------------
# The jury against the planted truth

def test_jury_panel_mean_per_turn_follows_the_planted_panel(study, jury):
    predicted = jury.expected().mean(axis=1)  # (turns, controls)
    planted = planted_expected(study.synth, jury).mean(axis=1)
    for j, control in enumerate(jury.controls):
        r = np.corrcoef(predicted[:, j], planted[:, j])[0, 1]
        assert r >= 0.9, (control, r)
    summary = jury.summary()
    np.testing.assert_allclose(summary["mean"].to_numpy(), predicted.ravel())


def test_lenient_raters_judge_more_kindly_than_strict_ones(study):
    leniency = study.synth.truth.leniency.sort_values()
    quarter = N_RATERS // 4
    strict = jury_predict(study.bundle, study.held, list(leniency.index[:quarter]), study.raters, TAXONOMY)
    lenient = jury_predict(study.bundle, study.held, list(leniency.index[-quarter:]), study.raters, TAXONOMY)
    kinder = lenient.expected().mean(axis=1) > strict.expected().mean(axis=1)  # (turns, controls)
    assert kinder.mean() >= 0.9
    counterfactual = compare_panels(strict, lenient, n_boot=300)
    assert counterfactual.kind == "panels" and counterfactual.unmatched == (0, 0)
    assert (counterfactual.ci[:, 0] > 0).all(), counterfactual.frame()


def _with_validation(study):
    """Assistant B: A's transcripts with a validating sentence added to every turn that had no validation
    cue and whose unmet-expectation penalty the sentence cannot change (acknowledged, or a jarring tone),
    and the truth of B: those turns' validation latent raised exactly as the generator raises it."""
    phrase = CUES["validation"][1][0]
    cues = study.synth.truth.cues.set_index(["conversation_id", "turn_index"])
    eligible = set(cues.index[(cues["validation"] == 0)
                              & ((cues["acknowledgement"] == 1) | (cues["tone"] == -1))])
    transcripts = []
    for conv in study.held:
        messages = [Message(m.role, f"{m.content} {phrase}") if (conv.conversation_id, i) in eligible else m
                    for i, m in enumerate(conv.messages)]
        transcripts.append(Conversation(conv.conversation_id, conv.rater_id, messages, dict(conv.context)))
    truth = study.synth.truth
    latent = truth.latent.copy()
    contexts = {(c.conversation_id, c.rater_id): c.context for c in study.synth.conversations}
    hit = np.array([(c, t) in eligible for c, t in zip(latent["conversation_id"], latent["turn_index"].fillna(-1))])
    wanted = np.array([contexts[pair]["empathy_wanted"] for pair in zip(latent["conversation_id"], latent["rater_id"])])
    sensitivity = truth.sensitivity.loc[latent["rater_id"], "validation"].to_numpy()
    latent.loc[hit, "validation"] += (sensitivity * CUE_WEIGHT * (1 + 0.15 * (wanted - 3)))[hit]
    return transcripts, dataclasses.replace(truth, latent=latent), len(eligible)


def test_compare_recovers_a_planted_difference_between_two_assistants(study, jury):
    transcripts, truth_b, n_edited = _with_validation(study)
    assert n_edited >= 20
    b = jury_predict(study.bundle, transcripts, list(reversed(study.members)), study.raters, TAXONOMY)
    result = compare(jury, b, n_boot=1000, seed=0)
    planted = (planted_expected(study.synth, jury, truth_b) - planted_expected(study.synth, jury)).mean(axis=(0, 1))
    j = jury.controls.index("validation")
    assert planted[j] > 0.05 and np.allclose(np.delete(planted, j), 0)
    low, high = result.ci[j]
    assert 0 < low <= planted[j] <= high, (result.frame(), planted[j])
    assert result.kind == "assistants" and result.n_turns == len(jury.conversation_ids)
    assert result.unmatched == (0, 0) and result.n_conversations == len(study.held)
    # The same transcripts: no difference at all.
    same = compare(jury, jury, n_boot=50)
    np.testing.assert_allclose(same.difference, 0, atol=1e-12)


def test_compare_matches_turns_by_position_and_counts_the_unmatched(study):
    a = jury_predict(study.bundle, study.held[:4], study.members[:5], study.raters, TAXONOMY)
    shorter = copy.deepcopy(study.held[1:5])
    last = shorter[0].assistant_turns()[-1]
    shorter[0].messages = shorter[0].messages[:last]  # one assistant turn fewer at the end of the 2nd conversation
    b = jury_predict(study.bundle, shorter, study.members[:5], study.raters, TAXONOMY)
    result = compare(a, b, n_boot=20)
    turns = [len(c.assistant_turns()) for c in study.held[:5]]
    assert result.unmatched == (turns[0] + 1, turns[4])  # a: the 1st conversation and that turn; b: the 5th
    assert result.n_turns == turns[1] - 1 + turns[2] + turns[3] and result.n_conversations == 3
    with pytest.raises(ValueError, match="same panel"):
        compare(a, jury_predict(study.bundle, study.held[:4], study.members[:3], study.raters, TAXONOMY))


# ---------------------------------------------------------------------------------------------------
# Summaries, seats and the report

def test_summary_dissent_and_the_long_frame_on_a_hand_made_jury():
    probs = np.zeros((1, 3, 1, 3))
    probs[0, 0, 0] = [0.7, 0.2, 0.1]  # most likely 1
    probs[0, 1, 0] = [0.6, 0.3, 0.1]  # most likely 1
    probs[0, 2, 0] = [0.1, 0.2, 0.7]  # most likely 3: the one dissenter
    jury = JuryResult(np.array(["c1"], dtype=object), np.array([1]), np.array([0]), ["r1", "r2", "r3"],
                      ["personalized"] * 3, ["overall"], np.array([1, 2, 3]), probs)
    row = jury.summary().iloc[0]
    assert row["dissent"] == pytest.approx(1 / 3)
    assert row["mean"] == pytest.approx(np.mean([1.4, 1.5, 2.6]))
    assert row[["p_1", "p_2", "p_3"]].tolist() == pytest.approx([1.4 / 3, 0.7 / 3, 0.9 / 3])
    frame = jury.frame()
    assert list(frame.columns) == ["conversation_id", "turn_index", "rater_id", "control", "p_1", "p_2", "p_3",
                                   "expected"]
    assert frame["rater_id"].tolist() == ["r1", "r2", "r3"]


def test_seats_restrict_who_judges_which_conversation(study):
    convs = study.held[:3]
    seats = {convs[0].conversation_id: {"r001", "r002"}, convs[1].conversation_id: {"r002", "r099"}}
    jury = jury_predict(study.bundle, convs, ["r001", "r002", "r003"], study.raters, TAXONOMY, seats=seats)
    assert jury.members == ["r001", "r002"]  # r003 judges nothing
    assert set(jury.conversation_ids) == {convs[0].conversation_id, convs[1].conversation_id}
    frame = jury.frame()
    second = frame[frame["conversation_id"] == convs[1].conversation_id]
    assert set(second["rater_id"]) == {"r002"}
    summary = jury.summary()
    alone = summary[summary["conversation_id"] == convs[1].conversation_id]
    assert (alone["dissent"] == 0).all()
    np.testing.assert_allclose(alone["mean"].to_numpy(), second["expected"].to_numpy())


def test_report_describes_the_panel_and_draws_the_comparison(study, jury):
    lenient = jury_predict(study.bundle, study.held, study.members[:6], study.raters, TAXONOMY)
    html = render_jury_report([jury, lenient], ["all", "raters:..."], compare_panels(jury, lenient, n_boot=50),
                              study.raters, "v1", ["a <all>", "b"])
    images = html.count('src="data:image/png;base64,')
    assert images == 4  # two distributions, the turns, the differences
    assert "a &lt;all&gt;" in html and "ai_trust" in html and "Panel b vs panel a" in html
    assert "http://" not in html and "https://" not in html


# ---------------------------------------------------------------------------------------------------
# Panel specs

@pytest.fixture
def roster():
    raters = pd.DataFrame({
        "email": ["a@x.org", None, None, None, None, None],
        "age_band": ["18-24", "25-34", "35-44", "45-54", "18-24", None],
        "gender": ["woman", "man", "woman", "non_binary", "woman", None],
        "ai_trust": [5, 4, 3, 1, np.nan, np.nan],
    }, index=pd.Index(["p1", "p2", "p3", "p4", "p5", "ghost"], name="rater_id"))
    return raters, ["k1", "p2"]  # k1: rated in training, no profile


def test_panel_specs_select_what_they_say(roster):
    raters, known = roster
    assert select_panel("all", raters, known, TAXONOMY) == ["k1", "p1", "p2", "p3", "p4", "p5"]  # ghost answered nothing
    assert select_panel("raters: p3, k1,p3", raters, known, TAXONOMY) == ["p3", "k1"]
    assert select_panel("ai_trust >= 4", raters, known, TAXONOMY) == ["p1", "p2"]
    assert select_panel("ai_trust < 4", raters, known, TAXONOMY) == ["p3", "p4"]  # unanswered never matches
    assert select_panel("ai_trust in [1, 5]", raters, known, TAXONOMY) == ["p1", "p4"]
    assert select_panel("gender == woman", raters, known, TAXONOMY) == ["p1", "p3", "p5"]
    assert select_panel("gender != 'woman'", raters, known, TAXONOMY) == ["p2", "p4"]
    assert select_panel("age_band in [18-24, 25-34]", raters, known, TAXONOMY) == ["p1", "p2", "p5"]
    assert select_panel("age_band not in [18-24]", raters, known, TAXONOMY) == ["p2", "p3", "p4"]
    assert select_panel("age_band >= 35-44", raters, known, TAXONOMY) == ["p3", "p4"]  # the taxonomy's order
    assert select_panel("gender == woman and ai_trust >= 3", raters, known, TAXONOMY) == ["p1", "p3"]


def test_panel_spec_errors_name_the_problem(roster):
    raters, known = roster
    cases = {
        "raters:p1,zed,yon": "unknown rater.*zed, yon",
        "mood >= 3": "unknown trait 'mood'.*age_band, gender, ai_trust",
        "gender > woman": "gender is not numeric or ordinal",
        "ai_trust >= high": "ai_trust is numeric: 'high' is not a number",
        "age_band in 18-24": "a list in brackets",
        "ai_trust ~ 4": "cannot read 'ai_trust ~ 4'",
        "": "empty panel spec",
        "gender == robot": "no rater matches",
        "50% gender == woman; 40% gender == man; n=5": "shares sum to 90%",
        "50% gender == woman; 50% gender == man": "n=20",
        "50% gender == woman; 50% gender == man; n=4": r"50% gender == man: needs 2 of n=4 raters, but only 1 match",
        "50% gender == woman; 50% gender == woman; n=4": r"needs 2 of n=4 raters, but only 3 match \(2 of them already",
    }
    for spec, message in cases.items():
        with pytest.raises(ValueError, match=message):
            select_panel(spec, raters, known, TAXONOMY)


def test_a_composition_draws_its_shares_reproducibly(roster):
    raters, known = roster
    spec = "50% gender == woman; 50% ai_trust <= 4; n=4; seed=1"
    parsed = parse_panel(spec)
    assert isinstance(parsed, Composition) and parsed.counts() == [2, 2] and str(parsed) == spec
    panel = select_panel(spec, raters, known, TAXONOMY)
    assert panel == select_panel(spec, raters, known, TAXONOMY) and len(set(panel)) == 4
    assert set(panel[:2]) <= {"p1", "p3", "p5"} and set(panel[2:]) <= {"p2", "p3", "p4"}
    draws = {tuple(select_panel(spec.replace("seed=1", f"seed={s}"), raters, known, TAXONOMY)) for s in range(8)}
    assert len(draws) > 1
    assert Composition(((33.4, None), (33.3, None), (33.3, None)), n=10).counts() == [4, 3, 3]


# ---------------------------------------------------------------------------------------------------
# The command

@pytest.fixture
def home(tmp_path, monkeypatch, study):
    """SENSE7_HOME with the model promoted and the raters' profiles in the store."""
    home = tmp_path / "home"
    monkeypatch.setenv("SENSE7_HOME", str(home))
    monkeypatch.setenv("SENSE7_MODEL_DIR", str(home / "models"))
    monkeypatch.setenv("SENSE7_STORE_URL", f"sqlite:///{tmp_path / 'store.sqlite'}")
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    registry = ModelRegistry(home / "models", store)
    registry.add(study.bundle, "v1")
    registry.promote("v1")
    profiles = study.synth.raters.drop(columns=["email"]).set_index("rater_id")
    store.upsert_raters(
        {"rater_id": rid, "traits": {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}}
        for rid, row in profiles.iterrows())
    return home


def _write(conversations, path):
    path.write_text("".join(json.dumps(c.to_json()) + "\n" for c in conversations))
    return path


def test_jury_command_writes_predictions_summary_and_report(home, tmp_path, study):
    convs = _write(study.held[:4], tmp_path / "new.jsonl")
    out, summary, report = tmp_path / "out" / "jury.csv", tmp_path / "summary.csv", tmp_path / "jury.html"
    result = runner.invoke(app, ["jury", "--conversations", str(convs), "--panel", "ai_trust >= 3", "--out", str(out),
                                 "--summary", str(summary), "--report", str(report)])
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out)
    levels = [f"p_{k}" for k in study.bundle.levels]
    assert list(frame.columns) == ["conversation_id", "turn_index", "rater_id", "control", *levels, "expected"]
    np.testing.assert_allclose(frame[levels].sum(axis=1), 1, atol=1e-5)
    panel = sorted(study.synth.raters.loc[study.synth.raters["ai_trust"] >= 3, "rater_id"])
    n_turns = sum(len(c.assistant_turns()) for c in study.held[:4])
    assert sorted(frame["rater_id"].unique()) == panel
    assert len(frame) == n_turns * len(panel) * len(study.bundle.controls)
    assert list(pd.read_csv(summary).columns) == ["conversation_id", "turn_index", "control", "mean", *levels,
                                                  "dissent"]
    assert report.read_text().count("data:image/png;base64,") == 2
    assert "panel mean" in result.output and "overall" in result.output


def test_jury_command_compares_two_assistants(home, tmp_path, study):
    transcripts, _, _ = _with_validation(study)
    a, b = _write(study.held[:6], tmp_path / "a.jsonl"), _write(transcripts[:6], tmp_path / "b.jsonl")
    out = tmp_path / "jury.csv"
    result = runner.invoke(app, ["jury", "--conversations", str(a), "--compare-with", str(b), "--panel", "all",
                                 "--out", str(out), "--boot", "200", "--report", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "b - a" in result.output and "validation" in result.output
    with open(out) as fh:
        assert next(csv.reader(fh))[:2] == ["jury", "conversation_id"]
    assert set(pd.read_csv(out)["jury"]) == {"a", "b"}


def test_jury_command_refuses_bad_input_and_writes_nothing(home, tmp_path, study):
    good = _write(study.held[:2], tmp_path / "new.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '{"conversation_id": "x", "rater_id": "r1", "messages": "oops"}\n')
    out = tmp_path / "jury.csv"
    result = runner.invoke(app, ["jury", "--conversations", str(bad), "--panel", "all", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"{bad}:3: messages" in result.output and "Traceback" not in result.output
    assert not out.exists()
    result = runner.invoke(app, ["jury", "--conversations", str(good), "--panel", "mood > 2", "--out", str(out)])
    assert result.exit_code == 2 and "unknown trait 'mood'" in result.output
    assert not out.exists()


def test_jury_command_without_a_served_model_says_to_retrain(tmp_path, monkeypatch, study):
    monkeypatch.setenv("SENSE7_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("SENSE7_MODEL_DIR", raising=False)
    monkeypatch.delenv("SENSE7_STORE_URL", raising=False)
    convs = _write(study.held[:1], tmp_path / "new.jsonl")
    out = tmp_path / "jury.csv"
    result = runner.invoke(app, ["jury", "--conversations", str(convs), "--panel", "all", "--out", str(out)])
    assert result.exit_code == 1 and "sense7 retrain" in result.output
    assert not out.exists()


def test_jury_command_with_assignments_seats_only_the_assigned(home, tmp_path, study):
    convs = study.held[:3]
    path = _write(convs, tmp_path / "new.jsonl")
    assignments = tmp_path / "assignments.csv"
    assignments.write_text(f"conversation_id,rater_id\n{convs[0].conversation_id},r005\n"
                           f"{convs[1].conversation_id},r006\n")
    out = tmp_path / "jury.csv"
    result = runner.invoke(app, ["jury", "--conversations", str(path), "--assignments", str(assignments),
                                 "--panel", "raters:r005,r006", "--out", str(out)])
    assert result.exit_code == 0, result.output
    seats = {(c.conversation_id, c.rater_id) for c in convs} | {(convs[0].conversation_id, "r005"),
                                                                (convs[1].conversation_id, "r006")}
    judged = set(zip(*pd.read_csv(out)[["conversation_id", "rater_id"]].T.to_numpy()))
    assert {(convs[0].conversation_id, "r005"), (convs[1].conversation_id, "r006")} <= judged <= seats
    assignments.write_text("conversation_id,rater_id\nnot-a-conversation,r005\n")
    out.unlink()
    result = runner.invoke(app, ["jury", "--conversations", str(path), "--assignments", str(assignments),
                                 "--panel", "all", "--out", str(out)])
    assert result.exit_code == 2 and f"{assignments}:2: conversation_id" in result.output
    assert not out.exists()
