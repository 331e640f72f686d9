"""Settings from the environment, with defaults that work on a fresh machine.

Every process (CLI, Celery worker and beat, the ML backend's gunicorn and its workers) builds one
`Settings` with `Settings.from_env()`; nothing else reads os.environ, so a test can run a whole stack
against its own directory by setting SENSE7_HOME. Reading settings is explicit: importing a module never
does it (from_env may create this home's secret files, so it runs when a process starts, not on import).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

# Label Studio may call (ML backend, webhooks) this one loopback address and no other local one: the
# backend listens here, and Label Studio's SSRF protection stays on for everything else (sense7.labelstudio.label_studio_process).
BACKEND_HOST = "127.0.0.2"
RATING_PROJECT_TITLE = "SENSE-7 empathy ratings"
PROFILE_PROJECT_TITLE = "SENSE-7 rater profile"


class SettingsError(ValueError):
    """A setting from the environment that cannot be used: the message names the variable (the CLI prints
    it as one line; a process refuses to start)."""


def _number_from_env(env, name: str, default, parse):
    """The environment variable `name` read by `parse` (int, float); unset or empty: `default`; no such number:
    None (the caller's error names what it expected)."""
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        return parse(raw)
    except ValueError:
        return None


def _count_from_env(env, variable: str, default: int, minimum: int) -> int:
    """A whole number >= `minimum` from the environment; unset or empty keeps `default`."""
    value = _number_from_env(env, variable, default, int)
    if value is None:
        raise SettingsError(f"{variable}={env.get(variable)!r}: expected an integer")
    if value < minimum:
        raise SettingsError(f"{variable}={env.get(variable)!r}: must be at least {minimum}")
    return value


def _niceness_from_env(env, variable: str) -> int:
    """A process priority from the environment: 0 (as the others, the default) to 19 (the lowest)."""
    value = _count_from_env(env, variable, 0, minimum=0)
    if value > 19:
        raise SettingsError(f"{variable}={env.get(variable)!r}: a niceness is 0 to 19")
    return value


def _positive_seconds(env, name: str, default: float) -> float:
    """A duration in seconds above 0 from the environment variable `name` (unset or empty: `default`)."""
    seconds = _number_from_env(env, name, default, float)
    if seconds is None or not seconds > 0 or seconds == float("inf"):
        raise SettingsError(f"environment variable {name}: expected a number of seconds above 0, "
                            f"got {env.get(name)!r}")
    return seconds


def _budget_seconds(env, name: str, default: float) -> float:
    """A time budget in seconds, 0 included (0: never wait), from the environment variable `name`."""
    seconds = _number_from_env(env, name, default, float)
    if seconds is None or not 0 <= seconds < float("inf"):
        raise SettingsError(f"environment variable {name}: expected a number of seconds, 0 or more, "
                            f"got {env.get(name)!r}")
    return seconds


def _numbers_from_env(cls, env, prefix: str) -> dict:
    """Numeric fields of a settings dataclass from PREFIX + FIELD_NAME (upper case); unset keeps defaults."""
    values = {}
    for fld in fields(cls):
        if fld.type not in ("int", "float"):
            continue
        raw = env.get(f"{prefix}{fld.name.upper()}")
        if raw in (None, ""):
            continue
        kind = float if fld.type == "float" else int
        try:
            values[fld.name] = kind(raw)
        except ValueError:
            raise SettingsError(f"environment variable {prefix}{fld.name.upper()}: expected a number, got {raw!r}") from None
    return values


@dataclass(frozen=True)
class JobSettings:
    """The Celery jobs' knobs; each is read from SENSE7_<NAME> (for example SENSE7_RETRAIN_EVERY)."""

    sync_interval: float = 300.0          # seconds between reconciliations (beat)
    deliver_interval: float = 30.0        # seconds between catch-up deliveries of rater-page submissions (beat)
    rater_queue_interval: float = 300.0   # seconds between copies of raters' queues from Label Studio (beat)
    retrain_interval: float = 86400.0     # seconds between scheduled retrains
    retrain_every: int = 200              # new ratings that trigger a retrain (0 = off); grows to 10% of the
                                          # served version's training items (tasks/cadence.py)
    retrain_min_interval: float = 300.0   # (s) a triggered retrain waits this long after the previous one
    keep_versions: int = 5                # model versions kept on disk
    retry_backoff: int = 2                # first retry delay (s), doubled each time
    retry_backoff_max: int = 300
    max_retries: int = 8
    retrain_soft_limit: int = 1800        # (s); hard limit is +120 s
    sync_soft_limit: int = 600            # (s); hard limit is +60 s
    preannotate_chunk: int = 5000         # predictions per import request (500: 126 tasks/s at 8,700 tasks, 5000: 620)
    preannotate_after_promote: int = 1    # 1 = push predictions of a new version
    retrain_lock_ttl: float = 120.0       # (s): a dead worker's lock expires after this
    visibility_timeout: int = 0           # (s): the unacked job of a vanished worker is delivered again
                                          # after this; 0 (default): sized to the longest job
                                          # (redelivery_timeout)

    @classmethod
    def from_env(cls, env: dict | None = None) -> "JobSettings":
        return cls(**_numbers_from_env(cls, os.environ if env is None else env, "SENSE7_"))

    @property
    def sync_time_limit(self) -> int:
        """Hard limit (s) of the sync, delivery and pre-annotation jobs: the pool process is killed then."""
        return self.sync_soft_limit + 60

    @property
    def retrain_time_limit(self) -> int:
        """Hard limit (s) of a retrain."""
        return self.retrain_soft_limit + 120

    @property
    def redelivery_timeout(self) -> int:
        """(s) after which the broker hands a vanished worker's unacknowledged job to another worker: the
        longest job's hard limit plus a minute (a running job is never handed out twice), unless
        SENSE7_VISIBILITY_TIMEOUT says otherwise. Delivery and sync do not wait for it (tasks/recovery.py)."""
        return self.visibility_timeout or max(self.sync_time_limit, self.retrain_time_limit) + 60


@dataclass(frozen=True)
class BackendServing:
    """How gunicorn serves the ML backend (ml_backend/gunicorn_conf.py reads these, nothing else)."""

    bind: str = f"{BACKEND_HOST}:9090"    # SENSE7_BACKEND_BIND (default: SENSE7_BACKEND_HOST:SENSE7_BACKEND_PORT)
    workers: int = 2                      # SENSE7_BACKEND_WORKERS
    threads: int = 1                      # SENSE7_BACKEND_THREADS (>1: gthread workers)
    keepalive: int = 0                    # SENSE7_BACKEND_KEEPALIVE (s; 0: close after each response)
    read_timeout: float = 5.0             # SENSE7_BACKEND_READ_TIMEOUT (s): headers, then each body read
    pidfile: str | None = None            # SENSE7_BACKEND_PIDFILE
    access_log: bool = False              # SENSE7_BACKEND_ACCESS_LOG
    log_level: str = "info"               # SENSE7_BACKEND_LOG_LEVEL
    on_event: str | None = None           # SENSE7_BACKEND_ON_EVENT: "module:function" receiving webhooks

    @classmethod
    def from_env(cls, env: dict, host: str, port: int) -> "BackendServing":
        numbers = _numbers_from_env(cls, env, "SENSE7_BACKEND_")
        return cls(bind=env.get("SENSE7_BACKEND_BIND") or f"{host}:{port}",
                   pidfile=env.get("SENSE7_BACKEND_PIDFILE") or None,
                   access_log=bool(env.get("SENSE7_BACKEND_ACCESS_LOG")),
                   log_level=env.get("SENSE7_BACKEND_LOG_LEVEL") or "info",
                   on_event=env.get("SENSE7_BACKEND_ON_EVENT") or None, **numbers)


@dataclass(frozen=True)
class TrustedProxies:
    """Which reverse proxies in front of the rater page may say who the client is (X-Forwarded-For).

    SENSE7_TRUSTED_PROXIES: empty (the default: nobody, the connection's address is the client's), a number
    of hops (the last N proxies each appended the address they saw: the client is the Nth entry from the
    right), or proxy addresses / networks separated by commas (entries are taken from the right while the
    one that sent them is one of these)."""

    hops: int = 0
    networks: tuple = ()

    @classmethod
    def parse(cls, spec: str | None) -> "TrustedProxies":
        spec = (spec or "").strip()
        if not spec:
            return cls()
        if spec.isascii() and spec.isdigit():
            return cls(hops=int(spec))
        try:
            return cls(networks=tuple(ipaddress.ip_network(part.strip(), strict=False)
                                      for part in spec.split(",") if part.strip()))
        except ValueError:
            raise SettingsError(f"SENSE7_TRUSTED_PROXIES={spec!r}: expected a number of proxy hops or proxy addresses "
                             "separated by commas (e.g. 1, or 10.0.0.5, or 10.0.0.0/8)") from None

    def client(self, remote_addr: str | None, forwarded_for: str | None) -> str:
        """The client's address: the connection's, or what trusted proxies forwarded."""
        remote = remote_addr or ""
        entries = [e.strip() for e in (forwarded_for or "").split(",") if e.strip()]
        if self.hops:
            return entries[-self.hops] if len(entries) >= self.hops else remote

        def trusted(address: str) -> bool:
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                return False
            return any(ip in network for network in self.networks)

        current = remote
        while entries and self.networks and trusted(current):
            current = entries.pop()
        return current


@dataclass(frozen=True)
class RaterPage:
    """The rater page (sense7.rater_page): where it listens, the address its links carry, the study's
    finish (a completion code and/or a redirect, e.g. back to a crowd platform), and gunicorn's size."""

    host: str = "127.0.0.1"               # SENSE7_RATER_PAGE_HOST
    port: int = 8090                      # SENSE7_RATER_PAGE_PORT
    public_url: str = ""                  # SENSE7_RATER_PAGE_URL: the links' base (default http://host:port)
    completion_code: str = ""             # SENSE7_COMPLETION_CODE: shown on the finish page
    completion_url: str = ""              # SENSE7_COMPLETION_URL: the finish page's "continue" link
    workers: int = 2                      # SENSE7_RATER_PAGE_WORKERS
    threads: int = 8                      # SENSE7_RATER_PAGE_THREADS
    read_timeout: float = 5.0             # SENSE7_RATER_PAGE_READ_TIMEOUT (s): a request's headers, then each
                                          # body read and write (sense7.rater_page.bounded_worker)
    link_attempts: str = "30 per minute"  # SENSE7_RATER_PAGE_LINK_LIMIT: failed link openings per client address
    trusted_proxies: TrustedProxies = field(default_factory=TrustedProxies)  # SENSE7_TRUSTED_PROXIES

    @classmethod
    def from_env(cls, env: dict) -> "RaterPage":
        host = env.get("SENSE7_RATER_PAGE_HOST") or "127.0.0.1"
        port = int(env.get("SENSE7_RATER_PAGE_PORT") or 8090)
        return cls(host=host, port=port,
                   public_url=(env.get("SENSE7_RATER_PAGE_URL") or f"http://{_url_host(host)}:{port}").rstrip("/"),
                   completion_code=env.get("SENSE7_COMPLETION_CODE") or "",
                   completion_url=env.get("SENSE7_COMPLETION_URL") or "",
                   workers=int(env.get("SENSE7_RATER_PAGE_WORKERS") or 2),
                   threads=int(env.get("SENSE7_RATER_PAGE_THREADS") or 8),
                   read_timeout=_positive_seconds(env, "SENSE7_RATER_PAGE_READ_TIMEOUT", 5.0),
                   link_attempts=env.get("SENSE7_RATER_PAGE_LINK_LIMIT") or "30 per minute",
                   trusted_proxies=TrustedProxies.parse(env.get("SENSE7_TRUSTED_PROXIES")))


@dataclass(frozen=True)
class ProlificApi:
    """Prolific's API for crowd studies, optional (sense7.crowd.prolific): with a token, an entry needs a
    submission holding a place in the Prolific study, and beat frees the places of returned and timed-out
    submissions at once."""

    token: str = field(default="", repr=False)  # SENSE7_PROLIFIC_TOKEN: empty = the API is not used
    url: str = "https://api.prolific.com"       # SENSE7_PROLIFIC_API_URL (a stand-in's, in the tests)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "ProlificApi":
        url = (env.get("SENSE7_PROLIFIC_API_URL") or cls.url).rstrip("/")
        if not url.startswith(("https://", "http://")):
            raise SettingsError(f"SENSE7_PROLIFIC_API_URL={url!r}: expected an http(s) URL")
        return cls(token=(env.get("SENSE7_PROLIFIC_TOKEN") or "").strip(), url=url)


PREFILL_POLICIES = ("shown", "hidden", "randomized")
# Which level of the predicted distribution a pre-fill shows (sense7.model.decision): the median minimizes
# the expected distance to the rater's rating, the mode maximizes exact hits (docs/BENCHMARKS.md, "Decision
# rule", measures both; the default follows that evidence).
PREFILL_RULES = ("median", "mode")
DEFAULT_PREFILL_RULE = "median"


@dataclass(frozen=True)
class StudyDesign:
    """How a study pre-fills its rating forms and checks its raters (sense7.store.study_design draws it at import).

    prefill: `randomized` (default for new studies: each (rater, task) draws shown or hidden, so anchoring
    can be measured), `shown` (every task pre-filled with the model's guess) or `hidden` (predictions are
    recorded, never shown). shown_share: the randomized share of shown tasks. seed: the draws' seed (default:
    drawn once at the study's first import and kept in the store). repeat_share: the share of each rater's
    turns imported a second time, at the end of their queue, for test-retest agreement (0 = none).
    prefill_rule: which level of the predicted distribution the ML backend pre-fills and records, `median`
    or `mode` (PREFILL_RULES)."""

    prefill: str = "randomized"           # SENSE7_PREFILL
    shown_share: float = 0.5              # SENSE7_PREFILL_SHOWN_SHARE
    seed: str | None = None               # SENSE7_PREFILL_SEED
    repeat_share: float = 0.05            # SENSE7_REPEAT_SHARE
    prefill_rule: str = DEFAULT_PREFILL_RULE  # SENSE7_PREFILL_RULE

    def __post_init__(self):
        if self.prefill not in PREFILL_POLICIES:
            raise SettingsError(f"SENSE7_PREFILL: expected one of {', '.join(PREFILL_POLICIES)}, got {self.prefill!r}")
        if self.prefill_rule not in PREFILL_RULES:
            raise SettingsError(f"SENSE7_PREFILL_RULE: expected one of {', '.join(PREFILL_RULES)}, "
                             f"got {self.prefill_rule!r}")
        for name, value in (("SENSE7_PREFILL_SHOWN_SHARE", self.shown_share), ("SENSE7_REPEAT_SHARE", self.repeat_share)):
            if not 0.0 <= value <= 1.0:
                raise SettingsError(f"{name}: expected a share between 0 and 1, got {value}")

    @classmethod
    def from_env(cls, env: dict) -> "StudyDesign":
        def share(name: str, default: float) -> float:
            value = _number_from_env(env, name, default, float)
            if value is None:
                raise SettingsError(f"environment variable {name}: expected a number, got {env.get(name)!r}")
            return value

        return cls(prefill=(env.get("SENSE7_PREFILL") or "randomized").strip().lower(),
                   shown_share=share("SENSE7_PREFILL_SHOWN_SHARE", 0.5),
                   seed=env.get("SENSE7_PREFILL_SEED") or None,
                   repeat_share=share("SENSE7_REPEAT_SHARE", 0.05),
                   prefill_rule=(env.get("SENSE7_PREFILL_RULE") or DEFAULT_PREFILL_RULE).strip().lower())


# -- rater quality (sense7.research.quality checks it; the retrain job applies `training`) ------------------
ENV_PREFIX = "SENSE7_QUALITY_"
TRAINING_CHOICES = ("exclude", "keep")


def _problem(name: str, value) -> str | None:
    """Why `value` is no good for the policy field `name`, or None."""
    if name == "training":
        return None if value in TRAINING_CHOICES else f"must be one of {', '.join(TRAINING_CHOICES)}"
    if not math.isfinite(value) or value < 0:
        return "must be a finite number >= 0"
    if name in ("instructed_min_share", "straight_line_share") and value > 1:
        return "must be between 0 and 1"
    if name in ("straight_line_turns", "retest_min_pairs") and value < 1:
        return "must be at least 1"
    return None


@dataclass(frozen=True)
class QualityPolicy:
    """Thresholds of the quality checks and what training does with flagged raters."""

    min_median_seconds: float = 4.0     # a rater whose median time per task is below this is "too_fast"
    min_tasks: int = 5                  # no flag is raised on fewer rated tasks than this
    straight_line_turns: int = 6        # this many consecutive turns with one level for every control ...
    # ... covering at least this share of the rater's turns: honest raters hit the scale's floor for several
    # turns when an assistant keeps failing (the paper-scale demo: 5 of 107 honest raters had runs of 6-11
    # turns of 1s, at most 40% of their turns), a straight-liner clicks through most of the study.
    straight_line_share: float = 0.5
    retest_min_pairs: int = 2           # repeated turns needed before judging test-retest agreement
    retest_max_distance: float = 1.5    # mean |first - repeat| over controls and pairs above this: "inconsistent"
    instructed_min_share: float = 1.0   # share of instructed items answered as told below this: "failed_instructed"
    # What retraining does with flagged raters: "exclude" their ratings or "keep" them (e.g. to compare).
    # (Down-weighting is not offered: the rater models take no sample weights.)
    training: str = "exclude"

    def __post_init__(self):
        for fld in fields(self):
            problem = _problem(fld.name, getattr(self, fld.name))
            if problem:
                raise SettingsError(f"QualityPolicy.{fld.name}={getattr(self, fld.name)!r}: {problem}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> QualityPolicy:
        """The defaults, overridden by SENSE7_QUALITY_<FIELD> variables (e.g. SENSE7_QUALITY_TRAINING).
        An empty variable counts as unset. A bad value is a ValueError naming the variable, so a typo in
        a deployment's settings stops it instead of silently falling back to a default."""
        values = {}
        for fld in fields(cls):
            variable = ENV_PREFIX + fld.name.upper()
            raw = env.get(variable, "").strip()
            if not raw:
                continue
            kind = type(fld.default)
            try:
                value = raw.lower() if kind is str else kind(raw)
            except ValueError:
                expected = "an integer" if kind is int else "a number"
                raise SettingsError(f"{variable}={raw!r}: expected {expected}") from None
            problem = _problem(fld.name, value)
            if problem:
                raise SettingsError(f"{variable}={raw!r}: {problem}")
            values[fld.name] = value
        return cls(**values)


@dataclass(frozen=True)
class Settings:
    """Every setting of every process. Secrets not given in the environment are generated once per
    SENSE7_HOME (0600 files in secrets/). Label Studio binds SENSE7_LS_HOST (127.0.0.1); the ML backend
    binds SENSE7_BACKEND_HOST (127.0.0.2) with HTTP basic auth on unless SENSE7_BACKEND_AUTH=off."""

    home: Path
    ls_port: int
    ls_url: str
    ls_token: str
    ls_admin_email: str
    ls_admin_password: str
    store_url: str
    redis_url: str | None
    backend_port: int
    backend_url: str
    backend_user: str | None
    backend_password: str | None
    webhook_secret: str
    model_dir: Path
    ls_database_url: str | None = None  # PostgreSQL for Label Studio itself; None = SQLite in home
    ls_host: str = "127.0.0.1"          # the address Label Studio listens on (SENSE7_LS_HOST)
    # How Label Studio is served (SENSE7_LS_WORKERS, SENSE7_LS_THREADS): 0 workers = its own one-process
    # server (`label-studio start`); N >= 1 = its WSGI app under gunicorn with N worker processes of
    # SENSE7_LS_THREADS threads each, as a production deployment runs it (with PostgreSQL: docs/BENCHMARKS.md).
    ls_workers: int = 0
    ls_threads: int = 1
    # Label Studio's CPU priority (SENSE7_LS_NICE, 0-19): background work for the raters, run below the rater
    # pages when the CPU is contended (sense7.deployment.LABEL_STUDIO_NICE; docs/guides/deployment.md#cpu-priority).
    ls_nice: int = 0
    rating_project_title: str = RATING_PROJECT_TITLE
    profile_project_title: str = PROFILE_PROJECT_TITLE
    jobs: JobSettings = field(default_factory=JobSettings)
    serving: BackendServing = field(default_factory=BackendServing)
    rater_page: RaterPage = field(default_factory=RaterPage)
    study: StudyDesign = field(default_factory=StudyDesign)
    quality: QualityPolicy = field(default_factory=QualityPolicy)
    prolific: ProlificApi = field(default_factory=ProlificApi)
    taxonomy_path: Path | None = None  # the study's taxonomy YAML (SENSE7_TAXONOMY); None = the packaged one
    # What the retrain job fits beyond the defaults, as written (sense7.model.options.served_params parses them):
    model_alpha: str | None = None        # SENSE7_MODEL_ALPHA: the text penalty, a number above 0 or cv
    model_rater_ridge: str | None = None  # SENSE7_MODEL_RATER_RIDGE: each known rater's own content weights
    model_text_encoder: str | None = None  # SENSE7_MODEL_TEXT_ENCODER: static, minilm or ngrams (the default)
    # How long one served request may spend embedding texts the text vectors' cache lacks (seconds): the texts
    # left are served by the model's lexical part and embedded by a later request or the embed job.
    text_vector_budget: float = 0.5       # SENSE7_TEXT_VECTOR_BUDGET
    # The secrets given in the environment rather than kept in this home (`secret`): SENSE7_RATER_PAGE_SECRET,
    # SENSE7_CROWD_SECRET_<STUDY>, each also as <variable>_FILE. Never shown (repr=False).
    secret_env: Mapping = field(default_factory=dict, repr=False, compare=False)

    def secret(self, name: str, variable: str) -> str:
        """A secret every host of a deployment must share: from the settings when given (`variable`: the value;
        `variable`_FILE: a file only its owner may read), else this home's own file (`local_secret(home, name)`,
        made once). When both exist, the settings win."""
        return secret_from_env(self.secret_env, variable) or local_secret(self.home, name)

    @classmethod
    def from_env(cls, env: dict | None = None) -> "Settings":
        env = os.environ if env is None else env
        home = Path(env.get("SENSE7_HOME", Path.cwd() / ".sense7")).resolve()
        ls_port = int(env.get("SENSE7_LS_PORT", "8080"))
        backend_port = int(env.get("SENSE7_BACKEND_PORT", "9090"))
        backend_host = env.get("SENSE7_BACKEND_HOST") or BACKEND_HOST
        ls_host = env.get("SENSE7_LS_HOST") or "127.0.0.1"
        auth = (env.get("SENSE7_BACKEND_AUTH") or "on").lower() not in ("off", "0", "false", "no")
        return cls(
            home=home,
            ls_port=ls_port,
            ls_url=env.get("SENSE7_LS_URL", f"http://{_url_host(ls_host)}:{ls_port}").rstrip("/"),
            ls_token=env.get("SENSE7_LS_TOKEN") or local_secret(home, "ls_token"),
            ls_admin_email=env.get("SENSE7_LS_ADMIN_EMAIL", "admin@sense7.local"),
            ls_admin_password=env.get("SENSE7_LS_ADMIN_PASSWORD") or local_secret(home, "ls_password"),
            store_url=env.get("SENSE7_STORE_URL", f"sqlite:///{home / 'store.sqlite'}"),
            redis_url=env.get("SENSE7_REDIS_URL") or env.get("CELERY_BROKER_URL") or None,
            backend_port=backend_port,
            backend_url=env.get("SENSE7_BACKEND_URL", f"http://{backend_host}:{backend_port}").rstrip("/"),
            backend_user=(env.get("SENSE7_BACKEND_USER") or "sense7") if auth else None,
            backend_password=(env.get("SENSE7_BACKEND_PASSWORD") or local_secret(home, "backend_password"))
            if auth else None,
            webhook_secret=env.get("SENSE7_WEBHOOK_SECRET") or local_secret(home, "webhook_secret"),
            model_dir=Path(env.get("SENSE7_MODEL_DIR", home / "models")).resolve(),
            ls_database_url=env.get("SENSE7_LS_DATABASE_URL") or None,
            ls_host=ls_host,
            ls_workers=_count_from_env(env, "SENSE7_LS_WORKERS", 0, minimum=0),
            ls_threads=_count_from_env(env, "SENSE7_LS_THREADS", 1, minimum=1),
            ls_nice=_niceness_from_env(env, "SENSE7_LS_NICE"),
            rating_project_title=env.get("SENSE7_RATING_PROJECT_TITLE") or RATING_PROJECT_TITLE,
            profile_project_title=env.get("SENSE7_PROFILE_PROJECT_TITLE") or PROFILE_PROJECT_TITLE,
            taxonomy_path=taxonomy_path_from_env(env),
            jobs=JobSettings.from_env(env),
            serving=BackendServing.from_env(env, backend_host, backend_port),
            rater_page=RaterPage.from_env(env),
            study=StudyDesign.from_env(env),
            quality=QualityPolicy.from_env(env),
            prolific=ProlificApi.from_env(env),
            model_alpha=env.get("SENSE7_MODEL_ALPHA") or None,
            model_rater_ridge=env.get("SENSE7_MODEL_RATER_RIDGE") or None,
            model_text_encoder=env.get("SENSE7_MODEL_TEXT_ENCODER") or None,
            text_vector_budget=_budget_seconds(env, "SENSE7_TEXT_VECTOR_BUDGET", 0.5),
            secret_env={k: v for k, v in env.items() if k.startswith(SHARED_SECRET_PREFIXES)},
        )


def _url_host(host: str) -> str:
    """A host as it goes into a URL: 0.0.0.0 (listen everywhere) is reached through 127.0.0.1."""
    return "127.0.0.1" if host in ("0.0.0.0", "") else (f"[{host}]" if ":" in host else host)


def secure_home(home: Path) -> Path:
    """SENSE7_HOME as a 0700 folder: it holds secrets, traits, conversations, databases and logs."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
    return home


def taxonomy_path_from_env(env: dict | None = None) -> Path | None:
    """SENSE7_TAXONOMY (the study's taxonomy YAML) without building a whole Settings (which creates the
    local secrets): for commands such as `sense7 evaluate` that need nothing else. None = packaged file."""
    env = os.environ if env is None else env
    value = env.get("SENSE7_TAXONOMY")
    return Path(value).expanduser().resolve() if value else None


RATER_PAGE_SECRET = "SENSE7_RATER_PAGE_SECRET"  # the rater page's session key: every instance of the page signs with it
CROWD_SECRET_PREFIX = "SENSE7_CROWD_SECRET_"     # + the study id: the key of a crowd study's pseudonymous ids
SHARED_SECRET_PREFIXES = (RATER_PAGE_SECRET, CROWD_SECRET_PREFIX)


def crowd_secret_variable(study_id: str) -> str:
    """SENSE7_CROWD_SECRET_<STUDY>: the study id upper-cased, every character but letters and digits as '_'."""
    return CROWD_SECRET_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", study_id).upper()


def secret_from_env(env: Mapping, variable: str) -> str | None:
    """`variable`'s value, else the content of the file `variable`_FILE names; None when neither is set.
    SettingsError (naming the variable and file) for an empty secret, a missing file or one that others may
    read (a secret file is 0600 or 0400: `chmod 600 FILE`)."""
    value = env.get(variable)
    if value is not None and value.strip():
        return value.strip()
    if value is not None:
        raise SettingsError(f"{variable} is set but empty: give the secret, or unset it")
    path = env.get(f"{variable}_FILE")
    if not path:
        return None
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise SettingsError(f"{variable}_FILE={path}: not a regular file")
        if mode & 0o077:
            raise SettingsError(f"{variable}_FILE={path}: the file is readable by others (mode "
                                f"{stat.S_IMODE(mode):04o}): a secret file must be 0600 (chmod 600 {path})")
        with open(path) as fh:
            secret = fh.read().strip()
    except OSError as exc:
        raise SettingsError(f"{variable}_FILE={path}: {exc.strerror or exc}") from None
    if not secret:
        raise SettingsError(f"{variable}_FILE={path}: the file is empty")
    return secret


def local_secret(home: Path, name: str) -> str:
    """A random secret generated once per SENSE7_HOME and kept in a 0600 file, never printed or logged."""
    path = home / "secrets" / name
    if path.exists():
        return path.read_text().strip()
    secure_home(home)
    path.parent.mkdir(exist_ok=True, mode=0o700)
    value = secrets.token_hex(20)
    # O_EXCL: two processes starting at once agree on the first value written.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(value)
    return value

