"""The rater page on the real stack (the session's Label Studio, a test's Redis, a worker, the ML backend and the
page under gunicorn) and the page's forms as a browser fills them; the live pre-fill's trained version."""

from __future__ import annotations

import copy
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import requests
from sqlalchemy import select

from sense7.store.rater_page_tables import LinkBook
from sense7.store.tables import annotations as annotations_table
from sense7.store.tables import ratings as ratings_table
from sense7.synthetic.synth import generate
from sense7.labelstudio.importer import (
    import_conversations,
    import_profile_tasks,
    plan_tasks,
)
from sense7.labelstudio.label_sync import LabelSync
from sense7.labelstudio.protocol import webhook_headers
from sense7.model.bundle import save_bundle, train_bundle
from sense7.model.registry import ModelRegistry
from sense7.processes import ManagedProcess, free_port
from sense7.taxonomy import load_taxonomy
from tests.support.jobs import make_conversations, make_raters
from tests.support.stack import VENV_BIN
from contextlib import contextmanager
from sense7.store.database import Store
from sense7.store.tables import submissions
import dataclasses
from sense7.store.rater_page_tables import RaterQueue
from sense7.taxonomy import InstructedItem

TAXONOMY = load_taxonomy()  # the packaged taxonomy: these tests' data are made for it


REPO = Path(__file__).resolve().parents[2]


@dataclass
class RaterPageStack:
    stack: object        # tests.support.stack.JobStack
    rt: object           # its Runtime
    url: str
    links: dict          # rater_id -> full link URL
    raters: list[dict]
    page: ManagedProcess

    def session_for(self, rater_id: str) -> requests.Session:
        """A browser-like session that has opened `rater_id`'s link."""
        session = requests.Session()
        opened = session.get(self.links[rater_id], timeout=30)
        assert opened.status_code == 200, opened.status_code
        return session

    def rating_tasks(self, rater_id: str) -> list:
        return [t for t in self.rt.client.tasks.list(project=self.rt.rating_project, include="id,data",
                                                     page_size=1000) if t.data["rater_id"] == rater_id]


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def hidden(html: str, name: str) -> str:
    return re.search(rf'name="{name}" value="([^"]*)"', html).group(1)


def start_page(stack, port: int, extra_env: dict | None = None) -> ManagedProcess:
    env = {**stack.env, "SENSE7_RATER_PAGE_PORT": str(port), "SENSE7_RATER_PAGE_WORKERS": "1",
           "SENSE7_RATER_PAGE_THREADS": "4", **(extra_env or {})}

    def up() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    cmd = [str(VENV_BIN / "gunicorn"), "--config", str(REPO / "sense7" / "rater_page" / "gunicorn_conf.py"),
           "sense7.rater_page.wsgi:app_from_env()"]
    return stack.start(ManagedProcess("rater-page", stack.tmp, up, startup_timeout=60), cmd, env)


def start_rating_services(stack, rt, worker_env: dict | None = None,
                          page_env: dict | None = None) -> tuple[str, ManagedProcess]:
    """The ML backend with Label Studio's webhooks, a worker with beat delivering every 2 s, and a rater page
    on a free port: (its URL, its process)."""
    stack.start_backend()
    LabelSync.from_runtime(rt).ensure_webhooks(f"{stack.backend_url}/webhook", webhook_headers(rt.settings))
    stack.start_worker(beat=True, extra_env={"SENSE7_DELIVER_INTERVAL": "2", **(worker_env or {})})
    port = free_port()
    return f"http://127.0.0.1:{port}", start_page(stack, port, page_env)


def build(stack, per_rater: int = 2, turns: int = 3, worker_env: dict | None = None,
          page_env: dict | None = None) -> RaterPageStack:
    """Two raters (a1, b1) with conversations in Label Studio, questionnaire tasks, webhooks, a worker,
    the backend, the rater page and one link each."""
    rt = stack.runtime()
    raters = make_raters(2, prefix="pg")
    rt.store.upsert_raters(raters)
    convs = make_conversations([r["rater_id"] for r in raters], per_rater=per_rater, turns=turns, prefix="pg")
    import_conversations(rt.client, rt.rating_project, convs, rt.store, taxonomy=rt.taxonomy)
    import_profile_tasks(rt.client, rt.profile_project, [r["rater_id"] for r in raters])
    url, page = start_rating_services(stack, rt, worker_env, page_env)
    book = LinkBook(rt.store)
    links = {r["rater_id"]: f"{url}/r/{book.issue(r['rater_id'])}" for r in raters}
    return RaterPageStack(stack, rt, url, links, raters, page)


def import_randomized_study(stack, n_raters: int, prefix: str, per_rater: int, turns: int,
                            repeat_share: float) -> tuple[list[dict], list]:
    """A served v1 (trained on a small synthetic study), then `n_raters` raters' conversations imported with
    its predictions under a randomized pre-fill policy (seed = prefix), with their questionnaire tasks.
    Returns (raters, conversations)."""
    from sense7.synthetic import synth
    from sense7.ml_backend.model import build_model
    from sense7.model.bundle import save_bundle, train_bundle
    from sense7.model.registry import ModelRegistry
    from sense7.settings import StudyDesign

    rt = stack.runtime()
    registry = ModelRegistry.from_settings(rt.settings, rt.store)
    registry.add(train_bundle(synth.generate(30, 6, seed=2, taxonomy=TAXONOMY).rating_data(), "v1", TAXONOMY), "v1")
    registry.promote("v1")
    raters = make_raters(n_raters, prefix=prefix)
    ids = [r["rater_id"] for r in raters]
    rt.store.upsert_raters(raters)
    convs = make_conversations(ids, per_rater=per_rater, turns=turns, prefix=prefix)
    label_config = rt.client.projects.get(rt.rating_project).label_config
    import_conversations(rt.client, rt.rating_project, convs, rt.store,
                         predict=build_model(rt.settings).import_predictor(label_config),
                         design=StudyDesign("randomized", shown_share=0.5, seed=prefix, repeat_share=repeat_share),
                         taxonomy=rt.taxonomy)
    import_profile_tasks(rt.client, rt.profile_project, ids)
    return raters, convs


def serve_study(stack, rater_ids: list[str]) -> tuple[str, dict[str, str]]:
    """The backend receiving webhooks, a worker with beat, the rater page and a link per rater, their
    queues copied: (page URL, rater_id -> link)."""
    from sense7.tasks.delivery import refresh_queues

    rt = stack.runtime()
    url, _ = start_rating_services(stack, rt)
    book = LinkBook(rt.store)
    links = {r: f"{url}/r/{book.issue(r)}" for r in rater_ids}
    refresh_queues(rt, rater_ids)
    return url, links


def start_page_url(stack) -> str:
    from sense7.processes import free_port

    port = free_port()
    start_page(stack, port)
    return f"http://127.0.0.1:{port}"


NEW = "new-rater"


TRAINED_BUNDLE = "trained-v1"


def serve_trained(store, model_dir: Path) -> ModelRegistry:
    """The registry of `store` (cached in `model_dir`) serving trained_version's bundle as v1 (nothing when
    `model_dir` holds no trained bundle: a registry without versions)."""
    from sense7.model.bundle import load_bundle

    registry = ModelRegistry(model_dir, store)
    if (Path(model_dir) / TRAINED_BUNDLE).is_dir() and registry.current() is None:
        registry.promote(registry.add(load_bundle(Path(model_dir) / TRAINED_BUNDLE), "v1").name)
    return registry


def trained_version(tmp_path_factory):
    """A version trained on a synthetic study; the newcomer gets 2 held-out conversations of its own."""
    synth = copy.deepcopy(generate(60, 10, seed=11, taxonomy=TAXONOMY))
    data = synth.rating_data()
    held = sorted({c.conversation_id for c in synth.conversations})[-2:]
    data.ratings = data.ratings[~data.ratings["conversation_id"].isin(held)]
    data.conversations = {k: v for k, v in data.conversations.items() if k[0] not in held}
    bundle = train_bundle(data, "v1", TAXONOMY)
    model_dir = tmp_path_factory.mktemp("models")  # every test's registry cache; the bundle each store serves
    save_bundle(bundle, model_dir / TRAINED_BUNDLE)
    newcomer = [copy.deepcopy(c) for c in synth.conversations if c.conversation_id in held]
    for conv in newcomer:
        conv.rater_id = NEW
    profile = synth.raters.drop(columns=["rater_id", "email"]).iloc[0].to_dict()
    return model_dir, newcomer, profile


def checked_levels(html: str) -> dict:
    return {name: int(value) for name, value in
            re.findall(r'<input type="radio" name="(\w+)" value="(\d+)" required checked>', html)}


def answer_on_page(client, task_id: int, level: int):
    html = client.get(f"/task/{task_id}").get_data(as_text=True)
    form = {"csrf_token": re.search(r'name="csrf_token" value="([^"]+)"', html).group(1),
            "revision": re.search(r'name="revision" value="([^"]*)"', html).group(1),
            "rendered_at": re.search(r'name="rendered_at" value="([^"]*)"', html).group(1),
            TAXONOMY.expectation_key: TAXONOMY.expectation_values[-1]}
    form.update({c: str(level) for c in TAXONOMY.controls})
    assert client.post(f"/task/{task_id}", data=form).status_code == 303


def submit(session, url: str, task_id: int, tax, level: int) -> requests.Response:
    page = session.get(f"{url}/task/{task_id}", timeout=30)
    assert page.status_code == 200
    form = {"csrf_token": csrf_of(page.text), "revision": hidden(page.text, "revision"),
            "rendered_at": hidden(page.text, "rendered_at"), tax.expectation_key: tax.expectation_values[1],
            tax.comment_key: f"level {level}"}
    form.update({c: str(level) for c in tax.controls})
    return session.post(f"{url}/task/{task_id}", data=form, timeout=30, allow_redirects=False)


def answer_profile(session, url: str, tax, traits: dict) -> None:
    page = session.get(f"{url}/profile", timeout=30)
    form = {"csrf_token": csrf_of(page.text), "revision": hidden(page.text, "revision"),
            "rendered_at": hidden(page.text, "rendered_at"), **{k: str(v) for k, v in traits.items()}}
    assert session.post(f"{url}/profile", data=form, timeout=30, allow_redirects=False).status_code == 303


def label_studio_annotations(rt, project: int) -> list[dict]:
    return [dict(a, task=t.id) for t in rt.client.tasks.list(project=project, fields="all", page_size=1000)
            for a in (dict(x) for x in (t.annotations or []))]


def stored(rt) -> dict[int, tuple]:
    with rt.store.engine.connect() as conn:
        return {r.task_id: (r.rater_id, r.annotation_id) for r in conn.execute(
            select(annotations_table).where(annotations_table.c.deleted.is_(False)))}


def stored_values(rt, annotation_id: int) -> dict[str, int]:
    with rt.store.engine.connect() as conn:
        return dict(conn.execute(select(ratings_table.c.control, ratings_table.c.value)
                                 .where(ratings_table.c.annotation_id == annotation_id)).all())


def study_ratings(conversations, taxonomy, seed: int = 3) -> pd.DataFrame:
    """Honest synthetic answers: levels that vary across controls and turns."""
    rng = random.Random(seed)
    rows = []
    for task in plan_tasks(conversations):
        d = task["data"]
        for control in taxonomy.controls:
            rows.append((d["conversation_id"], d["turn_index"], d["rater_id"], control, rng.randint(1, 5)))
        rows.append((d["conversation_id"], d["turn_index"], d["rater_id"], taxonomy.expectation_key, rng.randint(1, 3)))
    return pd.DataFrame(rows, columns=["conversation_id", "turn_index", "rater_id", "dimension", "rating"])


def rating_form(tax, level: str, **extra) -> dict:
    form = {c: level for c in tax.controls}
    form.update({tax.expectation_key: tax.expectation_values[1], tax.comment_key: "fine", **extra})
    return form


def stored_rows(store: Store) -> list[dict]:
    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(submissions).order_by(submissions.c.key)).mappings()]


@contextmanager
def gunicorn_page(tmp_path, redis_url: str, **env: str):
    """(url, store, tokens, process): the rater page under gunicorn on a fresh store with two raters (2
    workers x 4 threads unless `env` says otherwise), stopped on leaving."""
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    store = Store(store_url)
    tokens = fill_queues(store)
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SENSE7_HOME": str(tmp_path / "home"),
           "SENSE7_STORE_URL": store_url, "SENSE7_REDIS_URL": redis_url,
           "SENSE7_RATER_PAGE_PORT": str(port), "SENSE7_RATER_PAGE_WORKERS": "2",
           "SENSE7_RATER_PAGE_THREADS": "4", "SENSE7_LS_URL": f"http://127.0.0.1:{free_port()}", **env}
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            return requests.get(f"{url}/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    proc = ManagedProcess("rater-page", tmp_path, up, startup_timeout=60)
    proc.start([str(VENV_BIN / "gunicorn"), "--config", str(REPO / "sense7" / "rater_page" / "gunicorn_conf.py"),
                "sense7.rater_page.wsgi:app_from_env()"], env, cwd=REPO)
    try:
        yield url, store, tokens, proc
    finally:
        proc.stop()


CHECK = InstructedItem("attention_check", "To show you are reading, choose 2 here.", 2)


TAXONOMY_WITH_CHECK = dataclasses.replace(load_taxonomy(), instructed_items=(CHECK,))


def fill_queues(store: Store) -> dict[str, str]:
    """Two raters (ha, hb), each with a questionnaire and ten turns (the second an attention check);
    returns rater -> link secret."""
    queue, book, tokens = RaterQueue(store), LinkBook(store), {}
    for n, rater in enumerate(["ha", "hb"]):
        items = [{"task_id": 100 * (n + 1), "kind": "profile", "position": -1, "conversation_id": None,
                  "turn_index": None, "data": {"rater_id": rater}, "prediction": None, "answer": None}]
        for t in range(10):
            data = {"history": [{"role": "user", "content": f"{rater}'s own words, turn {t}"}],
                    "turn": [{"role": "assistant", "content": f"a reply to {rater}, turn {t}"}]}
            if t == 1:
                data["instructed"] = CHECK.key
            items.append({"task_id": 100 * (n + 1) + t + 1, "kind": "rating", "position": t,
                          "conversation_id": f"c-{rater}", "turn_index": 2 * t + 1, "data": data,
                          "prediction": None, "answer": None})
        queue.replace(rater, items)
        tokens[rater] = book.issue(rater)
    return tokens
