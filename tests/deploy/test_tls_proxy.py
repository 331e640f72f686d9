"""The shipped HAProxy configuration (deploy/haproxy/rater-page.cfg), as the deployment guide gives it, in front
of a real rater page under gunicorn: TLS for the public, plain HTTP redirected to it, HSTS, a participant's link
opening over TLS, and a stranger forging X-Forwarded-For to escape the failed-link limit counted per client
address (they cannot). Skipped, with the reason, where Debian's haproxy or openssl is absent."""

from __future__ import annotations

import os
import subprocess
from urllib.parse import urlparse

import pytest
import requests

from sense7.processes import free_port
from sense7.deployment import PROXY_CONFIG, self_signed
from tests.support.deployment import haproxy_binary
from tests.support.jobs import wait_for
from tests.support.rater_page import gunicorn_page

pytestmark = pytest.mark.slow  # real processes: gunicorn and HAProxy

CONFIG = PROXY_CONFIG


def answers(url: str, verify) -> bool:
    try:
        return requests.get(url, timeout=5, verify=verify).status_code == 200
    except requests.RequestException:
        return False


def test_the_shipped_proxy_serves_the_page_over_tls_and_keeps_limits_per_real_client(tmp_path, redis_server):
    haproxy = haproxy_binary()
    pem, trusted = self_signed(tmp_path)
    https_port, http_port = free_port(), free_port()
    with gunicorn_page(tmp_path, redis_server.url, SENSE7_TRUSTED_PROXIES="127.0.0.1",
                       SENSE7_RATER_PAGE_LINK_LIMIT="3 per minute") as (page_url, store, tokens, _):
        env = {**os.environ, "SENSE7_PROXY_HTTPS_BIND": f"127.0.0.1:{https_port}",
               "SENSE7_PROXY_HTTP_BIND": f"127.0.0.1:{http_port}", "SENSE7_TLS_CERT": str(pem),
               "SENSE7_RATER_PAGE_ADDR": urlparse(page_url).netloc}
        checked = subprocess.run([haproxy, "-c", "-f", str(CONFIG)], env=env, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr  # the file as shipped is valid
        proxy = subprocess.Popen([haproxy, "-db", "-f", str(CONFIG)], env=env, stdout=open(tmp_path / "haproxy.log", "wb"),
                                 stderr=subprocess.STDOUT)
        front = f"https://127.0.0.1:{https_port}"
        try:
            wait_for(lambda: answers(f"{front}/healthz", str(trusted)), timeout=30, what="HAProxy in front of the page")
            health = requests.get(f"{front}/healthz", verify=str(trusted), timeout=10)
            assert health.headers["Strict-Transport-Security"].startswith("max-age=")
            plain = requests.get(f"http://127.0.0.1:{http_port}/r/{tokens['ha']}", allow_redirects=False, timeout=10)
            assert plain.status_code == 301 and plain.headers["Location"].startswith("https://")
            # A participant's link over TLS; the page's redirect stays on the proxy's https address.
            participant = requests.Session()  # (verify on each call: an environment's CA bundle overrides a session's)
            opened = participant.get(f"{front}/r/{tokens['ha']}", verify=str(trusted), timeout=30)
            assert opened.status_code == 200 and urlparse(opened.url)[:2] == ("https", f"127.0.0.1:{https_port}")
            assert urlparse(opened.url).path == "/profile"  # their questionnaire comes first
            # A stranger guessing links, a new forged X-Forwarded-For each time: the page counts the address
            # HAProxy saw (127.0.0.1), so the fourth guess is refused like the fourth of anyone at one address.
            codes = [requests.get(f"{front}/r/{'z' * 42}{i}", headers={"X-Forwarded-For": f"198.51.100.{i}"},
                                  verify=str(trusted), timeout=10).status_code for i in range(5)]
            assert codes == [404, 404, 404, 429, 429], codes
            # The participant, at the same address, still opens their link (a valid link is never refused).
            assert participant.get(f"{front}/r/{tokens['ha']}", verify=str(trusted), timeout=30).status_code == 200
            # Nothing but TLS on the public port.
            with pytest.raises(requests.RequestException):
                requests.get(f"http://127.0.0.1:{https_port}/healthz", timeout=5)
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
