"""Shared-nothing processes (issue 40 item 1): the worker, the ML backend, two rater pages and beat, each in a home
of its own with no folder in common, against one PostgreSQL store and one Redis over TCP. A's worker retrains and
promotes; B's backend serves the new version without a restart; a link A's CLI made opens on C's rater page, the
participant's session continues on C2's, and failed link openings count against one limit across both pages.
Each service runs docker-compose.yml's command with its settings (sense7/deployment.py, the one list
tests/jobs/test_compose.py holds the compose file to). Label Studio is not needed: nothing here reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests

from sense7.labelstudio.protocol import rating_tasks
from sense7.processes import free_port
from sense7.readers.formats import read_conversations, read_ratings, read_raters
from sense7.settings import BACKEND_HOST
from sense7.store.database import Store
from sense7.store.rater_page_tables import RaterQueue
from sense7.synthetic import synth
from sense7.taxonomy import load_taxonomy, render_rating_config
from tests.support.backend import PASSWORD, SECRET, USER
from sense7.deployment import SHARED_SETTINGS, service_process
from sense7.deployment import stop_process as stop
from tests.support.jobs import wait_for
from tests.support.postgres import throwaway_databases

pytestmark = pytest.mark.slow

SENSE7 = str(Path(sys.executable).parent / "sense7")
TAXONOMY = load_taxonomy()


def cli(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([SENSE7, *args], env=env, capture_output=True, text=True, timeout=timeout)


def folders(home: Path) -> set[Path]:
    return {p for p in home.rglob("*")}


@pytest.fixture
def deployment(tmp_path, redis_server):
    """The settings every host shares (the store, Redis, the secrets) and one home per host."""
    with throwaway_databases("sense7_multi_home") as (store_url,):
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SENSE7_", "CELERY_"))}
        shared = dict(SENSE7_STORE_URL=store_url, SENSE7_REDIS_URL=redis_server.url, SENSE7_BACKEND_USER=USER,
                      SENSE7_BACKEND_PASSWORD=PASSWORD, SENSE7_WEBHOOK_SECRET=SECRET,
                      SENSE7_RATER_PAGE_SECRET="shared-session-key-" + "9" * 24,
                      SENSE7_LS_URL="http://127.0.0.1:9", SENSE7_LS_TOKEN="no-label-studio-here")
        assert set(shared) == set(SHARED_SETTINGS)  # what docker-compose.yml gives every sense7 service
        base.update(shared, SENSE7_RATER_PAGE_LINK_LIMIT="4 per minute")
        homes = {name: tmp_path / f"host-{name}" for name in ("a", "b", "c", "c2", "d")}
        envs = {name: {**base, "SENSE7_HOME": str(home)} for name, home in homes.items()}
        yield store_url, homes, envs


def test_worker_backend_and_rater_pages_share_only_the_store_redis_and_settings(deployment, tmp_path):
    store_url, homes, envs = deployment
    data = synth.generate(40, 6, seed=5, taxonomy=TAXONOMY)
    synth.write(data, tmp_path / "data")
    store = Store(store_url)
    store.upsert_raters(read_raters(tmp_path / "data" / "raters.csv", TAXONOMY))
    store.upsert_conversations(read_conversations(tmp_path / "data" / "conversations.jsonl", taxonomy=TAXONOMY))
    store.import_ratings(read_ratings(tmp_path / "data" / "ratings.csv", TAXONOMY))

    backend_port = free_port()
    envs["b"].update(SENSE7_BACKEND_BIND=f"{BACKEND_HOST}:{backend_port}", SENSE7_BACKEND_WORKERS="1")
    page_ports = {name: free_port() for name in ("c", "c2")}
    for name, port in page_ports.items():
        envs[name].update(SENSE7_RATER_PAGE_HOST="127.0.0.1", SENSE7_RATER_PAGE_PORT=str(port),
                          SENSE7_RATER_PAGE_WORKERS="1")
    worker = beat = None
    started = []
    try:
        # B: the ML backend, before any version exists.
        started.append(service_process("ml-backend", envs["b"], tmp_path / "backend-b.log"))
        backend = f"http://{BACKEND_HOST}:{backend_port}"
        wait_for(lambda: _answers(f"{backend}/health", auth=(USER, PASSWORD)), timeout=120, what="B's backend")
        conversation = data.conversations[0]
        body = {"tasks": [{"id": 1, "data": rating_tasks(conversation)[0]["data"]}],
                "label_config": render_rating_config(TAXONOMY)}

        def served_version():
            answer = requests.post(f"{backend}/predict", json=body, auth=(USER, PASSWORD), timeout=30)
            return answer.json()["results"][0]["model_version"] if answer.status_code == 200 else None

        assert served_version() is None

        # A: the worker retrains (the job sent by A's CLI through Redis) and promotes v1 into the store.
        worker = service_process("worker", envs["a"], tmp_path / "worker-a.log")
        queued = cli(envs["a"], "retrain", "--enqueue")
        assert queued.returncode == 0, queued.stderr
        assert wait_for(served_version, timeout=600, what="B's backend serving the version A's worker promoted") == "v1"
        assert len(list((homes["b"] / "models" / "cache").iterdir())) == 1  # B's own copy, fetched from the store

        # C: a link made by A's CLI opens on C's rater page; the session goes on at C2 (another home).
        rater = sorted(store.raters_frame().index)[0]
        conv = next(c for c in data.conversations if c.rater_id == rater)
        task = rating_tasks(conv)[0]["data"]
        RaterQueue(store).replace(rater, [{  # what beat's queue copy writes (Label Studio is not running here)
            "task_id": 501, "kind": "rating", "position": 0, "conversation_id": task["conversation_id"],
            "turn_index": task["turn_index"], "data": {"history": task["history"], "turn": task["turn"],
                                                       "repeat": False, "instructed": None},
            "prediction": None, "answer": None}])
        links = tmp_path / "links.csv"
        made = cli(envs["a"], "raters", "invite", "--rater", rater, "--no-copy-queues", "--out", str(links),
                   "--base-url", f"http://127.0.0.1:{page_ports['c']}")
        assert made.returncode == 0, made.stderr
        url = links.read_text().splitlines()[1].split(",")[1]
        for name, service in (("c", "rater-page"), ("c2", "rater-page-2")):
            started.append(service_process(service, envs[name], tmp_path / f"{service}.log"))
            wait_for(lambda port=page_ports[name]: _answers(f"http://127.0.0.1:{port}/healthz"), timeout=120,
                     what=f"{service} in host {name}")
        participant = requests.Session()
        opened = participant.get(url, timeout=30)
        assert opened.status_code == 200 and urlparse(opened.url).path == "/task/501", (opened.url, opened.text[:300])
        other_page = f"http://127.0.0.1:{page_ports['c2']}"
        again = participant.get(f"{other_page}/task/501", timeout=30)
        control = f'name="{TAXONOMY.controls[0]}"'
        assert again.status_code == 200 and control in again.text and control in opened.text
        stranger = requests.get(f"{other_page}/task/501", timeout=30, allow_redirects=False)
        assert stranger.status_code == 404  # no session: nothing of the rater's

        # Failed link openings: one limit (4 a minute) across both pages, counted in the shared Redis.
        pages = [f"http://127.0.0.1:{page_ports['c']}", other_page]
        codes = [requests.get(f"{pages[i % 2]}/r/{'x' * 43}{i}", timeout=30).status_code for i in range(6)]
        assert codes[:4] == [404] * 4 and codes[4:] == [429, 429], codes

        # D: the one scheduler, its schedule's state in its own home.
        beat = service_process("beat", envs["d"], tmp_path / "beat-d.log")
        wait_for(lambda: list((homes["d"] / "run").glob("celerybeat-schedule*")), timeout=120, what="beat's schedule")
        assert beat.poll() is None, (tmp_path / "beat-d.log").read_text()[-2000:]

        # No folder in common: each host wrote only into its own home (no link out of it), and the versions each
        # used are its own copies.
        for home in homes.values():
            assert not [p for p in folders(home) if p.is_symlink()]
        assert {p.name for p in (homes["a"] / "models" / "cache").iterdir()} == \
            {p.name for p in (homes["b"] / "models" / "cache").iterdir()}
        assert not (homes["b"] / "secrets" / "rater_page_secret").exists()  # the page's key came from the settings
    finally:
        for process in (beat, *reversed(started), worker):
            stop(process)
        store.engine.dispose()


HAPROXY_CONFIG = """global
    maxconn 256
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend pages
    bind 127.0.0.1:{port}
    default_backend instances
backend instances
    balance roundrobin
    http-response set-header X-Instance %[srv_name]
{servers}
"""


def test_one_participant_across_two_rater_pages_behind_haproxy(deployment, tmp_path):
    """Debian's HAProxy spreads one participant's requests over two rater-page instances (round robin, no
    stickiness): the session opened by the link goes on whichever instance answers, and failed link openings
    count against one limit."""
    import shutil

    haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if haproxy is None:
        pytest.skip("HAProxy is not installed (Debian: apt-get install haproxy)")
    store_url, homes, envs = deployment
    store = Store(store_url)
    store.upsert_raters([{"rater_id": "p1", "traits": {}}])
    conv = synth.generate(1, 1, seed=3, taxonomy=TAXONOMY).conversations[0]
    task = rating_tasks(conv)[0]["data"]
    RaterQueue(store).replace("p1", [{
        "task_id": 601, "kind": "rating", "position": 0, "conversation_id": task["conversation_id"],
        "turn_index": task["turn_index"], "data": {"history": task["history"], "turn": task["turn"],
                                                   "repeat": False, "instructed": None},
        "prediction": None, "answer": None}])
    proxy_port = free_port()
    page_ports = {name: free_port() for name in ("c", "c2")}
    links = tmp_path / "links.csv"
    made = cli(envs["a"], "raters", "invite", "--rater", "p1", "--no-copy-queues", "--out", str(links),
               "--base-url", f"http://127.0.0.1:{proxy_port}")
    assert made.returncode == 0, made.stderr
    url = links.read_text().splitlines()[1].split(",")[1]
    config = tmp_path / "haproxy.cfg"
    config.write_text(HAPROXY_CONFIG.format(port=proxy_port, servers="\n".join(
        f"    server {name} 127.0.0.1:{port}" for name, port in page_ports.items())))
    started, proxy = [], None
    try:
        for name, port in page_ports.items():
            envs[name].update(SENSE7_RATER_PAGE_PORT=str(port), SENSE7_RATER_PAGE_WORKERS="1")
            done = cli(envs[name], "rater-page", "start")
            assert done.returncode == 0, done.stderr
            started.append(name)
        proxy = subprocess.Popen([haproxy, "-db", "-f", str(config)], stdout=open(tmp_path / "haproxy.log", "wb"),
                                 stderr=subprocess.STDOUT)
        front = f"http://127.0.0.1:{proxy_port}"
        wait_for(lambda: _answers(f"{front}/healthz"), timeout=30, what="HAProxy in front of both pages")
        participant = requests.Session()
        opened = participant.get(url, timeout=30)
        assert opened.status_code == 200 and urlparse(opened.url).path == "/task/601"
        seen = set()
        for _ in range(6):
            page = participant.get(f"{front}/task/601", timeout=30)
            assert page.status_code == 200 and f'name="{TAXONOMY.controls[0]}"' in page.text
            seen.add(page.headers["X-Instance"])
        assert seen == {"c", "c2"}  # both instances served the one session
        assert requests.get(f"{front}/task/601", timeout=30).status_code == 404  # a stranger behind the proxy
        codes = [requests.get(f"{front}/r/{'y' * 43}{i}", timeout=30).status_code for i in range(6)]
        assert codes[:4] == [404] * 4 and codes[4:] == [429, 429], codes
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=30)
        for name in reversed(started):
            cli(envs[name], "rater-page", "stop")
        store.engine.dispose()


def _answers(url: str, auth=None) -> bool:
    try:
        return requests.get(url, timeout=5, auth=auth).status_code == 200
    except requests.RequestException:
        return False
