"""A release's croissant.json: Croissant 1.1 that mlcroissant validates with no error and reads back as the
release's own rows, with the RAI annotation fields filled from the study; the datasheet README says the same;
`release --check` refuses a Croissant file that no longer describes the release."""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from sense7.cli import app
from sense7.privacy.croissant import CROISSANT_FILE
from sense7.privacy.release import ReleaseError
from sense7.privacy.release_check import check_release, originals_from_store
from sense7.store import tables
from sense7.store.study_design import StudyRecords
from sense7.synthetic import synth
from sense7.taxonomy import load_taxonomy
from tests.support.release import croissant_with_rai_fields, home_store, rater_rows

TAXONOMY = load_taxonomy()
runner = CliRunner()
pytestmark = [pytest.mark.filterwarnings("ignore:ConjunctiveGraph is deprecated"),
              pytest.mark.filterwarnings("ignore:The inplace keyword")]


@pytest.fixture
def released(tmp_path, monkeypatch):
    """A synthetic study (8 raters, 30 conversations) with a randomized design, a recorded model version and a
    Prolific crowd study, released with the command."""
    store = home_store(tmp_path, monkeypatch)
    data = synth.generate(30, 8, seed=2, taxonomy=TAXONOMY)
    store.upsert_raters(rater_rows(data))
    store.upsert_conversations(data.conversations)
    store.import_ratings(data.ratings)
    from sense7.settings import StudyDesign

    first = data.ratings.iloc[0]
    key = f"{first.conversation_id}::{int(first.turn_index)}::{first.rater_id}"
    StudyRecords(store).record_arms([{"data": {"task_key": key, "conversation_id": first.conversation_id,
                                               "turn_index": int(first.turn_index), "rater_id": first.rater_id,
                                               "prefill": "hidden"}}], StudyDesign(seed="s"), "s")
    StudyRecords(store).record_predictions([{
        "task_key": key, "version": "v7", "rater_id": first.rater_id, "conversation_id": first.conversation_id,
        "turn_index": int(first.turn_index), "arm": "hidden", "kind": "traits", "levels": {"overall": 3},
        "expected": {"overall": 3.0}, "generic_levels": {"overall": 3}, "generic_expected": {"overall": 3.0}}])
    with store.engine.begin() as conn:
        conn.execute(tables.crowd_studies.insert().values(
            study_id="wave-1", is_open=False, updated_at=datetime.now(timezone.utc),
            config={"platform": {"participant_param": "PROLIFIC_PID"}, "raters_per_conversation": 4}))
    out = tmp_path / "release"
    result = runner.invoke(app, ["release", "--out", str(out), "--k", "2"])
    assert result.exit_code == 0, result.output
    return store, data, out


def _records(folder, record_set: str) -> list[dict]:
    mlc = pytest.importorskip("mlcroissant")
    dataset = mlc.Dataset(str(folder / CROISSANT_FILE))
    assert dataset.metadata.ctx.issues.errors == set(), dataset.metadata.ctx.issues.report()
    return list(dataset.records(record_set))


def test_the_release_croissant_validates_reads_back_the_rows_and_fills_the_rai_fields(released):
    mlc = pytest.importorskip("mlcroissant")
    store, data, out = released
    dataset = mlc.Dataset(str(out / CROISSANT_FILE))
    issues = dataset.metadata.ctx.issues
    assert not issues.errors and not issues.warnings, issues.report()
    assert oct((out / CROISSANT_FILE).stat().st_mode & 0o777) == "0o600"
    released_rows = [json.loads(line) for line in (out / "data" / "ratings.jsonl").read_text().splitlines()]
    records = _records(out, "ratings")
    assert sorted((r["ratings/rater_id"].decode(), r["ratings/dimension"].decode(), r["ratings/rating"])
                  for r in records) == sorted((r["rater_id"], r["dimension"], r["rating"]) for r in released_rows)
    assert len(released_rows) == len(data.ratings)
    document = croissant_with_rai_fields(out, dataset)
    assert any("Prolific (recruitment of crowd study wave-1)" in p for p in document["rai:dataAnnotationPlatform"])
    assert "4 raters per conversation by design" in document["rai:annotationsPerItem"]
    assert all("2 raters" in d for d in document["rai:annotatorDemographics"])  # the k the release was made with
    tools = " ".join(document["rai:machineAnnotationTools"])
    assert "version v7" in tools and "traits" in tools and "randomized" in tools
    # Every file it names is one of the release's, with its checksum; nothing outside the folder.
    named = {entry["contentUrl"] for entry in document["distribution"]}
    assert named == {str(p.relative_to(out)) for p in out.rglob("*") if p.suffix in (".jsonl", ".csv")}


def test_the_release_datasheet_and_croissant_agree(released):
    _, _, out = released
    readme = (out / "README.md").read_text()
    document = json.loads((out / CROISSANT_FILE).read_text())
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| (\w+) \| (\d+) \|$", readme, re.M)}
    for name in ("ratings", "contexts", "raters"):
        assert counts[name] == len(_records(out, name)), name
    # The conversations' record set is one record per message (the CSV's layout): count the conversations.
    assert counts["conversations"] == len({r["conversations/conversation_id"] for r in _records(out, "conversations")})
    profile = re.search(r"^Profile \(the `raters` table\): (.*)\.$", readme, re.M).group(1)
    assert re.findall(r"(\w+) \([^)]*\)", profile) == [d.split(":")[0] for d in document["rai:annotatorDemographics"]]
    assert f"`{CROISSANT_FILE}`" in readme  # the datasheet names its machine-readable twin
    protocol = " ".join(document["rai:dataAnnotationProtocol"])
    for dimension in (*TAXONOMY.dimensions, TAXONOMY.overall):
        assert f"**{dimension.key}** ({dimension.title}): {dimension.definition}" in readme
        assert f"{dimension.key} ({dimension.title}): {dimension.definition}" in protocol


@pytest.mark.parametrize("tamper", ["a data file changed", "checksum", "outside the folder", "rai field", "missing",
                                    "not json", "an e-mail in its text", "a store id in its text"])
def test_release_check_refuses_a_croissant_file_that_no_longer_describes_the_release(released, tmp_path, tamper):
    store, data, out = released
    rater = data.raters["rater_id"].iloc[0]
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    path = copy / CROISSANT_FILE
    document = json.loads(path.read_text())
    if tamper == "a data file changed":  # the README, schema and JSONL still agree: only the checksum tells
        csv = copy / "csv" / "raters.csv"
        csv.write_text(csv.read_text().replace("\n", "\r\n"))
    elif tamper == "checksum":
        document["distribution"][0]["sha256"] = "0" * 64
    elif tamper == "outside the folder":
        document["distribution"][0]["contentUrl"] = "../home/store.sqlite"
    elif tamper == "rai field":
        del document["rai:annotatorDemographics"]
    elif tamper == "an e-mail in its text":
        document["rai:dataCollection"] += " Questions: " + store.rater_emails()[rater]
    elif tamper == "a store id in its text":  # (ids of 6 characters or more: "r001" could be any word)
        store.upsert_raters([{"rater_id": "participant-0042", "traits": {}}])
        document["description"] += " (see participant-0042)"
    if tamper == "missing":
        path.unlink()
    elif tamper == "not json":
        path.write_text("{")
    elif tamper != "a data file changed":
        path.write_text(json.dumps(document))
    with pytest.raises(ReleaseError) as info:
        check_release(copy, originals_from_store(store))
    message = str(info.value)
    assert "croissant.json" in message, message
    expected = {"a data file changed": "sha256: does not match csv/raters.csv", "checksum": "sha256: does not match",
                "outside the folder": "contentUrl: not a file inside the folder",
                "rai field": "rai:annotatorDemographics: missing", "missing": "missing or unreadable",
                "not json": "malformed JSON", "an e-mail in its text": "holds an e-mail address (EMAIL)",
                "a store id in its text": "holds a rater id of the store"}[tamper]
    assert expected in message
    assert "participant-0042" not in message and "@" not in message  # the kind, never the value
    result = runner.invoke(app, ["release", "--check", str(copy)])
    assert result.exit_code == 2 and "croissant.json" in result.output
    assert runner.invoke(app, ["release", "--check", str(out)]).exit_code == 0  # the original still passes
