"""What a job needs to run (settings, Label Studio client, store, project ids), built once per process.

A Celery worker process keeps one `Runtime` for its life; tests and the CLI build their own. Nothing is
created at import time, so importing `tasks` never touches the network or the disk.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property

import httpx
from label_studio_sdk.core.api_error import ApiError

from sense7.settings import JobSettings, Settings
from sense7.taxonomy import Taxonomy, study_taxonomy


class LabelStudioUnavailable(RuntimeError):
    """Label Studio did not answer, or answered 5xx/429: worth retrying later."""


TRANSIENT_ERRORS = (LabelStudioUnavailable, httpx.TransportError, ConnectionError)
# The Celery options of every job that talks to Label Studio: retried when it is unavailable (backoff,
# retries and time limits come from the settings: celery_app.celery_config).
RETRY = {"autoretry_for": (LabelStudioUnavailable,), "retry_jitter": False}


def describe_error(exc: BaseException) -> str:
    """A loggable one-liner: an SDK ApiError's text carries response headers (session cookies), so
    only its status is kept."""
    if isinstance(exc, ApiError):
        return f"Label Studio answered HTTP {exc.status_code}"
    return f"{type(exc).__name__}: {exc}"


class LabelStudioError(RuntimeError):
    """Label Studio refused a request (4xx): retrying will not help."""


def as_retryable(exc: BaseException) -> BaseException:
    """The exception to raise: transient ones become LabelStudioUnavailable (retried with backoff), other
    SDK errors LabelStudioError (not retried); both without the SDK's header-laden message."""
    if transient(exc) and not isinstance(exc, LabelStudioUnavailable):
        return LabelStudioUnavailable(describe_error(exc))
    if isinstance(exc, ApiError):
        return LabelStudioError(describe_error(exc))
    return exc


def transient(exc: BaseException) -> bool:
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    return isinstance(exc, ApiError) and (exc.status_code or 0) in (429, 502, 503, 504, 500)


@dataclass
class Runtime:
    settings: Settings
    user_emails: dict = field(default_factory=dict)  # Label Studio user id -> email, shared by sync jobs
    # rater id -> their attribution account's user id, shared by delivery jobs (an account is made once and
    # keeps its id; without this every delivery job lists every Label Studio user first)
    rater_accounts: dict = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> "Runtime":
        return cls(Settings.from_env())

    @property
    def jobs(self) -> JobSettings:
        return self.settings.jobs

    @cached_property
    def taxonomy(self) -> Taxonomy:
        return study_taxonomy(self.settings)

    @cached_property
    def client(self):
        from sense7.labelstudio.client import connect

        return connect(self.settings)

    @cached_property
    def store(self):
        from sense7.store.database import Store

        return Store(self.settings.store_url)

    @cached_property
    def serving_model(self):
        """The ML backend's model; each job that uses it loads the registry's current version when it starts
        (HotModel.refresh in Preannotator.run and Sense7Model.import_predictor: no background thread here)."""
        from sense7.ml_backend.model import build_model

        return build_model(self.settings)

    @cached_property
    def project_ids(self) -> tuple[int, int]:
        """(rating project id, profile project id), created in Label Studio if missing."""
        from sense7.labelstudio.client import ensure_projects

        return ensure_projects(self.client, self.settings, self.taxonomy)

    @property
    def rating_project(self) -> int:
        return self.project_ids[0]

    @property
    def profile_project(self) -> int:
        return self.project_ids[1]


_lock = threading.Lock()
_current: Runtime | None = None


def current_runtime() -> Runtime:
    """The worker process's Runtime (built from the environment on first use)."""
    global _current
    with _lock:
        if _current is None:
            _current = Runtime.from_env()
        return _current


def reset_runtime(runtime: Runtime | None = None) -> None:
    """Replace the process's Runtime (tests; a worker after its environment changed)."""
    global _current
    with _lock:
        _current = runtime
