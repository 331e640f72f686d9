"""The HTML report, the `sense7 evaluate` / `sense7 analyze` commands and the WASSA loader."""

import json
import re

import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.model.baselines import GlobalMean, MajorityClass, RaterMean
from sense7.readers.wassa import load_wassa
from sense7.research.evaluation import evaluate_items
from sense7.research.report import PAPER_LABEL, render_report
from sense7.synthetic.synth import generate, write

from tests.support.research import planted_items
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

runner = CliRunner()


@pytest.fixture(scope="module")
def baseline_result():
    X, Y = planted_items(n_raters=20, controls=("overall", "tone"))
    models = {"majority": MajorityClass(), "global_mean": GlobalMean(), "rater_mean": RaterMean()}
    return evaluate_items(X, Y, models, n_boot=50, dataset="planted <toy>")


def test_report_is_self_contained_with_plots_and_the_labelled_reference(baseline_result):
    html = render_report(baseline_result)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched over the network
    assert "http://" not in html and "https://" not in html
    images = re.findall(r'<img [^>]*src="data:image/png;base64,[A-Za-z0-9+/=]+"', html)
    # per split: Spearman bars, accuracy bars, gain curve (no confusion: no generic/personalized here)
    assert len(images) >= 4
    assert PAPER_LABEL in html
    assert "planted &lt;toy&gt;" in html  # the data set name is escaped, not injected
    for text in ("Majority class", "Global mean", "Rater mean", str(baseline_result["n_ratings"])):
        assert text in html


def test_report_shows_confusion_matrices_for_generic_and_personalized(baseline_result):
    result = json.loads(json.dumps(baseline_result))
    for split in result["splits"].values():  # present the rater mean as both rater models
        split["models"]["generic"] = split["models"]["global_mean"]
        split["models"]["personalized"] = split["models"]["rater_mean"]
        split["confusion"]["generic"] = split["confusion"]["global_mean"]
        split["confusion"]["personalized"] = split["confusion"]["rater_mean"]
    html = render_report(result)
    assert html.count("<h3>Confusion matrices") == 2
    assert "<h3>Confusion matrices" not in render_report(baseline_result)


@pytest.fixture(scope="module")
def synth_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    write(generate(30, 8, seed=3, taxonomy=TAXONOMY), out)
    return out


@pytest.mark.slow
def test_evaluate_command_writes_json_and_report(synth_files, tmp_path):
    json_path, report = tmp_path / "eval.json", tmp_path / "report.html"
    result = runner.invoke(app, ["evaluate", "--conversations", str(synth_files / "conversations.jsonl"),
                                 "--ratings", str(synth_files / "ratings.csv"), "--raters", str(synth_files / "raters.csv"),
                                 "--splits", "known_rater", "--folds", "3", "--boot", "50",
                                 "--json", str(json_path), "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert "personalized" in result.output and "95% CI" in result.output
    saved = json.loads(json_path.read_text())
    assert list(saved["splits"]) == ["known_rater"] and saved["n_raters"] == 8
    assert PAPER_LABEL in report.read_text()


def test_bad_ratings_file_names_file_line_and_field_and_writes_nothing(synth_files, tmp_path):
    bad = tmp_path / "ratings.csv"
    lines = (synth_files / "ratings.csv").read_text().splitlines()
    row = lines[3].split(",")
    row[4] = "9"  # rating outside the scale
    lines[3] = ",".join(row)
    bad.write_text("\n".join(lines) + "\n")
    json_path = tmp_path / "eval.json"
    result = runner.invoke(app, ["evaluate", "--conversations", str(synth_files / "conversations.jsonl"),
                                 "--ratings", str(bad), "--json", str(json_path)])
    assert result.exit_code == 2
    assert f"{bad}:4" in result.output and "rating" in result.output
    assert not json_path.exists()


def test_input_options_are_checked(synth_files, tmp_path):
    result = runner.invoke(app, ["evaluate", "--ratings", str(synth_files / "ratings.csv")])
    assert result.exit_code == 2 and "--conversations" in result.output
    result = runner.invoke(app, ["evaluate", "--wassa2024", str(tmp_path), "--ratings", "x.csv"])
    assert result.exit_code == 2 and "give one of" in result.output
    result = runner.invoke(app, ["evaluate", "--wassa2024", str(tmp_path), "--splits", "random"])
    assert result.exit_code == 2 and "random" in result.output
    result = runner.invoke(app, ["evaluate", "--wassa2024", str(tmp_path)])
    assert result.exit_code == 2 and "trac1_CONVD_train.csv" in result.output


def test_analyze_command_prints_tables_and_writes_json(synth_files, tmp_path):
    json_path = tmp_path / "analysis.json"
    result = runner.invoke(app, ["analyze", "--ratings", str(synth_files / "ratings.csv"), "--boot", "50",
                                 "--json", str(json_path)])
    assert result.exit_code == 0, result.output
    assert "Variance shares" in result.output and "continuity failure" in result.output
    saved = json.loads(json_path.read_text())
    assert set(saved["after_events"]) == {"continuity_failure", "unmet_expectation"}
    assert "overall" in saved["variance_components"]


def _write_wassa(directory):
    """A miniature of the WASSA 2024 files, same columns and quirks (escaped quotes, ratings 8/9)."""
    (directory / "trac1_CONVD_train.csv").write_text(
        "id,conversation_id,article_id,person_id_1,this_persons_perceived_empathy_of_other_person\n"
        "1,1,35,p001,6\n2,1,35,p002,3\n3,2,35,p001,9\n4,2,35,p003,7\n5,3,35,p002,5\n")
    (directory / "trac2_CONVT_train.csv").write_text(
        "id,article_id,conversation_id,turn_id,speaker,text,person_id_1,person_id_2,Emotion,EmotionalPolarity,Empathy,SelfDisclosure\n"
        '0,35,1,0,Person 1,"hi, what did you \\"think\\"?",p001,p002,1,1,1,1\n'
        "1,35,1,1,Person 2,so sad,p001,p002,1,1,1,1\n"
        "2,35,1,2,Person 1,I agree,p001,p002,1,1,1,1\n"
        "3,35,2,0,Person 1,hello,p001,p003,1,1,1,1\n"
        "4,35,2,1,Person 2,terrible news,p001,p003,1,1,1,1\n")
    header = ("id,person_id,gender,education,race,age,income,iri_perspective_taking,iri_personal_distress,"
              "iri_fantasy,iri_empathatic_concern,personality_openess,personality_conscientiousness,"
              "personality_extraversion,personality_agreeableness,personality_stability\n")
    (directory / "trac4_PER_train.csv").write_text(
        header + "".join(f"{i},p00{i},{1 + i % 2},4,1,{30 + i},50000,3,2,3,4,5,5,4,5,5\n" for i in range(1, 4)))


def test_load_wassa_maps_the_raters_view(tmp_path):
    _write_wassa(tmp_path)
    data = load_wassa(tmp_path)
    r = data.ratings
    # dropped: the out-of-range 9, and conversation 3 (no turns)
    assert sorted(zip(r.conversation_id, r.rater_id, r.rating)) == [("1", "p001", 6), ("1", "p002", 3),
                                                                   ("2", "p003", 7)]
    assert r["turn_index"].isna().all() and set(r["dimension"]) == {"perceived_empathy"}
    view = data.conversations[("1", "p001")]
    assert [m.role for m in view.messages] == ["user", "assistant", "user"]  # the other person is rated
    assert view.messages[0].content == 'hi, what did you "think"?'
    assert [m.role for m in data.conversations[("1", "p002")].messages] == ["assistant", "user", "assistant"]
    assert set(data.raters.index) == {"p001", "p002", "p003"}
    assert data.raters.loc["p002", "gender_code"] == 1 and len(data.raters.columns) == 14


def test_load_wassa_names_a_missing_file(tmp_path):
    _write_wassa(tmp_path)
    (tmp_path / "trac2_CONVT_train.csv").unlink()
    with pytest.raises(ValueError, match="trac2_CONVT_train.csv: file not found"):
        load_wassa(tmp_path)


def test_bad_conversations_file_is_reported_with_its_line(synth_files, tmp_path):
    bad = tmp_path / "conversations.jsonl"
    lines = (synth_files / "conversations.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"role": "assistant"', '"role": "robot"', 1)
    bad.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["evaluate", "--conversations", str(bad), "--ratings",
                                 str(synth_files / "ratings.csv"), "--json", str(tmp_path / "out.json")])
    assert result.exit_code == 2
    assert f"{bad}:2" in result.output and "role" in result.output
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow  # evaluate over several fold assignments
def test_evaluate_repeats_prints_and_saves_the_gain_over_fold_assignments(synth_files, tmp_path):
    json_path, report = tmp_path / "eval.json", tmp_path / "report.html"
    result = runner.invoke(app, ["evaluate", "--conversations", str(synth_files / "conversations.jsonl"),
                                 "--ratings", str(synth_files / "ratings.csv"), "--raters", str(synth_files / "raters.csv"),
                                 "--splits", "known_rater", "--models", "generic,personalized", "--folds", "3",
                                 "--boot", "30", "--repeats", "3", "--seed", "2", "--json", str(json_path),
                                 "--report", str(report)])
    assert result.exit_code == 0, result.output
    repeated = json.loads(json_path.read_text())["splits"]["known_rater"]["perspectivist"][
        "personalization_gain_repeated"]
    assert repeated["repeats"] == 3 and repeated["seeds"] == [2, 3, 4] and len(repeated["per_assignment"]) == 3
    printed = " ".join(result.output.split())
    assert f"over 3 fold assignments (seeds 2-4): {repeated['mean']:+.3f}" in printed
    spearman = repeated["model_spearman"]["personalized"]
    assert len(spearman["per_assignment"]) == 3 and f"personalized {spearman['mean']:.3f}" in printed
    assert "within-rater Spearman over 3 fold assignments" in report.read_text()
    refused = runner.invoke(app, ["evaluate", "--conversations", str(synth_files / "conversations.jsonl"),
                                  "--ratings", str(synth_files / "ratings.csv"), "--repeats", "0"])
    assert refused.exit_code == 2 and "--repeats" in refused.output


def test_evaluate_command_runs_a_chosen_subset_of_models(synth_files, tmp_path):
    json_path = tmp_path / "eval.json"
    result = runner.invoke(app, ["evaluate", "--conversations", str(synth_files / "conversations.jsonl"),
                                 "--ratings", str(synth_files / "ratings.csv"), "--models", "majority,rater_mean",
                                 "--folds", "3", "--boot", "30", "--json", str(json_path)])
    assert result.exit_code == 0, result.output
    saved = json.loads(json_path.read_text())
    for split in saved["splits"].values():
        assert list(split["models"]) == ["majority", "rater_mean"] and split["paired"] == {}
    result = runner.invoke(app, ["evaluate", "--conversations", str(synth_files / "conversations.jsonl"),
                                 "--ratings", str(synth_files / "ratings.csv"), "--models", "oracle"])
    assert result.exit_code == 2 and "oracle" in result.output
