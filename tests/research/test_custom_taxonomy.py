"""A study's own taxonomy (3 controls, 7 levels) is one setting: --taxonomy or SENSE7_TAXONOMY."""

import json
import xml.etree.ElementTree as ET

from typer.testing import CliRunner

from sense7.cli import app
from sense7.settings import Settings
from sense7.synthetic.synth import generate, write
from sense7.taxonomy import load_taxonomy, render_rating_config, study_taxonomy
from tests.support.taxonomy import SEVEN_POINT_CONTROLS

runner = CliRunner()


def _study_files(taxonomy_path, out):
    tax = load_taxonomy(taxonomy_path)
    return write(generate(24, 6, seed=2, taxonomy=tax), out)


def test_setting_and_helper_pick_the_study_taxonomy(seven_point_taxonomy, tmp_path):
    settings = Settings.from_env({"SENSE7_HOME": str(tmp_path), "SENSE7_TAXONOMY": str(seven_point_taxonomy)})
    assert settings.taxonomy_path == seven_point_taxonomy.resolve()
    assert Settings.from_env({"SENSE7_HOME": str(tmp_path)}).taxonomy_path is None
    tax = study_taxonomy(settings)
    assert tax.controls == list(SEVEN_POINT_CONTROLS) and tax.levels == 7
    assert study_taxonomy(Settings.from_env({"SENSE7_HOME": str(tmp_path)})).levels == 5
    root = ET.fromstring(render_rating_config(tax).split("-->", 1)[1])
    assert {r.get("name"): r.get("maxRating") for r in root.iter("Rating")} == dict.fromkeys(SEVEN_POINT_CONTROLS, "7")


def test_evaluate_with_taxonomy_option_reports_exactly_its_controls_on_7_levels(seven_point_taxonomy, tmp_path):
    files = _study_files(seven_point_taxonomy, tmp_path / "study")
    json_path = tmp_path / "eval.json"
    args = ["evaluate", "--conversations", str(files["conversations.jsonl"]), "--ratings", str(files["ratings.csv"]),
            "--raters", str(files["raters.csv"]), "--splits", "known_rater", "--folds", "3", "--boot", "20",
            "--models", "majority,rater_mean", "--json", str(json_path)]
    # With the packaged taxonomy the study's files are refused, and the error says how to pass the right one.
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    assert f"{files['ratings.csv']}:" in refused.output and "--taxonomy" in " ".join(refused.output.split())
    result = runner.invoke(app, args + ["--taxonomy", str(seven_point_taxonomy)])
    assert result.exit_code == 0, result.output
    saved = json.loads(json_path.read_text())
    assert saved["controls"] == list(SEVEN_POINT_CONTROLS)
    assert saved["levels"] == [1, 2, 3, 4, 5, 6, 7]
    per_control = saved["splits"]["known_rater"]["models"]["rater_mean"]["per_control"]
    assert list(per_control) == list(SEVEN_POINT_CONTROLS)
    assert len(saved["splits"]["known_rater"]["confusion"]["majority"]["overall"]) == 7


def test_analyze_reads_the_taxonomy_from_the_environment(seven_point_taxonomy, tmp_path):
    files = _study_files(seven_point_taxonomy, tmp_path / "study")
    json_path = tmp_path / "analysis.json"
    result = runner.invoke(app, ["analyze", "--ratings", str(files["ratings.csv"]), "--boot", "20",
                                 "--json", str(json_path)], env={"SENSE7_TAXONOMY": str(seven_point_taxonomy)})
    assert result.exit_code == 0, result.output
    assert list(json.loads(json_path.read_text())["variance_components"]) == list(SEVEN_POINT_CONTROLS)


def test_unknown_dimension_error_names_file_line_field_and_how_to_pass_a_taxonomy(seven_point_taxonomy, tmp_path):
    files = _study_files(seven_point_taxonomy, tmp_path / "study")
    lines = files["ratings.csv"].read_text().splitlines()
    lines[1] = ",".join(lines[1].split(",")[:3] + ["empathy", "3"])
    files["ratings.csv"].write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["analyze", "--ratings", str(files["ratings.csv"]),
                                 "--taxonomy", str(seven_point_taxonomy)])
    assert result.exit_code == 2
    flat = " ".join(result.output.split())
    assert (f"{files['ratings.csv']}:2: dimension: 'empathy' is not a control of the taxonomy study-taxonomy.yaml "
            "(acknowledgement, continuity, overall, expectation_met); pass the study's taxonomy with --taxonomy "
            "FILE or SENSE7_TAXONOMY") in flat
    missing = runner.invoke(app, ["analyze", "--ratings", str(files["ratings.csv"]),
                                  "--taxonomy", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "nope.yaml" in missing.output
