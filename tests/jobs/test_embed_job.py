"""The embed job (sense7.tasks.embedding) on a real worker and Redis: conversations that entered the store get
their texts' vectors for the served version's encoder, and the job run again computes nothing."""

from __future__ import annotations

import os

from sense7.data.items import encoder_texts
from sense7.model.bundle import train_bundle
from sense7.model.registry import ModelRegistry
from sense7.model.static_embeddings import StaticEmbeddingEncoder
from sense7.model.vector_cache import encoder_key
from sense7.settings import Settings
from sense7.store.database import Store
from sense7.store.text_vectors import TextVectorRows
from sense7.synthetic.synth import generate
from sense7.tasks import names
from sense7.tasks.celery_app import configure
from sense7.tasks.embedding import request_embedding
from sense7.taxonomy import load_taxonomy
from tests.support.stack import JobStack
from tests.support.tiny_bert import tiny_model


def test_the_embed_job_fills_the_text_vectors_of_conversations_that_enter(tmp_path, redis_server):
    tax = load_taxonomy()
    study = generate(12, 4, seed=5, taxonomy=tax)
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENSE7_", "CELERY_"))}
    env.update({"SENSE7_HOME": str(tmp_path / "home"), "SENSE7_STORE_URL": store_url,
                "SENSE7_MODEL_DIR": str(tmp_path / "models"), "SENSE7_REDIS_URL": redis_server.url,
                "PYTHONUNBUFFERED": "1"})
    settings = Settings.from_env(env)
    store = Store(store_url)
    registry = ModelRegistry.from_settings(settings, store)
    encoder = StaticEmbeddingEncoder(model_path=str(tiny_model(tmp_path / "tiny")), cache_dir=str(tmp_path / "tables"),
                                     dimensions=4)
    registry.add(train_bundle(study.rating_data(), "v1", tax, personalized_params={"text_encoder": encoder}), "v1")
    registry.promote("v1")
    entering = study.conversations[:5]
    store.upsert_conversations(entering)  # what sense7.labelstudio.importer does before the job is queued
    wanted = {t for c in entering for t in encoder_texts([{"role": m.role, "content": m.content} for m in c.messages])}
    rows = TextVectorRows(store.engine)
    assert rows.count() == 0

    configure(settings, redis_server.url)
    ids = [c.conversation_id for c in entering]
    assert request_embedding(settings, store, ids) == "queued"
    stack = JobStack(env, tmp_path, redis_server)
    try:
        stack.start_worker()
        # The same job again, queued behind the first on the one worker process: everything is there already.
        again = stack.run(names.EMBED_TEXTS, timeout=300, conversation_ids=ids)
    finally:
        stack.close()
    key = encoder_key(encoder.fit([]))
    assert rows.count(key) == len(wanted) == rows.count()
    assert again["encoders"] == {key: {"texts": len(wanted), "embedded": 0, "seconds": again["encoders"][key]["seconds"]}}
