"""Erasing withdrawn raters (`sense7 raters withdraw ID`, `sense7 raters erase --confirm`).

For each withdrawal asked for: Label Studio's side first (their tasks with the annotations and predictions on
them, their attribution account: sense7.labelstudio.erasure), then every row of theirs in the store in one
transaction that also turns the withdrawal into a receipt without personal data
(sense7.privacy.participation.erase_rater_rows). The model versions trained on their ratings are named on the
receipt; a retrain is queued (the ordinary retrain job), which promotes its new version whatever the gate
says while the served one is such a version, and then removes them (sense7.retraining).

Interrupted anywhere, running it again finishes: the withdrawal keeps naming the rater until the store's
transaction, and each Label Studio step deletes only what is still there.
"""

from __future__ import annotations

import logging

from sense7.labelstudio.erasure import erase_rater, rater_users
from sense7.labelstudio.rater_accounts import account_email
from sense7.model.registry import ModelRegistry, RegistryError
from sense7.privacy.participation import Withdrawals, erase_rater_rows, staff_user
from sense7.tasks import names
from sense7.tasks.runtime import Runtime

log = logging.getLogger(__name__)


def versions_trained_on(registry: ModelRegistry, rater_id: str) -> list[str]:
    """Versions whose training included the rater's ratings (a version that cannot be read counts: it
    cannot be shown not to)."""
    found = []
    for version in registry.list_versions():
        try:
            bundle = registry.load(version.name)
        except (RegistryError, OSError, ValueError):
            found.append(version.name)
            continue
        if rater_id in set(getattr(bundle, "known_raters", ()) or ()):
            found.append(version.name)
    return found


def erase_withdrawn(rt: Runtime, rater_ids=None, confirmed_by: str | None = None, retrain: bool = True,
                    on_erased=None) -> list[dict]:
    """Erase every pending withdrawal (or those of `rater_ids`); returns one receipt dict per rater erased.
    `on_erased(receipt)`: called after each (the CLI's progress)."""
    withdrawals = Withdrawals(rt.store)
    pending = [w for w in withdrawals.pending() if rater_ids is None or w["rater_id"] in set(rater_ids)]
    registry = ModelRegistry.from_settings(rt.settings, rt.store)
    projects = [p for p in (rt.rating_project, rt.profile_project) if p]
    done = []
    for row in pending:
        rater_id = row["rater_id"]
        emails = {rt.store.rater_emails().get(rater_id), account_email(rater_id)} - {None}
        users = rater_users(rt.client, emails)  # listed once: the store's erasure needs the account id too
        accounts = [u.id for u in users]
        counts = erase_rater(rt.client, projects, rater_id, users)
        versions = versions_trained_on(registry, rater_id)
        receipt = erase_rater_rows(rt.store, rater_id, account_id=accounts[0] if accounts else None,
                                   confirmed_by=confirmed_by or staff_user(), label_studio=counts,
                                   model_versions=versions)
        receipt["model_versions"] = versions
        done.append(receipt)
        if on_erased:
            on_erased(receipt)
    if done and retrain:
        note = queue_retrain()
        for receipt in done:
            withdrawals.set_retrain(receipt["receipt"], note)
            receipt["retrain"] = note
    return done


def queue_retrain() -> str:
    """Queue the retrain job; the note the receipt keeps (the job's id, or why it was not queued)."""
    from sense7.tasks.celery_app import get_app

    try:
        result = get_app().send_task(names.RETRAIN, kwargs={"reason": "withdrawal"}, retry=False)
    except Exception as exc:  # the broker is down: the next retrain (beat, or `sense7 retrain`) does it
        log.warning("retrain not queued (%s)", type(exc).__name__)
        return f"not queued ({type(exc).__name__}): the next retrain removes the versions"
    return f"queued (job {result.id})"
