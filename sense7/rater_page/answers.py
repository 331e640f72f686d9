"""The answers a rater posts: the rating and profile forms read against the taxonomy, a refused form echoed
back, and a submission kept in the outbox first ("saved" means durable in sense7's store) and then
delivered to Label Studio by the worker (sense7.tasks.delivery). Every number goes through the one strict
parser (sense7.rater_page.forms.form_number)."""

from __future__ import annotations

import logging
import time

from flask import request

from sense7.store.rater_page_tables import QueueItem
from sense7.rater_page.forms import form_number
from sense7.rater_page.services import page_services
from sense7.taxonomy import Taxonomy

log = logging.getLogger(__name__)

MAX_LEAD_TIME = 3600.0  # (s) longer than this is a tab left open, recorded as this


def form_answer(form, taxonomy: Taxonomy) -> tuple[dict, list[str]]:
    """The posted rating form -> ({"values", "expectation", "comment"}, problems)."""
    values, problems = {}, []
    for control in taxonomy.controls:
        level = form_number(form.get(control), 1, taxonomy.levels)
        if level is None:
            problems.append(control)
        else:
            values[control] = level
    expectation = form.get(taxonomy.expectation_key) or None
    if expectation not in taxonomy.expectation_values:
        problems.append(taxonomy.expectation_key)
        expectation = None
    comment = (form.get(taxonomy.comment_key) or "").strip()[:5000] or None
    return {"values": values, "expectation": expectation, "comment": comment}, problems


def profile_answer(form, taxonomy: Taxonomy) -> tuple[dict, list[str]]:
    traits, problems = {}, []
    for fld in taxonomy.profile_fields:
        raw = form.get(fld.key, "")
        if fld.type == "int":  # the form's own numbers go through the one strict parser first
            raw = form_number(raw, fld.min, fld.max)
            if raw is None:
                problems.append(fld.key)
                continue
        try:
            traits[fld.key] = fld.validate(raw)
        except ValueError:
            problems.append(fld.key)
    return {"traits": traits}, problems


def echoed_form(rater: str, item: QueueItem) -> tuple[int, float]:
    """(revision, rendered_at) of a refused form shown again: the posted ones when well-formed."""
    revision = form_number(request.form.get("revision"), 1, 10**9)
    rendered_at = form_number(request.form.get("rendered_at"), 0, time.time(), decimals=True)
    return (revision or page_services().outbox.revision(rater, item.task_id) + 1,
            time.time() if rendered_at is None else rendered_at)


def store_submission(rater: str, item: QueueItem, answer: dict, result: list[dict]) -> None:
    """Durably keep the submission as the next revision unless it equals the latest one (a double click,
    a resent form, eight racing posts: stored once; Outbox.add_next compares and sets), then ask for
    delivery. The page's time is a hidden field: one out of form is no lead time, never a NaN."""
    services = page_services()
    started = form_number(request.form.get("rendered_at"), 0, time.time(), decimals=True)
    lead_time = None if started is None else min(time.time() - started, MAX_LEAD_TIME)
    if services.outbox.add_next(rater, item.kind, item.task_id, result, answer, lead_time) is None:
        return
    if services.request_delivery:
        try:
            services.request_delivery()
        except Exception as exc:  # the worker's periodic delivery will pick it up
            log.warning("could not queue a delivery (%s); the periodic one will deliver it", type(exc).__name__)
