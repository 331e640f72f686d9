"""The lockdown of docs/SECURITY.md, tried as a stranger against the real Label Studio the suite runs
(started by sense7.labelstudio.label_studio_process with its defaults): each test names a row of that table."""

from __future__ import annotations

import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from label_studio_sdk.core.api_error import ApiError

from sense7.settings import BACKEND_HOST

pytestmark = pytest.mark.labelstudio


def _signup(ls_url: str, email: str, token: str | None = None) -> requests.Response:
    """What a stranger's browser does on /user/signup/: fetch the form (CSRF cookie), post it."""
    session = requests.Session()
    query = f"?token={token}" if token else ""
    page = session.get(f"{ls_url}/user/signup/{query}", timeout=30)
    csrf = session.cookies.get("csrftoken") or re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return session.post(f"{ls_url}/user/signup/{query}", allow_redirects=False, timeout=30,
                        headers={"Referer": f"{ls_url}/user/signup/"},
                        data={"csrfmiddlewaretoken": csrf, "email": email, "password": "stranger-pw-12345",
                              "how_find_us": "Other", "elaborate": "x"})


def _emails(client) -> set[str]:
    return {(u.email or "").lower() for u in client.users.list()}


def test_sign_up_without_the_invite_link_creates_no_account(label_studio):
    before = _emails(label_studio.client)
    response = _signup(label_studio.url, "stranger@example.org")
    assert response.status_code == 403
    assert _emails(label_studio.client) == before


def test_invite_staff_prints_a_link_that_works(label_studio):
    env = {"SENSE7_HOME": str(label_studio.settings.home), "SENSE7_LS_URL": label_studio.url,
           "SENSE7_LS_TOKEN": label_studio.token, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(Path(sys.executable).parent / "sense7"), "server", "invite-staff"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    link = done.stdout.strip()
    assert link.startswith(f"{label_studio.url}/user/signup/?token=")
    token = link.split("token=", 1)[1]
    assert _signup(label_studio.url, "new-staff@example.org", token).status_code == 302
    assert "new-staff@example.org" in _emails(label_studio.client)
    # A wrong token is no better than none.
    assert _signup(label_studio.url, "other@example.org", token[:-2] + "zz").status_code == 403
    assert "other@example.org" not in _emails(label_studio.client)


def _listening(host: str) -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_label_studio_calls_the_backend_address_and_no_other_local_one(label_studio, rating_project):
    """SSRF protection stays on: a member cannot point a webhook or an ML backend at Redis, PostgreSQL or
    any other local service; only the ML backend's address (127.0.0.2) is allowed."""
    client = label_studio.client
    other, other_port = _listening("127.0.0.1")  # stands for Redis, PostgreSQL, Label Studio itself ...
    allowed, allowed_port = _listening(BACKEND_HOST)
    try:
        for url in (f"http://127.0.0.1:{other_port}/hook", f"http://localhost:{other_port}/hook",
                    f"http://10.1.2.3:{other_port}/hook", "http://[::1]:6379/hook"):
            with pytest.raises(ApiError):  # 403 "reserved network address" (500 for an IPv6 literal)
                client.webhooks.create(url=url, project=rating_project, actions=["ANNOTATION_CREATED"])
        assert list(client.webhooks.list(project=str(rating_project))) == []
        hook = client.webhooks.create(url=f"http://{BACKEND_HOST}:{allowed_port}/webhook", project=rating_project,
                                      actions=["ANNOTATION_CREATED"])
        client.webhooks.delete(hook.id)
        with pytest.raises(ApiError) as refused:
            client.ml.create(project=rating_project, url=f"http://127.0.0.1:{other_port}", title="x")
        assert refused.value.status_code in (400, 403)
    finally:
        other.close()
        allowed.close()


def test_label_studio_files_are_its_owners_only(label_studio):
    home = label_studio.settings.home
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    database = home / "label-studio" / "label_studio.sqlite3"  # holds API tokens and webhook headers
    for path in (database, home / "logs" / "label-studio.log", home / "secrets" / "ls_token"):
        assert path.exists(), path
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path} is {oct(path.stat().st_mode)}"
    assert stat.S_IMODE((home / "label-studio").stat().st_mode) == 0o700
