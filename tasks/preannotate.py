"""The pre-annotation job: `sense7.ml_backend.preannotate.Preannotator` as a Celery task, retried while
Label Studio is unavailable."""

from __future__ import annotations

from celery import shared_task
from sense7.tasks import names
from sense7.tasks.runtime import LabelStudioUnavailable, as_retryable, current_runtime

from sense7.ml_backend.preannotate import Preannotator
from sense7.store.study_design import StudyRecords


# Retry backoff, retries and time limits: celery_app.celery_config (from the settings).
@shared_task(name=names.PREANNOTATE, autoretry_for=(LabelStudioUnavailable,), retry_jitter=False)
def preannotate_task() -> dict:
    rt = current_runtime()
    try:
        model = rt.serving_model
        return Preannotator(rt.client, model, rt.rating_project, rt.jobs.preannotate_chunk,
                            StudyRecords(rt.store)).run().as_dict()
    except Exception as exc:
        retryable = as_retryable(exc)
        if retryable is exc:
            raise
        raise retryable from None  # the SDK error's text (headers, cookies) stays out of logs
