"""`sense7 server`: refuses a taken port instead of drifting to the next one; status tells the truth."""

import socket

from typer.testing import CliRunner

from sense7.cli import app
from sense7.labelstudio.label_studio_process import LabelStudioServer

runner = CliRunner()


def test_start_refuses_clearly_when_the_port_is_taken(tmp_path, monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setenv("SENSE7_HOME", str(tmp_path))
        monkeypatch.setenv("SENSE7_LS_PORT", str(port))
        result = runner.invoke(app, ["server", "start"])
    assert result.exit_code == 1
    assert f"port {port} is already in use" in " ".join(result.output.split())
    assert not (tmp_path / "run" / "label-studio.pid").exists()  # nothing half-started


def test_status_and_stop_when_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("SENSE7_HOME", str(tmp_path))
    status = runner.invoke(app, ["server", "status"])
    assert status.exit_code == 1 and "not running" in status.output
    assert "was not running" in runner.invoke(app, ["server", "stop"]).output


def test_session_server_reports_running_and_healthy(label_studio):
    state = LabelStudioServer(label_studio.settings).status()
    assert state.running and state.healthy and state.url == label_studio.url


def test_every_command_has_help():
    for args in (["--help"], ["server", "--help"], ["server", "start", "--help"], ["import", "--help"],
                 ["raters", "import", "--help"], ["project", "create", "--help"], ["config", "render", "--help"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and "Usage" in result.output, args
