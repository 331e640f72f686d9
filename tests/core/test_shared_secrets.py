"""Secrets every host of a deployment shares (issue 40 item 1): the crowd study's key and the rater page's session
key come from the settings (the value, or a 0600 file's path) rather than a file in one SENSE7_HOME; the settings
win over a home's own file; a secret file others may read, an empty one or a missing one is refused in one line
naming the variable and the file."""

from __future__ import annotations

import os

import pytest

from sense7.crowd.participants import pseudonymous_id, study_secret
from sense7.settings import Settings, SettingsError, crowd_secret_variable


def secret_file(path, value: str, mode: int = 0o600):
    path.write_text(value + "\n")
    os.chmod(path, mode)
    return str(path)


def test_two_homes_sharing_no_folder_agree_through_the_settings(tmp_path):
    shared = secret_file(tmp_path / "crowd-key", "k" * 40)
    a = Settings.from_env({"SENSE7_HOME": str(tmp_path / "a"), "SENSE7_CROWD_SECRET_PILOT_2_FILE": shared})
    b = Settings.from_env({"SENSE7_HOME": str(tmp_path / "b"), "SENSE7_CROWD_SECRET_PILOT_2": "k" * 40})
    assert crowd_secret_variable("pilot-2") == "SENSE7_CROWD_SECRET_PILOT_2"
    assert pseudonymous_id(study_secret(a, "pilot-2"), "pilot-2", "P1") == \
        pseudonymous_id(study_secret(b, "pilot-2"), "pilot-2", "P1")
    assert not (tmp_path / "a" / "secrets" / "crowd_pilot-2").exists()  # nothing written into the home
    assert a.secret("rater_page_secret", "SENSE7_RATER_PAGE_SECRET") != \
        b.secret("rater_page_secret", "SENSE7_RATER_PAGE_SECRET")  # not given: each home's own, as before
    assert "k" * 40 not in repr(a) + repr(b)


def test_the_settings_win_over_the_homes_file(tmp_path):
    home = tmp_path / "home"
    own = study_secret(Settings.from_env({"SENSE7_HOME": str(home)}), "pilot")  # made in the home, as before
    assert (home / "secrets" / "crowd_pilot").read_text() == own
    given = Settings.from_env({"SENSE7_HOME": str(home), "SENSE7_CROWD_SECRET_PILOT": "from-settings"})
    assert study_secret(given, "pilot") == "from-settings"
    page = Settings.from_env({"SENSE7_HOME": str(home), "SENSE7_RATER_PAGE_SECRET_FILE":
                              secret_file(tmp_path / "page-key", "page-key-value", 0o400)})
    from sense7.rater_page.app import create_app

    assert create_app(page).config["SECRET_KEY"] == "page-key-value"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_secret_file_others_may_read_is_refused(tmp_path, mode):
    path = secret_file(tmp_path / "crowd-key", "k" * 40, mode)
    cfg = Settings.from_env({"SENSE7_HOME": str(tmp_path / "home"), "SENSE7_CROWD_SECRET_PILOT_FILE": path})
    with pytest.raises(SettingsError, match=f"SENSE7_CROWD_SECRET_PILOT_FILE={path}: .*readable by others .*chmod 600"):
        study_secret(cfg, "pilot")
    assert not (tmp_path / "home" / "secrets" / "crowd_pilot").exists()  # no silent fallback to a home file


def test_an_empty_or_missing_secret_is_refused(tmp_path):
    home = str(tmp_path / "home")
    with pytest.raises(SettingsError, match="SENSE7_CROWD_SECRET_PILOT is set but empty"):
        study_secret(Settings.from_env({"SENSE7_HOME": home, "SENSE7_CROWD_SECRET_PILOT": " "}), "pilot")
    empty = secret_file(tmp_path / "empty", "")
    with pytest.raises(SettingsError, match="the file is empty"):
        study_secret(Settings.from_env({"SENSE7_HOME": home, "SENSE7_CROWD_SECRET_PILOT_FILE": empty}), "pilot")
    missing = str(tmp_path / "nowhere")
    with pytest.raises(SettingsError, match=f"SENSE7_RATER_PAGE_SECRET_FILE={missing}: No such file"):
        Settings.from_env({"SENSE7_HOME": home, "SENSE7_RATER_PAGE_SECRET_FILE": missing}).secret(
            "rater_page_secret", "SENSE7_RATER_PAGE_SECRET")
