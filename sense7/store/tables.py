"""The store's schema: every table of sense7's own store (SQLAlchemy Core), and what `crowd_withdrawn` keeps of
an erased participant. The code that owns a table's rows lives beside it in this package (`database.Store`,
`study_design`, `rater_page_tables`, `rater_answers`) or with its use (`sense7.crowd`, `sense7.privacy.participation`).
"""

from __future__ import annotations

import hashlib

from sqlalchemy import (JSON, BigInteger, Boolean, Column, DateTime, Float, Integer, LargeBinary, MetaData, String, Table,
                        Text, UniqueConstraint)

metadata = MetaData()


# The columns many tables share, written once: an id is as wide in every table that holds it.
def rater_id_column(**options) -> Column:
    """A rater's id: a Label Studio-safe id or a crowd participant's pseudonym."""
    return Column("rater_id", String(200), **options)


def conversation_id_column(**options) -> Column:
    """A conversation's id, as its import named it."""
    return Column("conversation_id", String(200), **options)


def study_id_column(**options) -> Column:
    """A crowd study's id (its study file's `study`)."""
    return Column("study_id", String(100), **options)


def timestamp_column(name: str, **options) -> Column:
    """A moment, time-zone aware (stored in UTC)."""
    return Column(name, DateTime(timezone=True), **options)


raters = Table(
    "raters", metadata,
    rater_id_column(primary_key=True),
    Column("email", String(320), nullable=True, unique=True),
    Column("traits", JSON, nullable=False),  # raw profile answers, keys = taxonomy profile fields
    timestamp_column("updated_at", nullable=False),
)

# Each rater's Label Studio attribution account (sense7.labelstudio.rater_accounts.ensure_accounts), kept so
# that finding it never lists every Label Studio user (a request that grows with the study: 0.45 s at 100 users).
# Indexed by account too: the sync reads an annotation's author (an account id) back to its rater.
rater_accounts = Table(
    "rater_accounts", metadata,
    rater_id_column(primary_key=True),
    Column("account_id", Integer, nullable=False, index=True),
    timestamp_column("updated_at", nullable=False),
)

conversations = Table(
    "conversations", metadata,
    conversation_id_column(primary_key=True),
    Column("messages", JSON, nullable=False),
)

contexts = Table(
    "contexts", metadata,
    conversation_id_column(primary_key=True),
    rater_id_column(primary_key=True),
    Column("context", JSON, nullable=False),
)

annotations = Table(
    "annotations", metadata,
    Column("annotation_id", Integer, primary_key=True, autoincrement=False),  # Label Studio's id
    Column("task_id", Integer, nullable=False),
    conversation_id_column(nullable=False),
    Column("turn_index", Integer, nullable=True),
    rater_id_column(nullable=True),
    Column("updated_at", String(64), nullable=False),  # Label Studio's updated_at, ISO text, compared as is
    Column("expectation", String(32), nullable=True),
    Column("comment", Text, nullable=True),
    Column("deleted", Boolean, nullable=False, default=False),
    Column("author_id", Integer, nullable=True),  # Label Studio user id of whoever wrote it (completed_by)
    # Why this annotation is not attributed to any rater (author not a known rater, not the task's rater):
    # kept, listed and counted, but never trained on and never turned into traits.
    Column("quarantine", String(300), nullable=True),
    Column("lead_time", Float, nullable=True),      # seconds the rater spent on the task: what counts (see held)
    Column("created_at", String(64), nullable=True),  # when Label Studio first had it, ISO text
    # The task key of the turn this annotation rates again (a test-retest repeat, sense7.store.study_design): kept
    # for rater quality, never trained on and never counted as a second rating of the turn.
    Column("repeat_of", String(300), nullable=True),
    # A version Label Studio holds that is not counted as the rater's (issue 23): written there, not by the
    # rater page, and not accepted (`sense7 ratings accept`). {"rater_id" (the rater it claims), "values",
    # "expectation", "comment", "lead_time", "cancelled", "author" (None: the rater's account; else whom a
    # re-assigned completed_by names), "changed_by", "reason"} (issue 37: lead_time, cancelled and author
    # too); the ratings rows and lead_time keep what counts (the delivered version), or the annotation is
    # quarantined when nothing of the rater's stands behind it.
    Column("held", JSON(none_as_null=True), nullable=True),
)

# Every change of a synced rating, oldest first: who (Label Studio user id), when, the state before and
# after ({"values", "expectation", "comment", "rater_id", "quarantine", "author_id", "held", "lead_time"};
# None = did not exist / deleted).
rating_history = Table(
    "rating_history", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("annotation_id", Integer, nullable=False, index=True),
    Column("task_id", Integer, nullable=True),
    Column("change", String(16), nullable=False),  # created, updated, deleted
    Column("changed_by", Integer, nullable=True),
    timestamp_column("changed_at", nullable=False),
    Column("ls_updated_at", String(64), nullable=True),
    Column("old", JSON, nullable=True),
    Column("new", JSON, nullable=True),
    # Who wrote the change: "rater page" (a delivered submission stands behind it), "label studio" (staff,
    # or anyone with a Label Studio account: changed_by is that user), "sense7 ratings accept".
    Column("via", String(32), nullable=True),
)

# Label Studio versions staff accepted as the rater's own (`sense7 ratings accept`): the sync counts an
# annotation whose result equals one of these, as it counts one a rater-page submission stands behind.
accepted_versions = Table(
    "accepted_versions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("annotation_id", Integer, nullable=False, index=True),
    rater_id_column(nullable=False),
    Column("version", JSON, nullable=False),  # {"values", "expectation", "comment", "lead_time", "cancelled", "author"}
    timestamp_column("accepted_at", nullable=False),
    Column("actor", String(200), nullable=False),
)

ratings = Table(
    "ratings", metadata,
    Column("annotation_id", Integer, primary_key=True, autoincrement=False),
    Column("control", String(100), primary_key=True),
    Column("value", Integer, nullable=False),
)

# Ratings collected before or outside Label Studio (a pilot study, an earlier batch): kept apart from
# synced annotations so that reconciling with Label Studio can never delete them.
imported_ratings = Table(
    "imported_ratings", metadata,
    conversation_id_column(primary_key=True),
    Column("turn_index", Integer, primary_key=True),  # -1 = a rating of the whole conversation
    rater_id_column(primary_key=True),
    Column("dimension", String(100), primary_key=True),
    Column("rating", Integer, nullable=False),
)

# Explicit staff entries (ratings imported for raters, reverted changes): who ran what, when.
staff_log = Table(
    "staff_log", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    timestamp_column("at", nullable=False),
    Column("actor", String(200), nullable=False),  # the operating-system user who ran the command
    Column("action", String(100), nullable=False),
    Column("detail", JSON, nullable=False),        # counts, file names, ids: never traits or texts
)

# -- the rater page (sense7.store.rater_page_tables): private links, each rater's queue, submissions to deliver
# One private link per rater: only a SHA-256 of its secret is kept (the secret is 256 random bits, so a
# plain hash is as good as a slow one and lets a link be looked up in one indexed read).
rater_links = Table(
    "rater_links", metadata,
    rater_id_column(primary_key=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    timestamp_column("created_at", nullable=False),
    timestamp_column("revoked_at", nullable=True),
)

# A copy of each rater's Label Studio tasks (refreshed from Label Studio when the rater opens the link),
# so that every page is answered from the store and never reveals a task that is not on this list.
rater_tasks = Table(
    "rater_tasks", metadata,
    Column("task_id", Integer, primary_key=True, autoincrement=False),  # Label Studio's id
    rater_id_column(nullable=False, index=True),
    Column("kind", String(16), nullable=False),         # rating | profile
    Column("position", Integer, nullable=False),        # order in the rater's queue (profile: -1)
    conversation_id_column(nullable=True),
    Column("turn_index", Integer, nullable=True),
    Column("data", JSON, nullable=False),               # what the page shows: history, turn
    Column("prediction", JSON, nullable=True),          # {"version", "values": {control: level}}
    Column("answer", JSON, nullable=True),              # the rater's latest answer known to Label Studio
)

# Tasks the rater page shows before Label Studio has them (a crowd participant's questionnaire, written at the
# comprehension check: sense7.store.rater_page_tables.RaterQueue.provide), so that the first page never waits
# for the worker's round. The queue and the outbox hold such a task under the provisional id -id until the
# round's queue copy finds the task in Label Studio by its key: `task_id` is then Label Studio's, and the rows
# that held -id hold it instead (one transaction). Kept afterwards, so a form opened before that still lands.
provisional_tasks = Table(
    "provisional_tasks", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    rater_id_column(nullable=False, index=True),
    Column("task_key", String(400), nullable=False, unique=True),
    Column("task_id", Integer, nullable=True),  # Label Studio's, once its task exists
    timestamp_column("made_at", nullable=False),
)

# Every submission from the rater page, kept until (and after) Label Studio has it: the durable outbox.
# key = rater:kind:task:revision, so a form posted twice is stored once and delivered once.
submissions = Table(
    "submissions", metadata,
    Column("key", String(300), primary_key=True),
    rater_id_column(nullable=False, index=True),
    Column("kind", String(16), nullable=False),
    Column("task_id", Integer, nullable=False, index=True),
    Column("revision", Integer, nullable=False),
    Column("result", JSON, nullable=False),             # Label Studio result list
    Column("answer", JSON, nullable=False),             # the same, as the page's form values
    Column("lead_time", Float, nullable=True),          # seconds the rater spent on the page
    timestamp_column("submitted_at", nullable=False),
    timestamp_column("delivered_at", nullable=True),
    Column("annotation_id", Integer, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("last_error", String(300), nullable=True),
)

# -- the study's design (sense7.store.study_design): the pre-fill arm every task drew, and every prediction made
# before its rater saw the task (shown or not), so that anchoring and live accuracy can be measured.
task_arms = Table(
    "task_arms", metadata,
    Column("task_key", String(400), primary_key=True),
    conversation_id_column(nullable=False),
    Column("turn_index", Integer, nullable=False),
    rater_id_column(nullable=False, index=True),
    Column("arm", String(16), nullable=False),           # shown | hidden
    Column("policy", String(16), nullable=False),        # shown | hidden | randomized
    Column("shown_share", Float, nullable=False),
    Column("seed", String(64), nullable=False),
    Column("repeat_of", String(400), nullable=True),     # a test-retest repeat of this task key
    timestamp_column("drawn_at", nullable=False),
)

recorded_predictions = Table(
    "recorded_predictions", metadata,
    Column("task_key", String(400), primary_key=True),
    Column("version", String(100), primary_key=True),
    rater_id_column(nullable=False, index=True),
    conversation_id_column(nullable=False),
    Column("turn_index", Integer, nullable=False),
    Column("arm", String(16), nullable=False),
    Column("kind", String(16), nullable=False),          # personalized | traits | generic | live
    Column("levels", JSON, nullable=False),              # {control: most likely level} (what is shown)
    Column("expected", JSON, nullable=False),            # {control: expected rating}
    Column("generic_levels", JSON, nullable=False),      # the generic model's, for the same task
    Column("generic_expected", JSON, nullable=False),
    timestamp_column("recorded_at", nullable=False),
    # kind live (the rater page, version "<served>+live"): how many of the rater's own answers moved it.
    Column("own_ratings", Integer, nullable=True),
    # A model with a cached text encoder (sense7.model.vector_cache): "embedded" (its texts' vectors were read)
    # or "lexical" (not embedded within the request's budget: the n-grams and context answered); None: no encoder.
    Column("text_vectors", String(16), nullable=True),
)

# Study-wide values drawn once and kept (the pre-fill seed when SENSE7_PREFILL_SEED is not given).
study_values = Table(
    "study_values", metadata,
    Column("name", String(100), primary_key=True),
    Column("value", String(300), nullable=False),
)

# Answers to the taxonomy's instructed-response items (attention checks) on the rater page: kept here only
# (never in Label Studio, never trained on), the latest answer per (rater, task).
instructed_answers = Table(
    "instructed_answers", metadata,
    rater_id_column(primary_key=True),
    Column("task_id", Integer, primary_key=True, autoincrement=False),
    Column("item", String(100), nullable=False),
    Column("answered", Integer, nullable=False),
    Column("expected", Integer, nullable=False),
    timestamp_column("answered_at", nullable=False),
)

# -- participants' rights (sense7.privacy.participation) ------------------------------------------------
# Each participant's choice per conversation of theirs, made on the rater page before (or while) rating:
# out of the study (not rated, not trained on, not released) and/or out of a release (rated, not released).
# The latest choice and when it was made; changeable at any time (docs/guides/raters.md, "Participants' rights").
conversation_choices = Table(
    "conversation_choices", metadata,
    rater_id_column(primary_key=True),
    conversation_id_column(primary_key=True),
    Column("in_study", Boolean, nullable=False),
    Column("in_release", Boolean, nullable=False),
    timestamp_column("chosen_at", nullable=False),
)

# Withdrawals: requested (the rater page's button or `sense7 raters withdraw`), then erased. While pending,
# rater_id says whom to erase; the erasure's last transaction sets it to NULL, so what remains is a receipt
# without personal data: who asked (participant | the staff user), when, when erased, counts.
withdrawals = Table(
    "withdrawals", metadata,
    Column("receipt", String(32), primary_key=True),      # random, names nobody
    rater_id_column(nullable=True, unique=True),
    Column("requested_by", String(200), nullable=False),  # "participant" or the staff user who ran the command
    timestamp_column("requested_at", nullable=False),
    Column("confirmed_by", String(200), nullable=True),
    timestamp_column("erased_at", nullable=True),
    Column("counts", JSON, nullable=True),                # rows deleted per table, Label Studio objects deleted
    Column("model_versions", JSON, nullable=True),        # versions trained on their data, removed once replaced
    Column("retrain", String(300), nullable=True),        # the retrain job queued, or why it was not
)

# -- crowd studies (sense7.crowd): strangers from a recruitment platform, under pseudonymous rater ids ------
# A study as `sense7 crowd init` stored it (the validated study file, the consent text and its hash).
crowd_studies = Table(
    "crowd_studies", metadata,
    study_id_column(primary_key=True),
    Column("config", JSON, nullable=False),
    Column("is_open", Boolean, nullable=False, default=False),
    timestamp_column("updated_at", nullable=False),
)

# The study's pool: which conversations want K raters each (texts live in `conversations`).
crowd_pool = Table(
    "crowd_pool", metadata,
    study_id_column(primary_key=True),
    conversation_id_column(primary_key=True),
    Column("turns", Integer, nullable=False),
    Column("context", JSON, nullable=False),
)

# One row per participant, keyed by the pseudonymous rater id (a keyed hash of the platform id): never the
# platform id itself. `seat` (unique per study, 0..cap-1) is how the participant cap is enforced atomically:
# taken when the comprehension check is passed (two participants racing for the last seat cannot both set
# it), NULL before that and again once the participant ends without completing.
crowd_participants = Table(
    "crowd_participants", metadata,
    rater_id_column(primary_key=True),
    study_id_column(nullable=False, index=True),
    Column("state", String(20), nullable=False),   # declined | checking | rating | completed | screened_out |
    Column("seat", Integer, nullable=True),        # abandoned | full | withdrawn
    Column("consent", String(10), nullable=False),  # agreed | declined
    Column("consent_version", String(64), nullable=False),  # sha256 of the consent text
    timestamp_column("consent_at", nullable=False),
    Column("resume_hash", String(64), nullable=True, unique=True),
    Column("check_attempts", Integer, nullable=False, default=0),
    timestamp_column("lease_until", nullable=True),  # checking: the reservation; rating: the lease
    timestamp_column("ended_at", nullable=True),
    UniqueConstraint("study_id", "seat"),
)

# Overlap control: one row per (conversation, slot) taken, slot in 0..K-1, so the primary key itself
# refuses a K+1-th rater and a second taker of the same slot (compare-and-set, sense7.crowd.assignment).
crowd_slots = Table(
    "crowd_slots", metadata,
    study_id_column(primary_key=True),
    conversation_id_column(primary_key=True),
    Column("slot", Integer, primary_key=True, autoincrement=False),
    rater_id_column(nullable=False, index=True),
    timestamp_column("taken_at", nullable=False),
    timestamp_column("done_at", nullable=True),
    UniqueConstraint("study_id", "conversation_id", "rater_id"),
)

# Slots given back (a lease expired, a participant abandoned): counted by `sense7 status`.
crowd_released = Table(
    "crowd_released", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    study_id_column(nullable=False, index=True),
    conversation_id_column(nullable=False),
    rater_id_column(nullable=False),
    timestamp_column("released_at", nullable=False),
    timestamp_column("tasks_cleared_at", nullable=True),  # its unanswered Label Studio tasks deleted
)

# The ONLY table holding platform ids: what the study team needs to approve payments
# (`sense7 crowd completions`, written 0600). Nothing else in sense7 stores or logs them.
crowd_completions = Table(
    "crowd_completions", metadata,
    rater_id_column(primary_key=True),
    study_id_column(nullable=False, index=True),
    Column("platform_id", String(100), nullable=False),
    Column("platform_study", String(100), nullable=True),
    Column("platform_session", String(100), nullable=True),
    Column("outcome", String(20), nullable=False),  # entered | completed | screened_out | abandoned | full |
                                                    # declined | withdrawn
    timestamp_column("entered_at", nullable=False),
    timestamp_column("ended_at", nullable=True),
)

# What an erasure keeps of a withdrawn crowd participant: the SHA-256 of their pseudonymous id (itself a keyed
# hash of the platform id), nothing else, so that the same platform id is never seated again (a withdrawal
# is final). It names nobody without both the study's secret and the platform id.
crowd_withdrawn = Table(
    "crowd_withdrawn", metadata,
    study_id_column(primary_key=True),
    Column("id_hash", String(64), primary_key=True),
)

# The model registry (sense7.model.registry, rows owned by sense7.store.model_versions): every trained version's
# bundle as one blob (a tar of the bundle's files) with its SHA-256, and the pointer to the served version, so
# that processes on other hosts (ML backend, worker, rater page) share versions through the store, not a folder.
model_versions = Table(
    "model_versions", metadata,
    Column("name", String(64), primary_key=True),
    Column("created_at", Float, nullable=False),  # seconds since the epoch (ModelVersion.created_at)
    Column("metrics", JSON, nullable=False),
    Column("sha256", String(64), nullable=False),  # of `bundle`: the key of every process's local cache
    Column("size", BigInteger, nullable=False),
    Column("bundle", LargeBinary, nullable=False),
)

# One row (id 1): the served version; `serial` grows by one at every promotion, so a process that saw
# (version, serial) knows whether anything was promoted since, even the same version again.
model_pointer = Table(
    "model_pointer", metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", String(64), nullable=False),
    Column("serial", Integer, nullable=False),
    Column("promoted_at", DateTime(timezone=True), nullable=False),
)


def withdrawn_id_hash(rater_id: str) -> str:
    """What `crowd_withdrawn` keeps of an erased crowd participant: the SHA-256 of their pseudonymous id."""
    return hashlib.sha256(rater_id.encode()).hexdigest()

# Text vectors (sense7.model.vector_cache, rows owned by sense7.store.text_vectors): a text encoder's vector of
# each distinct text, computed once and read by every process (ML backend, worker, rater page, retraining). Keyed
# by the encoder's key (its class, parameters and weights' hash: a changed encoder never reads another's
# vectors) and the SHA-256 of the text's UTF-8 bytes; the vector as raw little-endian bytes of `dtype`. Derived
# from the texts only (no rater, no rating); erased with the conversations of a withdrawn rater
# (sense7.privacy.participation.ERASURE: by the hashes of the conversation's texts).
text_vectors = Table(
    "text_vectors", metadata,
    Column("encoder_key", String(64), primary_key=True),
    Column("text_sha256", String(64), primary_key=True),
    Column("dtype", String(8), nullable=False),        # float16 | float32
    Column("dimension", Integer, nullable=False),
    Column("vector", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),       # seconds since the epoch
)
