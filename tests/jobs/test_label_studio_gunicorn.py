"""Label Studio as a production deployment serves it (SENSE7_LS_WORKERS): its WSGI app under gunicorn with
several worker processes, on PostgreSQL. The stack starts it, it answers the API with sense7's token, and
`sense7 down` stops the master and every worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sense7.processes import free_port, pid_alive, port_is_free
from sense7.settings import Settings, SettingsError
from tests.support.jobs import PG

pytestmark = [pytest.mark.labelstudio, pytest.mark.slow]


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(c) for c in text)
    return found


def test_ls_workers_setting_rejects_bad_values():
    assert Settings.from_env({"SENSE7_HOME": "/tmp/x"}).ls_workers == 0
    assert Settings.from_env({"SENSE7_HOME": "/tmp/x", "SENSE7_LS_WORKERS": "3"}).ls_workers == 3
    with pytest.raises(SettingsError, match="SENSE7_LS_WORKERS='many'"):
        Settings.from_env({"SENSE7_HOME": "/tmp/x", "SENSE7_LS_WORKERS": "many"})
    with pytest.raises(SettingsError, match="SENSE7_LS_THREADS='0'"):
        Settings.from_env({"SENSE7_HOME": "/tmp/x", "SENSE7_LS_THREADS": "0"})


def test_ls_nice_setting_runs_label_studio_under_nice_and_rejects_bad_values():
    from sense7.labelstudio.label_studio_process import LabelStudioServer

    assert Settings.from_env({"SENSE7_HOME": "/tmp/x"}).ls_nice == 0
    cfg = Settings.from_env({"SENSE7_HOME": "/tmp/x", "SENSE7_LS_NICE": "10", "SENSE7_LS_WORKERS": "2"})
    command = LabelStudioServer(cfg).command()
    assert command[:3] == ["nice", "-n", "10"] and Path(command[3]).name == "gunicorn"
    plain = LabelStudioServer(Settings.from_env({"SENSE7_HOME": "/tmp/x", "SENSE7_LS_WORKERS": "2"})).command()
    assert plain == command[3:]
    for bad in ("20", "-1", "low"):
        with pytest.raises(SettingsError, match=f"SENSE7_LS_NICE='{bad}'"):
            Settings.from_env({"SENSE7_HOME": "/tmp/x", "SENSE7_LS_NICE": bad})


def test_label_studio_under_gunicorn_starts_answers_and_stops(pg_databases, tmp_path, monkeypatch):  # noqa: F811
    from sense7.labelstudio import client as ls_client
    from sense7.stack import Stack
    from sense7.taxonomy import load_taxonomy

    env = {"SENSE7_HOME": str(tmp_path / "home"), "SENSE7_LS_PORT": str(free_port()),
           "SENSE7_LS_DATABASE_URL": f"{PG}/{pg_databases['ls']}", "SENSE7_LS_WORKERS": "2",
           "SENSE7_LS_NICE": "10"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = Settings.from_env()
    stack = Stack(cfg)
    try:
        status = stack.start_label_studio()
        assert status.healthy and "gunicorn x 2" in status.detail and "PostgreSQL" in status.detail
        master = status.pid
        assert "gunicorn" in Path(f"/proc/{master}/cmdline").read_text()
        workers = children(master)
        assert len(workers) == 2, workers
        # Background work for the raters (SENSE7_LS_NICE): the master and the workers it forks run below them
        # (`nice -n 10`: relative to this process, 19 at most).
        niceness = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
        assert {os.getpriority(os.PRIO_PROCESS, pid) for pid in (master, *workers)} == {niceness}
        # The API answers with sense7's token (made by `label-studio init` before gunicorn serves), and a
        # write made through one worker is read back (through whichever worker answers).
        client = ls_client.connect(cfg)
        rating, _profile = ls_client.ensure_projects(client, cfg, load_taxonomy())
        assert ls_client.find_project(client, cfg.rating_project_title) == rating
        # A second start finds it running (idempotent), as for Label Studio's own server.
        assert stack.label_studio.start().pid == master
    finally:
        down = subprocess.run([str(Path(sys.executable).parent / "sense7"), "down"], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not pid_alive(master)
    assert not any(pid_alive(w) for w in workers)
    assert port_is_free(cfg.ls_port)
