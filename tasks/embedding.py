"""The embed job (`sense7.embed_texts`): conversations' texts embedded once into the store's text vectors, when
they enter the study (issue 39 item 1, "embed once"). The work is sense7.model.vector_cache.

Queued where conversations enter: `sense7 import` (files and assistants' data exports), the demo, and a crowd
study's preparation of a participant's tasks (`request_embedding`, after `sense7.labelstudio.importer` stored
them). It embeds for each text encoder whose vectors the study's processes read (the served version's and
SENSE7_MODEL_TEXT_ENCODER's: `encoders_to_embed`); with n-grams only it does nothing. Idempotent: a text with a
vector is only looked up, so a retry (or a second import of the same conversations) computes nothing again.
"""

from __future__ import annotations

import logging

from celery import shared_task

from sense7.model.registry import ModelRegistry
from sense7.model.vector_cache import embed_stored_conversations, encoders_to_embed
from sense7.tasks import names
from sense7.tasks.broker import enqueue
from sense7.tasks.runtime import current_runtime

log = logging.getLogger("sense7.tasks")


# Retries and time limits: celery_app.celery_config (from the settings).
@shared_task(name=names.EMBED_TEXTS)
def embed_texts_task(conversation_ids: list | None = None) -> dict:
    rt = current_runtime()
    encoders = encoders_to_embed(rt.settings, ModelRegistry.from_settings(rt.settings, rt.store))
    if not encoders:
        return {"encoders": {}, "reason": "n-grams only: nothing to embed"}
    done = embed_stored_conversations(rt.store, encoders, conversation_ids)
    return {"encoders": done}


def embedding_wanted(settings, store) -> bool:
    """Whether any text encoder's vectors are read in this study (a quick check before queueing)."""
    if getattr(settings, "model_text_encoder", None) not in (None, "", "ngrams"):
        return True
    try:
        registry = ModelRegistry.from_settings(settings, store)
        return bool(registry.current()) and bool(encoders_to_embed(settings, registry))
    except Exception:  # (a registry that cannot load its version: the backend reports it, not the import)
        return False


def request_embedding(settings, store, conversation_ids: list[str]) -> str:
    """Queue the embed job for conversations that just entered: "queued", "not needed" (n-grams only), or
    "unavailable" (no Redis now: their texts are embedded when first read, within the request's budget)."""
    if not conversation_ids or not embedding_wanted(settings, store):
        return "not needed"
    try:
        enqueue(names.EMBED_TEXTS, kwargs={"conversation_ids": sorted(set(map(str, conversation_ids)))})
    except Exception as exc:
        log.warning("embed job not queued (%s): texts are embedded when first read", type(exc).__name__)
        return "unavailable"
    return "queued"
