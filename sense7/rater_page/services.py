"""What the rater page's views reach through the app: one `PageServices` per app, kept in
`app.extensions` (`page_services()` inside a request), so that views are plain module-level functions and
`create_app` only assembles. Also the page's one notion of who is asking (`current_rater`, `client_address`)
and the per-address counter of failed link openings (`LinkGuesses`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from flask import abort, current_app, request, session
from limits import parse as parse_limit
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from sense7.crowd.participants import Studies, rater_page_admits
from sense7.crowd.prolific import ProlificClient
from sense7.privacy.participation import ConversationChoices
from sense7.model.registry import ModelRegistry
from sense7.store.database import Store
from sense7.store.rater_page_tables import InstructedAnswers, LinkBook, Outbox, RaterQueue
from sense7.rater_page.live_prefills import LivePrefills
from sense7.settings import Settings
from sense7.taxonomy import Taxonomy

log = logging.getLogger(__name__)

EXTENSION = "sense7_rater_page"  # the key of PageServices in app.extensions


class LinkGuesses:
    """Failed link openings per client address in a moving window (Redis, so that every worker counts
    them). Only failures are counted and only failures are refused: a rater's valid link always opens."""

    NAMESPACE = "sense7-link-guesses"

    def __init__(self, storage_uri: str, rate: str, namespace: str = NAMESPACE):
        self.limit, self.namespace = parse_limit(rate), namespace
        self.window = MovingWindowRateLimiter(storage_from_string(storage_uri))

    def fail(self, address: str) -> bool:
        """Count one failed opening from `address`; False when it is over the limit (answer 429)."""
        try:
            return self.window.hit(self.limit, self.namespace, address)
        except Exception as exc:  # Redis down: a 256-bit secret is not guessed in the meantime
            log.warning("link-guess counter unavailable (%s)", type(exc).__name__)
            return True


@dataclass(frozen=True)
class PageServices:
    """Everything the page's views use, built once per app (`for_settings`).

    refresh_queue(rater_id) -> bool: copies the rater's tasks from Label Studio into the store (False when
    Label Studio cannot be reached: the copy already there is used). request_delivery(): asks the worker to
    deliver the outbox (a submission is durable before it is called; failures are only logged).
    request_prepare(study, rater): asks the worker for a crowd participant's tasks.
    link_guesses counts failed link openings and failed resume codes; crowd_entries new crowd entries."""

    settings: Settings
    taxonomy: Taxonomy
    store: Store
    links: LinkBook
    queue: RaterQueue
    outbox: Outbox
    instructed_answers: InstructedAnswers
    choices: ConversationChoices
    live_prefills: LivePrefills
    studies: Studies
    prolific: ProlificClient | None
    link_guesses: LinkGuesses
    crowd_entries: LinkGuesses
    refresh_queue: Callable[[str], bool] | None = None
    request_delivery: Callable[[], object] | None = None
    request_prepare: Callable[[str, str], object] | None = None

    @classmethod
    def for_settings(cls, settings: Settings, taxonomy: Taxonomy, store: Store, limiter_storage: str, *,
                     refresh_queue=None, request_delivery=None, request_prepare=None) -> "PageServices":
        attempts = settings.rater_page.link_attempts
        return cls(settings=settings, taxonomy=taxonomy, store=store, links=LinkBook(store),
                   queue=RaterQueue(store), outbox=Outbox(store), instructed_answers=InstructedAnswers(store),
                   choices=ConversationChoices(store),
                   live_prefills=LivePrefills(ModelRegistry(settings.model_dir, store), store, taxonomy,
                                              text_vector_budget=settings.text_vector_budget),  # this rater's answers so far
                   studies=Studies(store), prolific=ProlificClient.from_settings(settings),
                   link_guesses=LinkGuesses(limiter_storage, attempts),
                   crowd_entries=LinkGuesses(limiter_storage, attempts, "sense7-crowd-entries"),
                   refresh_queue=refresh_queue, request_delivery=request_delivery, request_prepare=request_prepare)


def page_services() -> PageServices:
    """The services of the app answering this request."""
    return current_app.extensions[EXTENSION]


def client_address() -> str:
    """The client's address: X-Forwarded-For only through the proxies SENSE7_TRUSTED_PROXIES names."""
    proxies = page_services().settings.rater_page.trusted_proxies
    return proxies.client(request.remote_addr, request.headers.get("X-Forwarded-For"))


def current_rater() -> str:
    """The rater of this session's link, or a bare 404 (no session, tampered, revoked, unknown; and a crowd
    participant who has not passed the check or has left: their link is not issued before the check nor
    kept after, and a link that still exists answers nothing either)."""
    services = page_services()
    wanted = session.get("link")
    rater = services.links.rater_for_hash(wanted) if isinstance(wanted, str) else None
    if rater is None or not rater_page_admits(services.store, rater):
        abort(404)
    return rater
