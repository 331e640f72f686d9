import xml.etree.ElementTree as ET

import pytest

from sense7.taxonomy import (
    HISTORY_TAG,
    TURN_TAG,
    TaxonomyError,
    load_taxonomy,
    render_all,
    render_profile_config,
    render_rating_config,
)
from sense7.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


def test_committed_configs_are_rendered_from_the_current_taxonomy():
    for path, text in render_all(TAXONOMY).items():
        assert path.exists(), f"{path} is missing: run `sense7 config render`"
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run `sense7 config render`"


def test_default_taxonomy_has_seven_dimensions_and_overall():
    tax = load_taxonomy()
    assert len(tax.dimensions) == 7
    assert tax.controls[-1] == "overall" and len(tax.controls) == 8
    assert tax.levels == 5
    assert tax.expectation_values == ["no", "partly", "yes"]


def test_rating_config_has_a_required_rating_and_visible_definition_per_dimension():
    tax = load_taxonomy()
    root = ET.fromstring(render_rating_config(tax).split("-->", 1)[1])
    ratings = {r.get("name"): r for r in root.iter("Rating")}
    assert list(ratings) == tax.controls
    for dim in tax.dimensions:
        assert ratings[dim.key].get("toName") == TURN_TAG
        assert ratings[dim.key].get("required") == "true"
        assert ratings[dim.key].get("maxRating") == "5"
        headers = [h.get("value") for h in root.iter("Header")]
        assert any(dim.definition in h for h in headers), dim.key
    names = {p.get("name") for p in root.iter("Paragraphs")}
    assert names == {HISTORY_TAG, TURN_TAG}
    choices = [c.get("value") for c in root.find("Choices").iter("Choice")]
    assert choices == ["no", "partly", "yes"]
    assert root.find("TextArea").get("required") == "false"


def test_profile_config_asks_every_profile_field_with_its_allowed_values():
    tax = load_taxonomy()
    root = ET.fromstring(render_profile_config(tax).split("-->", 1)[1])
    by_name = {c.get("name"): [x.get("value") for x in c.iter("Choice")] for c in root.iter("Choices")}
    assert [k for k in by_name if k.startswith("tipi_")] == [f"tipi_{i}" for i in range(1, 11)]
    assert by_name["tipi_4"] == [str(v) for v in range(1, 8)]
    assert "several_daily" in by_name["llm_use"]


def test_edited_taxonomy_renders_escaped_text_and_new_dimension(tmp_path):
    source = load_taxonomy().source.read_text()
    edited = source.replace("definition: Shows it grasped your situation and what matters to you.",
                            'definition: Gets "what matters" & <why> to you.')
    edited = edited.replace("  - key: support\n", "  - key: humour\n    title: Gentle humour\n"
                            "    definition: Uses humour kindly.\n    low: none\n    high: apt\n  - key: support\n")
    path = tmp_path / "taxonomy.yaml"
    path.write_text(edited)
    tax = load_taxonomy(path)
    xml = render_rating_config(tax)
    root = ET.fromstring(xml.split("-->", 1)[1])  # still well-formed despite quotes, & and <>
    assert "humour" in [r.get("name") for r in root.iter("Rating")]
    assert any('"what matters" & <why>' in (h.get("value") or "") for h in root.iter("Header"))


def test_duplicate_control_keys_are_rejected(tmp_path):
    source = load_taxonomy().source.read_text().replace("key: support", "key: tone")
    path = tmp_path / "taxonomy.yaml"
    path.write_text(source)
    with pytest.raises(TaxonomyError, match="unique"):
        load_taxonomy(path)
