"""`sense7 export`: the study's tidy tables load in pandas (Parquet and CSV), Hugging Face `datasets` and
mlcroissant's record reader and hold the store's ratings with everything they carry; the LeWiDi layout reads
with the shared task's starting-kit reader; a stranger's reading finds no e-mail, platform id, link secret or
store id; every misuse is one line and leaves nothing behind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from sense7.privacy.croissant import CROISSANT_FILE
from sense7.research.lewidi import anad, mean_soft_label_wasserstein
from sense7.store.database import Store
from sense7.store.rater_page_tables import token_hash

from tests.support.release import croissant_with_rai_fields, home_store, invoke, unusable_target
from tests.support.study_store import PLATFORM_ID, RATERS, TAXONOMY, WITHDRAWN, fill_study
CONTROLS = TAXONOMY.controls
# mlcroissant's own dependencies (rdflib, its pandas calls) warn about their deprecations: not ours to fix.
pytestmark = [pytest.mark.filterwarnings("ignore:ConjunctiveGraph is deprecated"),
              pytest.mark.filterwarnings("ignore:The inplace keyword")]


@pytest.fixture
def study(tmp_path, monkeypatch):
    return fill_study(home_store(tmp_path, monkeypatch))


def _store_ratings(store: Store) -> dict[tuple, int]:
    """(rater, conversation, turn, control) -> rating: what the store trains on, without the withdrawn rater
    and the conversation left out of the study."""
    frame = store.rating_data(TAXONOMY).ratings
    frame = frame[frame["dimension"].isin(CONTROLS) & (frame["rater_id"] != WITHDRAWN)
                  & ~((frame["conversation_id"] == "conv-own-" + RATERS[3]) & (frame["rater_id"] == RATERS[3]))]
    return {(r.rater_id, r.conversation_id, int(r.turn_index), r.dimension): int(r.rating)
            for r in frame.itertuples(index=False)}


def _exported(frame: pd.DataFrame) -> dict[tuple, int]:
    originals = frame[~frame["is_repeat"].astype(bool)]
    return {(r.store_rater_id, r.store_conversation_id, int(r.turn_index), r.dimension): int(r.rating)
            for r in originals.itertuples(index=False)}


def test_export_loads_in_pandas_with_the_stores_ratings_and_what_each_carries(study, tmp_path):
    out = tmp_path / "export"
    result = invoke("export", "--out", out, "--with-ids")
    assert result.exit_code == 0, result.output
    assert {oct(p.stat().st_mode & 0o777) for p in [out, *out.rglob("*")]} == {"0o600", "0o700"}
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    parquet = pd.read_parquet(out / "data" / "ratings.parquet")
    csv = pd.read_csv(out / "csv" / "ratings.csv")
    assert len(parquet) == len(csv) and list(parquet.columns) == list(csv.columns)
    expected = _store_ratings(study.store)
    assert _exported(parquet) == expected and _exported(csv) == expected
    assert pd.api.types.is_integer_dtype(parquet["rating"]) and str(parquet["rated_at"].dtype).startswith("datetime64")

    by_key = parquet.set_index(["store_rater_id", "store_conversation_id", "turn_index", "dimension", "is_repeat"])
    # A shown task whose rater saw a live pre-fill: the live record is what was shown; the served version's
    # own (static) prediction and the generic one are kept beside it.
    live = by_key.loc[(RATERS[0], "conv-shared-1", 3, "overall", False)]
    assert (live["arm"], live["prefill_shown"], live["prefill_version"], live["prefill_kind"]) == ("shown", 5, "v1+live", "live")
    assert (live["live_level"], live["live_expected"], live["live_own_ratings"]) == (5, 4.75, 2)
    assert (live["model_version"], live["static_kind"], live["generic_level"], live["generic_expected"]) == \
        ("v1", "personalized", 3, 3.1)
    assert live["static_level"] == 2 + (3 + len(RATERS[0])) % 3 and live["prefill_policy"] == "randomized"
    # A hidden task: predicted and recorded, nothing shown.
    hidden = by_key.loc[(RATERS[0], "conv-shared-2", 1, "overall", False)]
    assert hidden["arm"] == "hidden" and pd.isna(hidden["prefill_shown"]) and hidden["static_level"] == 2 + (1 + len(RATERS[0])) % 3
    # The rater page's timing and the annotation's expectation, traits and context travel with the rating.
    assert hidden["page_revisions"] == 2 and hidden["first_submitted_at"] < hidden["last_submitted_at"]
    assert hidden["seconds_on_page"] > 30 and hidden["page_seconds_total"] == hidden["seconds_on_page"] + 10
    assert live["page_revisions"] == 1 and live["page_seconds_total"] == live["seconds_on_page"]
    assert hidden["expectation"] == "partly" and hidden["context_empathy_wanted"] == 4
    assert hidden["trait_age_band"] == TAXONOMY.profile_fields[0].choices[0] and hidden["assistant_id"] == "gpt-4o"
    # The repeat, and the pilot's imported ratings with their expectation answer.
    repeat = parquet[parquet["is_repeat"]]
    assert len(repeat) == len(CONTROLS) and set(repeat["rating"]) == {4} and set(repeat["arm"]) == {"hidden"}
    pilot = parquet[parquet["source"] == "imported"]
    assert len(pilot) == len(CONTROLS) and set(pilot["expectation"]) == {"yes"} and pilot["arm"].isna().all()
    # Quality flags are a column of every row and of the raters table.
    raters = pd.read_parquet(out / "data" / "raters.parquet")
    assert set(raters["store_rater_id"]) == set(RATERS) and "quality_flags" in raters
    predictions = pd.read_parquet(out / "data" / "predictions.parquet")
    assert set(predictions["kind"]) == {"personalized", "live"} and len(predictions) % len(CONTROLS) == 0
    schema = json.loads((out / "schema.json").read_text())
    assert schema["files"]["ratings"]["rows"] == len(parquet) and schema["with_ids"] is True
    assert set(schema["files"]["ratings"]["columns"]) == set(parquet.columns)
    entry = study.store.staff_entries()[-1]
    assert entry["action"] == "export" and entry["detail"]["with_ids"] is True
    assert entry["detail"]["ratings"] == len(parquet) and "traits" not in json.dumps(entry["detail"])


def test_the_datasets_loader_reads_the_export(study, tmp_path):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "export"
    assert invoke("export", "--out", out, "--with-ids").exit_code == 0
    ratings = datasets.load_dataset(str(out), "ratings", split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert ratings.num_rows == len(pd.read_parquet(out / "data" / "ratings.parquet"))
    assert _exported(ratings.to_pandas()) == _store_ratings(study.store)
    conversations = datasets.load_dataset(str(out), "conversations", split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert set(conversations.column_names) >= {"conversation", "message_index", "role", "content"}


def _records(folder: Path, record_set: str) -> list[dict]:
    mlc = pytest.importorskip("mlcroissant")
    dataset = mlc.Dataset(str(folder / CROISSANT_FILE))
    assert dataset.metadata.ctx.issues.errors == set(), dataset.metadata.ctx.issues.report()
    prefix = f"{record_set}/"
    return [{k.removeprefix(prefix): v.decode() if isinstance(v, bytes) else v for k, v in row.items()}
            for row in dataset.records(record_set)]


def test_croissant_validates_and_its_record_reader_finds_the_stores_ratings(study, tmp_path):
    mlc = pytest.importorskip("mlcroissant")
    out = tmp_path / "export"
    assert invoke("export", "--out", out, "--with-ids").exit_code == 0
    dataset = mlc.Dataset(str(out / CROISSANT_FILE))
    issues = dataset.metadata.ctx.issues
    assert not issues.errors and not issues.warnings, issues.report()
    rows = pd.DataFrame(_records(out, "ratings"))
    rows["is_repeat"] = rows["is_repeat"].astype(bool)
    assert _exported(rows) == _store_ratings(study.store)
    document = croissant_with_rai_fields(out, dataset)  # the RAI annotation fields, filled from the study
    protocol = " ".join(document["rai:dataAnnotationProtocol"])
    assert all(d.definition in protocol for d in TAXONOMY.dimensions) and "5-point scale" in protocol
    assert any("Prolific" in p for p in document["rai:dataAnnotationPlatform"])
    per_item = document["rai:annotationsPerItem"]
    assert "1 to 4 raters per rated turn" in per_item and "3 raters per conversation by design" in per_item
    assert [d.split(":")[0] for d in document["rai:annotatorDemographics"]] == [f.key for f in TAXONOMY.profile_fields]
    tools = " ".join(document["rai:machineAnnotationTools"])
    assert "randomized" in tools and "probability 0.5" in tools and "v1" in tools and "live" in tools


def _readme_counts(text: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| (\w+) \| (\d+) \|$", text, re.M)}


def test_the_datasheet_and_the_croissant_file_agree(study, tmp_path):
    out = tmp_path / "export"
    assert invoke("export", "--out", out).exit_code == 0
    readme = (out / "README.md").read_text()
    document = json.loads((out / CROISSANT_FILE).read_text())
    counts = _readme_counts(readme)
    assert counts == {name: len(_records(out, name)) for name in ("ratings", "conversations", "raters", "predictions")}
    for key, value in document.items():
        if key.startswith("rai:"):
            line = next(line for line in readme.splitlines() if line.startswith(f"- **{key[4:]}**: "))
            for part in value if isinstance(value, list) else [value]:
                assert str(part) in line, (key, part)
    profile = re.search(r"^Profile \(the `raters` table\): (.*)\.$", readme, re.M).group(1).split(", ")
    assert profile == [d.split(":")[0] for d in document["rai:annotatorDemographics"]]


def _all_text(folder: Path) -> str:
    """Every file as text; Parquet files as their rows."""
    parts = []
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".parquet":
            parts.append(pd.read_parquet(path).to_csv())
        elif path.is_file():
            parts.append(path.read_text())
    return "\n".join(parts)


@pytest.mark.parametrize("fmt", ["tidy", "lewidi"])
def test_a_stranger_finds_no_email_platform_id_link_secret_or_store_id(study, tmp_path, fmt):
    out = tmp_path / "export"
    result = invoke("export", "--out", out, "--format", fmt)
    assert result.exit_code == 0, result.output
    blob = _all_text(out)
    for needle in [*study.emails, PLATFORM_ID, *study.secrets, *map(token_hash, study.secrets), *RATERS, WITHDRAWN,
                   "conv-shared-1", "conv-own-", "conv-pilot-9", "private note", "My move"]:
        assert needle not in blob, needle
    assert re.search(r"\bAnn\d+\b", blob) and re.search(r"\bConv\d+\b", blob)
    if fmt == "tidy":
        ratings = pd.read_parquet(out / "data" / "ratings.parquet")
        assert not {"store_rater_id", "task_id", "annotation_id"} & set(ratings.columns)
        assert len(ratings) == len(_store_ratings(study.store)) + len(CONTROLS)  # + the repeat
        assert study.store.staff_entries()[-1]["detail"]["with_ids"] is False


@pytest.mark.parametrize("plant", ["store id in a message", "platform id as the assistant", "link hash in a message"])
def test_a_value_that_must_not_leave_stops_the_export_and_nothing_is_written(study, tmp_path, plant):
    from sense7.data.conversations import Conversation, Message

    store = study.store
    text = {"store id in a message": f"my friend {RATERS[1]} said hi",
            "link hash in a message": token_hash(study.secrets[0]),
            "platform id as the assistant": "I hear you."}[plant]
    context = {"task_type": "advice", "assistant_id": PLATFORM_ID} if plant.startswith("platform") else {}
    messages = store.conversations_by_id()["conv-shared-1"]
    store.upsert_conversations([Conversation("conv-shared-1", RATERS[0], [Message("user", text), *messages[1:]],
                                             context)])
    before = store.snapshot()
    out = tmp_path / "export"
    result = invoke("export", "--out", out)
    assert result.exit_code == 2 and result.output.startswith("error: ") and "fails its check" in result.output
    assert RATERS[1] not in result.output and PLATFORM_ID not in result.output
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    assert store.snapshot() == before  # not even a staff-log line


@pytest.mark.parametrize("case", ["non-empty", "a file", "unknown format", "no store", "no --out"])
def test_misuse_is_one_line_and_writes_nothing(study, tmp_path, monkeypatch, case):
    target = unusable_target(tmp_path, case)
    args = ["export", "--out", target]
    if case == "unknown format":
        args += ["--format", "jsonl"]
    elif case == "no --out":
        args = ["export", "--with-ids"]
    elif case == "no store":
        monkeypatch.setenv("SENSE7_HOME", str(tmp_path / "nohome"))
    before_files = sorted(p.name for p in tmp_path.iterdir()) + (["nohome"] if case == "no store" else [])
    before = study.store.snapshot()
    result = invoke(*args)
    assert result.exit_code == 2 and result.output.startswith("error: ") and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "nothing was written" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before_files  # no staging folder left either
    assert study.store.snapshot() == before
    if case == "non-empty":
        assert [p.name for p in target.iterdir()] == ["keep.txt"]
    if case == "no store":
        assert not (tmp_path / "nohome" / "store.sqlite").exists()  # (settings make the home, never a store)


def _starting_kit_load(path: Path) -> tuple[list, list, list, list]:
    """LeWiDi 2025's starting-kit reader (`load_data` for CSC, MP and Par), reduced to what it reads: the
    file is one JSON object keyed by item id; the soft target is `list(soft_label.values())`, the
    perspectivist target `[int(annotations[a]) for a in annotators.split(",")]`."""
    with open(path) as fh:
        data = json.load(fh)
    soft, pe, annotators, ids = [], [], [], []
    for id_, content in data.items():
        ids.append(id_)
        annotators.append(content["annotators"])
        soft.append(list(content.get("soft_label", {}).values()))
        pe.append([int(content["annotations"][a]) for a in content["annotators"].split(",")])
    return soft, pe, annotators, ids


def test_lewidi_layout_reads_with_the_starting_kit_reader_and_holds_the_stores_ratings(study, tmp_path):
    out = tmp_path / "lewidi"
    result = invoke("export", "--out", out, "--format", "lewidi", "--with-ids")
    assert result.exit_code == 0, result.output
    expected = _store_ratings(study.store)
    found = {}
    for control in CONTROLS:
        folder = out / control
        assert sorted(p.name for p in folder.iterdir()) == [f"{control}_annotators_meta.json", f"{control}_train.json"]
        soft, pe, annotators, ids = _starting_kit_load(folder / f"{control}_train.json")
        meta = json.loads((folder / f"{control}_annotators_meta.json").read_text())
        items = json.loads((folder / f"{control}_train.json").read_text())
        assert ids == [str(n) for n in range(1, len(ids) + 1)]
        for item_id, targets, names, distribution in zip(ids, pe, annotators, soft):
            item = items[item_id]
            assert len(distribution) == TAXONOMY.levels and sum(distribution) == pytest.approx(1)
            assert distribution == [targets.count(level) / len(targets) for level in range(1, TAXONOMY.levels + 1)]
            assert item["number of annotators"] == len(targets) == item["number of annotations"]
            assert item["split"] == "train" and set(item["text"]) == {"context", "response"} and item["text"]["response"]
            for name, label in zip(names.split(","), targets):
                found[(meta[name]["store_rater_id"], item["other_info"]["store_conversation_id"],
                       item["other_info"]["turn_index"], control)] = label
        assert set(meta) == set(meta) & {n for names in annotators for n in names.split(",")} | set(meta)
        assert set(next(iter(meta.values()))) == {f.key for f in TAXONOMY.profile_fields} | {"store_rater_id"}
        # The task's own scores run on the layout: the targets scored against themselves are perfect.
        codes = [i for i, targets in enumerate(pe) for _ in targets]
        flat = [label for targets in pe for label in targets]
        assert anad(codes, flat, flat, TAXONOMY.levels) == 0
        assert mean_soft_label_wasserstein(soft, soft) == 0
    assert found == expected
    _records(out, f"{CONTROLS[0]}_items")  # mlcroissant validates the layout's Croissant file too
