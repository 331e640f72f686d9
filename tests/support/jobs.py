"""Test data for the jobs tests: raters, conversations with a learnable signal, Label Studio users and
annotations posted on their behalf."""

from __future__ import annotations

import time

import numpy as np
from sqlalchemy import select

from sense7.labelstudio import protocol
from sense7.labelstudio.importer import import_conversations
from sense7.model.bundle import train_bundle
from sense7.model.registry import ModelRegistry
from sense7.readers.formats import read_conversations, read_raters, read_ratings
from sense7.retraining import holdout_conversations
from sense7.store.database import Store
from sense7.store.tables import annotations as annotations_table
from sense7.synthetic import synth, toy_study
from sense7.synthetic.toy_study import COLD, WARM, make_conversations  # noqa: F401  (the tests' names)
from sense7.taxonomy import load_taxonomy


def make_raters(n: int = 3, prefix: str = "r", domain: str = "raters.test") -> list[dict]:
    return toy_study.make_raters(n, load_taxonomy(), prefix, domain)


def serve_synthetic_model(rt, version: str = "v1") -> None:
    """A model trained on a small synthetic study, added to `rt`'s registry as `version` and promoted."""
    registry = ModelRegistry.from_settings(rt.settings, rt.store)
    registry.add(train_bundle(synth.generate(30, 6, seed=2, taxonomy=rt.taxonomy).rating_data(), version,
                              rt.taxonomy), version)
    registry.promote(version)


def rating_result(turn_text: str, bias: int = 0) -> list[dict]:
    """A full annotation result: warm turns get high ratings, cold ones low, shifted by the rater's bias."""
    tax = load_taxonomy()
    level = toy_study.turn_level(turn_text, bias)
    return protocol.rating_result({c: level for c in tax.controls}, tax, "yes" if level >= 3 else "no")


def ensure_users(client, raters: list[dict]) -> dict[str, int]:
    """Label Studio users for the raters (by email); returns rater_id -> user id."""
    existing = {(u.email or "").lower(): u.id for u in client.users.list()}
    ids = {}
    for r in raters:
        email = r["email"].lower()
        if email not in existing:
            user = client.users.create(username=email, email=email, password="not-used-3f9a1c2e")
            existing[email] = user.id
        ids[r["rater_id"]] = existing[email]
    return ids


def project_tasks(client, project_id: int) -> list:
    return list(client.tasks.list(project=project_id, include="id,data,predictions_model_versions", page_size=1000))


def annotate(client, task, user_id: int, bias: int = 0, store=None, result: list[dict] | None = None,
             kind: str = "rating", lead_time: float | None = None):
    """An annotation of `task` written as `user_id`. With `store`: the legitimate path, as the rater page
    and its delivery job write it (a submission of the task's rater in the outbox, with the page's
    `lead_time`, then written to Label Studio as their account and marked delivered), so the sync counts it
    as the rater's. Without: written in Label Studio directly, which the sync never counts as a rater's
    (quarantined or held)."""
    result = result if result is not None else rating_result(task.data["turn"][0]["content"], bias)
    if store is None:
        return client.annotations.create(task.id, result=result, completed_by=user_id)
    from sense7.store.rater_page_tables import Outbox
    from sense7.labelstudio.rater_accounts import write_annotation

    outbox, rater = Outbox(store), task.data["rater_id"]
    revision = outbox.add_next(rater, kind, task.id, result, {"result": result}, lead_time)
    revision = revision or outbox.revision(rater, task.id)
    made = write_annotation(client, task.id, user_id, result, lead_time, known=outbox.annotation_of(rater, task.id))
    outbox.mark_delivered(rater, task.id, revision, made)
    return client.annotations.get(made)


def wait_for(condition, timeout: float = 120.0, interval: float = 0.25, what: str = "condition"):
    """Poll until condition() is truthy; return its value. Fails the test (not a timing assertion: the
    timeout is only how long we are willing to wait for something that must happen)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last value: {last!r})")


class TcpProxy:
    """A plain TCP forwarder 127.0.0.1:port -> target, started and stopped by the test: while it is down,
    whoever uses `port` sees exactly what an unreachable server looks like (connection refused)."""

    def __init__(self, port: int, target_host: str, target_port: int):
        self.port, self.target = port, (target_host, target_port)
        self._server = None

    def start(self) -> "TcpProxy":
        import socketserver
        import threading

        target = self.target

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                import socket

                upstream = socket.create_connection(target)

                def pump(src, dst):
                    try:
                        while data := src.recv(65536):
                            dst.sendall(data)
                    except OSError:
                        pass
                    finally:
                        for s in (src, dst):
                            try:
                                s.shutdown(socket.SHUT_RDWR)
                            except OSError:
                                pass

                t = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
                t.start()
                pump(self.request, upstream)
                t.join(timeout=30)
                upstream.close()

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def seed(stack, prefix="r"):
    """Raters in the store, their conversations imported as tasks, Label Studio users for them."""
    rt = stack.runtime()
    raters = make_raters(3, prefix=prefix)
    rt.store.upsert_raters(raters)
    convs = make_conversations([r["rater_id"] for r in raters], prefix=prefix)
    import_conversations(rt.client, rt.rating_project, convs, rt.store, taxonomy=rt.taxonomy)
    users = ensure_users(rt.client, raters)
    return rt, raters, users


def stored_raters(store) -> dict[int, str]:
    with store.engine.connect() as conn:
        rows = conn.execute(select(annotations_table.c.annotation_id, annotations_table.c.rater_id)
                            .where(annotations_table.c.deleted.is_(False))).all()
    return dict(rows)


PG = "postgresql://postgres@127.0.0.1:5432"


def served_and_spoiled_store(tmp_path):
    """v1 trained on clean ratings and served; then every rating outside the held-out conversations is
    shuffled, so whatever is trained next learns noise while v1 still knows the held-out raters' ways."""
    tax = load_taxonomy()
    synth.write(synth.generate(60, 6, seed=5, taxonomy=tax), tmp_path / "data")
    store = Store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    store.upsert_raters(read_raters(tmp_path / "data" / "raters.csv", tax))
    store.upsert_conversations(read_conversations(tmp_path / "data" / "conversations.jsonl", taxonomy=tax))
    ratings = read_ratings(tmp_path / "data" / "ratings.csv", tax)
    store.import_ratings(ratings)
    registry = ModelRegistry(tmp_path / "models", store)
    registry.add(train_bundle(store.rating_data(tax), "v1", tax), "v1")
    registry.promote("v1")
    held = holdout_conversations(ratings["conversation_id"])
    spoiled = ratings.copy()
    outside = ~spoiled["conversation_id"].isin(held)
    spoiled.loc[outside, "rating"] = np.random.default_rng(0).permutation(spoiled.loc[outside, "rating"].to_numpy())
    store.import_ratings(spoiled)
    return store, registry, tax
