"""Model kinds are registered in one place (sense7.model.catalog): a new kind flows through evaluate, the
HTML report and the CLI without any other edit."""

import json

import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.model.baselines import RaterMean
from sense7.model.catalog import CATALOG, Catalog, ModelKind, UnknownModelError
from sense7.research.evaluation import default_models, evaluate_items
from sense7.research.report import render_report
from sense7.synthetic.synth import generate, write

from tests.support.research import planted_items
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it

runner = CliRunner()
BUILTIN = ("majority", "global_mean", "rater_mean", "rater_median", "generic", "personalized")


def raw_rater_mean():
    return RaterMean(pseudo_count=0.0)


EXTRA = ModelKind("raw_rater_mean", raw_rater_mean, label="Raw rater mean (no shrinkage)", color="#2a9d8f",
                  role="rater", description="the rater's training mean, unshrunk")


def test_the_builtin_kinds_in_report_order():
    assert CATALOG.names() == BUILTIN
    assert [k.role for k in CATALOG] == ["baseline"] * 4 + ["rater"] * 2
    assert list(default_models(["personalized", "majority"])) == ["majority", "personalized"]  # catalog order
    from sense7.research.evaluation import MODEL_ORDER  # the old constant still reads the catalog

    assert tuple(MODEL_ORDER) == BUILTIN


def test_unknown_names_are_a_clear_error_listing_the_catalog():
    with pytest.raises(UnknownModelError, match="unknown model.s. nope, other; choose from majority, global_mean, "
                                                "rater_mean, rater_median, generic, personalized$"):
        default_models(["majority", "nope", "other"])
    with pytest.raises(ValueError, match="no model chosen"):  # UnknownModelError is a ValueError
        default_models([])
    with CATALOG.registered(EXTRA):
        with pytest.raises(ValueError, match="choose from .*personalized, raw_rater_mean"):
            default_models(["nope"])


def test_kinds_are_validated_and_not_registered_twice():
    with pytest.raises(ValueError, match="lower case"):
        ModelKind("My,Model", raw_rater_mean)
    with pytest.raises(ValueError, match="role"):
        ModelKind("x", raw_rater_mean, role="oracle")
    with pytest.raises(ValueError, match="already registered"):
        CATALOG.register(ModelKind("generic", raw_rater_mean))
    assert ModelKind("x", raw_rater_mean).label == "x"


def test_a_custom_catalog_flows_through_evaluate_and_the_report():
    catalog = Catalog([CATALOG.get("global_mean"), EXTRA])
    X, Y = planted_items(n_raters=12, controls=("overall", "tone"))
    result = evaluate_items(X, Y, default_models(catalog=catalog), n_boot=20, dataset="toy")
    for split in result["splits"].values():
        assert list(split["models"]) == ["global_mean", "raw_rater_mean"]
    json.dumps(result)
    html = render_report(result, catalog)
    assert "Raw rater mean (no shrinkage)" in html and "Global mean" in html
    # role "rater": the report draws its confusion matrices (baselines get none)
    assert "<h3>Confusion matrices" in html
    assert CATALOG.names() == BUILTIN  # the shared catalog is untouched


@pytest.fixture(scope="module")
def synth_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    write(generate(16, 6, seed=5, taxonomy=TAXONOMY), out)
    return out


def test_a_registered_kind_flows_through_the_cli(synth_files, tmp_path):
    with CATALOG.registered(EXTRA):
        assert "raw_rater_mean" in default_models()
        listing = runner.invoke(app, ["evaluate", "--list-models"])
        assert listing.exit_code == 0, listing.output
        assert [line.split()[0] for line in listing.output.splitlines()] == [*BUILTIN, "raw_rater_mean"]
        assert "Raw rater mean (no shrinkage)" in listing.output

        report = tmp_path / "report.html"
        result = runner.invoke(app, ["evaluate", "--conversations", str(synth_files / "conversations.jsonl"),
                                     "--ratings", str(synth_files / "ratings.csv"), "--splits", "known_rater",
                                     "--folds", "2", "--boot", "10", "--models", "rater_mean,raw_rater_mean",
                                     "--report", str(report)])
        assert result.exit_code == 0, result.output
        assert "raw_rater_mean" in result.output
        assert "Raw rater mean (no shrinkage)" in report.read_text()

        bad = runner.invoke(app, ["evaluate", "--models", "nope"])
        assert bad.exit_code == 2
        assert "unknown model(s) nope; choose from majority" in bad.output and "raw_rater_mean" in bad.output
        assert "Traceback" not in bad.output
    assert "raw_rater_mean" not in CATALOG
    assert "raw_rater_mean" not in runner.invoke(app, ["evaluate", "--list-models"]).output
