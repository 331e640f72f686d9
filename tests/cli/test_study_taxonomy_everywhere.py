"""A study's own taxonomy, set once in the environment (SENSE7_TAXONOMY), reaches every command that reads a
taxonomy, and no library function picks one by itself.

The study's taxonomy here differs from the packaged one everywhere a command can show it: three controls on
a 7-point scale, a context field (`study_phase`) and a profile question (`cohort`) the packaged taxonomy
does not have. So each command's input or output tells which taxonomy it used: with the packaged one,
`import`, `raters import`, `ratings import`, `evaluate`, `analyze` and `jury` would refuse the study's files
(exit 2), `synth` would write eight controls on five levels, and `project create`, `import`, `status` and
`backend connect` would leave the Label Studio project on the packaged controls. Every command also names
a SENSE7_TAXONOMY file it cannot read instead of falling back (`analyze --study` and `models list`, whose
use of the taxonomy leaves no other trace, are covered that way)."""

from __future__ import annotations

import ast
import csv
import itertools
import json
import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from sense7.cli import app
from sense7.model.bundle import train_bundle
from sense7.model.registry import ModelRegistry
from sense7.processes import free_port
from sense7.readers.formats import load_native
from sense7.store.database import Store
from sense7.synthetic.synth import generate, write
from sense7.taxonomy import load_taxonomy, render_rating_config
from tests.support.taxonomy import SEVEN_POINT_CONTROLS, write_seven_point_taxonomy

runner = CliRunner()
_titles = itertools.count(1)
CLI_DIR = Path(__file__).resolve().parents[2] / "sense7" / "cli"


def write_study_taxonomy(directory: Path) -> Path:
    """The 3-control, 7-point taxonomy of tests/conftest.py plus a context field and a profile question."""
    path = write_seven_point_taxonomy(directory)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["context_fields"].append({"key": "study_phase", "title": "Which phase of the study?", "type": "int",
                                  "min": 1, "max": 3})
    raw["profile"].append({"key": "cohort", "title": "Cohort", "type": "choice", "choices": ["a", "b"]})
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study-taxonomy")
    path = write_study_taxonomy(root)
    tax = load_taxonomy(path)
    files = write(generate(24, 6, seed=2, taxonomy=tax), root / "files")
    # A served model of the study (for `jury` and `models list`), trained on its files.
    # Versions live in the store: each test's home starts from a copy of this one (`_env`).
    model_dir = root / "models"
    data = load_native(files["conversations.jsonl"], files["ratings.csv"], files["raters.csv"], taxonomy=tax)
    registry = ModelRegistry(model_dir, Store(f"sqlite:///{root / 'served.sqlite'}"))
    registry.add(train_bundle(data, "v1", tax), "v1")
    registry.promote("v1")
    registry.store.engine.dispose()
    return SimpleNamespace(path=path, tax=tax, files=files, root=root, model_dir=model_dir)


def test_the_study_files_are_the_study_taxonomys_own(study):
    """The premise: the packaged taxonomy refuses every file the commands below read."""
    packaged = load_taxonomy()
    assert set(study.tax.controls) == set(SEVEN_POINT_CONTROLS) and study.tax.levels == 7
    with pytest.raises(ValueError, match="study_phase"):
        load_native(study.files["conversations.jsonl"], study.files["ratings.csv"], taxonomy=packaged)
    ratings = list(csv.DictReader(study.files["ratings.csv"].open()))
    assert max(int(r["rating"]) for r in ratings if r["dimension"] in SEVEN_POINT_CONTROLS) > 5
    assert "cohort" in study.files["raters.csv"].read_text().splitlines()[0]


def _env(study, home: Path, **extra) -> dict:
    """A home whose store serves the study's v1 (a copy of the fixture's store, made once)."""
    if not (home / "store.sqlite").exists():
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(study.root / "served.sqlite", home / "store.sqlite")
    return {"SENSE7_HOME": str(home), "SENSE7_TAXONOMY": str(study.path), "SENSE7_MODEL_DIR": str(study.model_dir),
            "SENSE7_STORE_URL": f"sqlite:///{home / 'store.sqlite'}", **extra}


def _run(args: list[str], env: dict):
    result = runner.invoke(app, args, env=env)
    return result, " ".join(result.output.split())


# ---------------------------------------------------------------------------------------------------
# Commands on files


def test_synth_writes_the_study_controls_and_scale(study, tmp_path):
    result, out = _run(["synth", "--out", str(tmp_path / "synth"), "--conversations", "6", "--raters", "3"],
                       _env(study, tmp_path))
    assert result.exit_code == 0, out
    rows = list(csv.DictReader((tmp_path / "synth" / "ratings.csv").open()))
    assert {r["dimension"] for r in rows} - {study.tax.expectation_key} == set(SEVEN_POINT_CONTROLS)
    assert "cohort" in (tmp_path / "synth" / "raters.csv").read_text().splitlines()[0]
    first = json.loads((tmp_path / "synth" / "conversations.jsonl").read_text().splitlines()[0])
    assert "study_phase" in first["context"]


def test_evaluate_and_analyze_read_the_study_files_with_its_controls(study, tmp_path):
    files, env = study.files, _env(study, tmp_path)
    result, out = _run(["evaluate", "--conversations", str(files["conversations.jsonl"]),
                        "--ratings", str(files["ratings.csv"]), "--raters", str(files["raters.csv"]),
                        "--splits", "known_rater", "--folds", "3", "--boot", "10", "--models", "majority",
                        "--json", str(tmp_path / "eval.json")], env)
    assert result.exit_code == 0, out
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["controls"] == list(SEVEN_POINT_CONTROLS) and saved["levels"] == list(range(1, 8))
    result, out = _run(["analyze", "--ratings", str(files["ratings.csv"]), "--boot", "10",
                        "--json", str(tmp_path / "analysis.json")], env)
    assert result.exit_code == 0, out
    assert list(json.loads((tmp_path / "analysis.json").read_text())["variance_components"]) == \
        list(SEVEN_POINT_CONTROLS)


def test_raters_and_ratings_import_store_what_only_the_study_taxonomy_accepts(study, tmp_path):
    from sense7.store.database import Store

    files, env = study.files, _env(study, tmp_path)
    result, out = _run(["raters", "import", str(files["raters.csv"])], env)
    assert result.exit_code == 0, out
    result, out = _run(["ratings", "import", str(files["ratings.csv"]), "--conversations",
                        str(files["conversations.jsonl"])], env)
    assert result.exit_code == 0, out
    store = Store(env["SENSE7_STORE_URL"])
    assert store.raters_frame()["cohort"].notna().all()
    stored = store.rating_data(study.tax)
    assert set(stored.ratings["dimension"]) - {study.tax.expectation_key} == set(SEVEN_POINT_CONTROLS)
    assert stored.ratings["rating"].max() > 5
    assert all("study_phase" in conv.context for conv in stored.conversations.values())


def test_jury_judges_the_study_transcripts(study, tmp_path):
    out_csv = tmp_path / "jury.csv"
    result, out = _run(["jury", "--conversations", str(study.files["conversations.jsonl"]), "--panel", "all",
                        "--raters", str(study.files["raters.csv"]), "--out", str(out_csv)], _env(study, tmp_path))
    assert result.exit_code == 0, out
    rows = list(csv.DictReader(out_csv.open()))
    assert rows and {r["control"] for r in rows} == set(SEVEN_POINT_CONTROLS)


# ---------------------------------------------------------------------------------------------------
# Commands that create or update the Label Studio projects


def _rating_config(client, title: str) -> str:
    from sense7.labelstudio.client import find_project

    return client.projects.get(find_project(client, title)).label_config


def _rating_scales(config: str) -> dict[str, str]:
    """{Rating control: maxRating} of a rating project's label config."""
    root = ET.fromstring(config.split("-->", 1)[1] if "-->" in config else config)
    return {r.get("name"): r.get("maxRating") for r in root.iter("Rating")}


@pytest.mark.parametrize("command", ["project create", "import", "status", "backend connect"])
def test_commands_bring_the_projects_to_the_study_taxonomy(command, study, label_studio, tmp_path):
    from sense7.labelstudio.client import ensure_projects
    from sense7.settings import Settings

    n = next(_titles)
    titles = {"SENSE7_RATING_PROJECT_TITLE": f"study taxonomy {command} {n} {os.getpid()}",
              "SENSE7_PROFILE_PROJECT_TITLE": f"study taxonomy profile {command} {n} {os.getpid()}"}
    env = {**label_studio.settings_env(), **_env(study, tmp_path), **titles,
           "SENSE7_HOME": label_studio.settings_env()["SENSE7_HOME"],
           "SENSE7_BACKEND_URL": f"http://127.0.0.1:{free_port()}"}  # nobody answers there
    client, title = label_studio.client, titles["SENSE7_RATING_PROJECT_TITLE"]
    # Both projects start on the packaged taxonomy: the command must change them.
    ensure_projects(client, Settings.from_env({**env, "SENSE7_TAXONOMY": ""}), load_taxonomy())
    assert _rating_scales(_rating_config(client, title)) == dict.fromkeys(load_taxonomy().controls, "5")
    args = {"project create": ["project", "create"],
            "import": ["import", str(study.files["conversations.jsonl"]), "--no-predictions"],
            "status": ["status", "--json"],
            "backend connect": ["backend", "connect"]}[command]
    result, out = _run(args, env)
    # `backend connect` fails after ensuring the projects (no backend answers); the others succeed.
    assert result.exit_code == (1 if command == "backend connect" else 0), out
    config = _rating_config(client, title)
    assert _rating_scales(config) == dict.fromkeys(SEVEN_POINT_CONTROLS, "7")
    assert config.strip() == render_rating_config(study.tax).strip()


# ---------------------------------------------------------------------------------------------------
# Every command names a study taxonomy it cannot read (no silent fallback to the packaged one)

def _commands(study, tmp_path) -> dict[str, list[str]]:
    files = {k: str(v) for k, v in study.files.items()}
    return {
        "import": ["import", files["conversations.jsonl"], "--no-predictions"],
        "raters import": ["raters", "import", files["raters.csv"]],
        "ratings import": ["ratings", "import", files["ratings.csv"], "--conversations", files["conversations.jsonl"]],
        "evaluate": ["evaluate", "--conversations", files["conversations.jsonl"], "--ratings", files["ratings.csv"]],
        "analyze": ["analyze", "--ratings", files["ratings.csv"]],
        "analyze --study": ["analyze", "--study"],
        "jury": ["jury", "--conversations", files["conversations.jsonl"], "--panel", "all",
                 "--out", str(tmp_path / "jury.csv")],
        "synth": ["synth", "--out", str(tmp_path / "synth")],
        "project create": ["project", "create"],
        "status": ["status"],
        "backend connect": ["backend", "connect"],
        "models list": ["models", "list"],
    }


COMMANDS = ["import", "raters import", "ratings import", "evaluate", "analyze", "analyze --study", "jury", "synth",
            "project create", "status", "backend connect", "models list"]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreadable_study_taxonomy_is_an_error_naming_it(command, study, tmp_path):
    missing = tmp_path / "no-such-study.yaml"
    env = {**_env(study, tmp_path), "SENSE7_TAXONOMY": str(missing),
           "SENSE7_LS_URL": f"http://127.0.0.1:{free_port()}", "SENSE7_LS_TOKEN": "unused"}
    result, out = _run(_commands(study, tmp_path)[command], env)
    assert result.exit_code == 2, out
    assert "no-such-study.yaml" in out
    assert not (tmp_path / "synth").exists() and not (tmp_path / "jury.csv").exists()


def test_one_helper_resolves_the_taxonomy_for_the_command_line():
    """Only sense7.cli._common resolves --taxonomy / SENSE7_TAXONOMY (`config render|check` work on taxonomy
    files, not on a study, and read the file they are given)."""
    callers = {}
    for path in sorted(CLI_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("study_taxonomy", "load_taxonomy", "taxonomy_path_from_env"):
                    callers.setdefault(path.name, set()).add(name)
    assert callers == {"_common.py": {"study_taxonomy"}, "config.py": {"load_taxonomy"}}


def test_no_library_function_defaults_to_the_packaged_taxonomy():
    """No `taxonomy or load_taxonomy()`-style default left: below the command line, load_taxonomy() is only
    called with the file to read (sense7.taxonomy.study_taxonomy, given a path)."""
    root = CLI_DIR.parents[1]
    offenders = []
    for folder in ("sense7", "tasks", "ml_backend", "labeling_config"):
        for path in sorted((root / folder).rglob("*.py")):
            if CLI_DIR in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "load_taxonomy" and not node.args:
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
