"""User errors never print a traceback: one `error:` line (or a short list), a non-zero exit code, no rich
markup left in the text and no rater traits; bugs keep their traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import sense7.cli
from sense7.cli import app
from sense7.settings import Settings
from sense7.store.database import Store

runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    for name in ("SENSE7_STORE_URL", "SENSE7_MODEL_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SENSE7_HOME", str(home))
    return home


def _clean(result, code: int) -> str:
    out = result.output
    assert result.exit_code == code, out
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out and "[bold" not in out and "[/]" not in out
    assert out.strip().startswith("error: ")
    return out


def test_config_render_creates_a_missing_out_folder(tmp_path):
    out = tmp_path / "missing" / "configs"
    result = runner.invoke(app, ["config", "render", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["profile.xml", "rating.xml"]


def test_config_render_to_a_regular_file_is_one_line(tmp_path):
    target = tmp_path / "afile"
    target.write_text("keep me")
    out = _clean(runner.invoke(app, ["config", "render", "--out", str(target)]), 1)
    assert "not a folder" in out and str(target) in out
    assert target.read_text() == "keep me"


ROW = "age_band,gender,job_role\n"


def test_raters_import_with_another_raters_email_names_the_conflict_not_the_traits(home, tmp_path):
    first = tmp_path / "first.csv"
    first.write_text("rater_id,email," + ROW + "r1,Shared@Example.org,65+,non_binary,healthcare\n")
    assert runner.invoke(app, ["raters", "import", str(first)]).exit_code == 0
    second = tmp_path / "second.csv"
    second.write_text("rater_id,email," + ROW + "r2,shared@example.org,18-24,woman,student\n"
                      "r3,own@example.org,25-34,man,research\n")
    out = _clean(runner.invoke(app, ["raters", "import", str(second)]), 2)
    assert "rater r2: email shared@example.org is already used by rater r1" in out
    assert "nothing was imported" in out
    for trait in ("65+", "non_binary", "healthcare", "18-24", "woman", "student", "research"):
        assert trait not in out
    store = Store(Settings.from_env().store_url)
    assert set(store.rater_emails()) == {"r1"}  # r3 was not written either


def test_a_store_constraint_error_is_one_line_without_the_sql_parameters(home, tmp_path):
    """Swapping two raters' emails in one file trips the store's unique index mid-statement: the generic
    handler reports the constraint, never the SQL parameters (which hold traits)."""
    first = tmp_path / "first.csv"
    first.write_text("rater_id,email," + ROW + "r1,a@example.org,65+,non_binary,healthcare\n"
                     "r2,b@example.org,18-24,woman,student\n")
    assert runner.invoke(app, ["raters", "import", str(first)]).exit_code == 0
    swapped = tmp_path / "swapped.csv"
    swapped.write_text("rater_id,email," + ROW + "r1,b@example.org,55-64,man,healthcare\n"
                       "r2,a@example.org,18-24,woman,creative\n")
    result = runner.invoke(app, ["raters", "import", str(swapped)])
    if result.exit_code == 0:  # a database that checks uniqueness at the end of the statement: fine too
        return
    out = _clean(result, 2)
    assert "the store refused the data" in out and "nothing was written" in out
    for text in ("55-64", "creative", "SQL", "parameters"):
        assert text not in out


def test_import_problems_render_without_literal_markup(home, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    out = _clean(runner.invoke(app, ["import", str(bad)]), 2)
    assert "3 problems" in out and "nothing was imported" in out and "conversation_id: missing" in out


def test_messages_are_plain_text_even_with_brackets_in_paths(tmp_path):
    odd = tmp_path / "[red]ratings[x].csv"  # as markup, [red] would vanish
    out = _clean(runner.invoke(app, ["analyze", "--ratings", str(odd)]), 2)
    assert f"{odd}: file not found" in out


def test_os_errors_on_user_paths_are_one_line(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    out = _clean(runner.invoke(app, ["synth", "--out", str(blocker / "x"), "--conversations", "2",
                                     "--raters", "2"]), 1)
    assert str(blocker) in out and len(out.strip().splitlines()) == 1


def test_bugs_keep_their_traceback(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("sense7.cli.research.default_models", broken, raising=False)
    monkeypatch.setattr("sense7.research.evaluation.default_models", broken)
    result = runner.invoke(app, ["evaluate", "--models", "majority"])
    assert isinstance(result.exception, RuntimeError)  # not turned into a clean "error:" line

    monkeypatch.setattr(sense7.cli, "app", broken)
    with pytest.raises(SystemExit) as exit_info:
        sense7.cli.main()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug" in err and "internal error" in err
