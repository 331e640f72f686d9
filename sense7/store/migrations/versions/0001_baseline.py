"""Revision 0001, the baseline: the store's schema of 2026-11-28 (every table of `sense7.store.tables` then).

A fresh store gets every table here. A store made before sense7 had migrations (no `alembic_version` table)
keeps its rows: the tables it lacks are created and the columns that code added to older stores by hand
(`ADDED_BEFORE_MIGRATIONS`, the old `Store._ADDED_COLUMNS`) are added; nothing is dropped or rewritten.

The schema is frozen here, not imported from `sense7.store.tables`: a later revision changes the tables, and this
file must still build the store as it was on that day.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Columns added to existing tables before migrations existed, (table, column, type; all nullable) in the order
# they were added: a store from before one of them lacks it (and every later one).
ADDED_BEFORE_MIGRATIONS = (
    ("annotations", "author_id", sa.Integer()),
    ("annotations", "quarantine", sa.String(length=300)),
    ("annotations", "lead_time", sa.Float()),
    ("annotations", "created_at", sa.String(length=64)),
    ("annotations", "repeat_of", sa.String(length=300)),
    ("recorded_predictions", "own_ratings", sa.Integer()),
    ("annotations", "held", sa.JSON(none_as_null=True)),
    ("rating_history", "via", sa.String(length=32)),
    ("crowd_released", "tasks_cleared_at", sa.DateTime(timezone=True)),
)


def baseline_schema() -> sa.MetaData:
    """The 25 tables as they stood at this revision (rendered by Alembic from sense7.store.tables)."""
    schema = sa.MetaData()
    sa.Table("accepted_versions", schema,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("annotation_id", sa.Integer(), nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("version", sa.JSON(), nullable=False),
        sa.Column("accepted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("id")
    )
    sa.Index("ix_accepted_versions_annotation_id", schema.tables["accepted_versions"].c["annotation_id"])
    sa.Table("annotations", schema,
        sa.Column("annotation_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=True),
        sa.Column("rater_id", sa.String(length=200), nullable=True),
        sa.Column("updated_at", sa.String(length=64), nullable=False),
        sa.Column("expectation", sa.String(length=32), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("deleted", sa.Boolean(), nullable=False),
        sa.Column("author_id", sa.Integer(), nullable=True),
        sa.Column("quarantine", sa.String(length=300), nullable=True),
        sa.Column("lead_time", sa.Float(), nullable=True),
        sa.Column("created_at", sa.String(length=64), nullable=True),
        sa.Column("repeat_of", sa.String(length=300), nullable=True),
        sa.Column("held", sa.JSON(none_as_null=True), nullable=True),
        sa.PrimaryKeyConstraint("annotation_id")
    )
    sa.Table("contexts", schema,
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "rater_id")
    )
    sa.Table("conversation_choices", schema,
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("in_study", sa.Boolean(), nullable=False),
        sa.Column("in_release", sa.Boolean(), nullable=False),
        sa.Column("chosen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("rater_id", "conversation_id")
    )
    sa.Table("conversations", schema,
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("messages", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id")
    )
    sa.Table("crowd_completions", schema,
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("study_id", sa.String(length=100), nullable=False),
        sa.Column("platform_id", sa.String(length=100), nullable=False),
        sa.Column("platform_study", sa.String(length=100), nullable=True),
        sa.Column("platform_session", sa.String(length=100), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("entered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("rater_id")
    )
    sa.Index("ix_crowd_completions_study_id", schema.tables["crowd_completions"].c["study_id"])
    sa.Table("crowd_participants", schema,
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("study_id", sa.String(length=100), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("seat", sa.Integer(), nullable=True),
        sa.Column("consent", sa.String(length=10), nullable=False),
        sa.Column("consent_version", sa.String(length=64), nullable=False),
        sa.Column("consent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resume_hash", sa.String(length=64), nullable=True),
        sa.Column("check_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("rater_id"),
        sa.UniqueConstraint("resume_hash"),
        sa.UniqueConstraint("study_id", "seat")
    )
    sa.Index("ix_crowd_participants_study_id", schema.tables["crowd_participants"].c["study_id"])
    sa.Table("crowd_pool", schema,
        sa.Column("study_id", sa.String(length=100), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("turns", sa.Integer(), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("study_id", "conversation_id")
    )
    sa.Table("crowd_released", schema,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("study_id", sa.String(length=100), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tasks_cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id")
    )
    sa.Index("ix_crowd_released_study_id", schema.tables["crowd_released"].c["study_id"])
    sa.Table("crowd_slots", schema,
        sa.Column("study_id", sa.String(length=100), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("slot", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("study_id", "conversation_id", "slot"),
        sa.UniqueConstraint("study_id", "conversation_id", "rater_id")
    )
    sa.Index("ix_crowd_slots_rater_id", schema.tables["crowd_slots"].c["rater_id"])
    sa.Table("crowd_studies", schema,
        sa.Column("study_id", sa.String(length=100), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("is_open", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("study_id")
    )
    sa.Table("crowd_withdrawn", schema,
        sa.Column("study_id", sa.String(length=100), nullable=False),
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("study_id", "id_hash")
    )
    sa.Table("imported_ratings", schema,
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("dimension", sa.String(length=100), nullable=False),
        sa.Column("rating", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "turn_index", "rater_id", "dimension")
    )
    sa.Table("instructed_answers", schema,
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("item", sa.String(length=100), nullable=False),
        sa.Column("answered", sa.Integer(), nullable=False),
        sa.Column("expected", sa.Integer(), nullable=False),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("rater_id", "task_id")
    )
    sa.Table("rater_links", schema,
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("rater_id"),
        sa.UniqueConstraint("token_hash")
    )
    sa.Table("rater_tasks", schema,
        sa.Column("task_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=True),
        sa.Column("turn_index", sa.Integer(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("prediction", sa.JSON(), nullable=True),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("task_id")
    )
    sa.Index("ix_rater_tasks_rater_id", schema.tables["rater_tasks"].c["rater_id"])
    sa.Table("raters", schema,
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=True),
        sa.Column("traits", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("rater_id"),
        sa.UniqueConstraint("email")
    )
    sa.Table("rating_history", schema,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("annotation_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("change", sa.String(length=16), nullable=False),
        sa.Column("changed_by", sa.Integer(), nullable=True),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ls_updated_at", sa.String(length=64), nullable=True),
        sa.Column("old", sa.JSON(), nullable=True),
        sa.Column("new", sa.JSON(), nullable=True),
        sa.Column("via", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id")
    )
    sa.Index("ix_rating_history_annotation_id", schema.tables["rating_history"].c["annotation_id"])
    sa.Table("ratings", schema,
        sa.Column("annotation_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("control", sa.String(length=100), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("annotation_id", "control")
    )
    sa.Table("recorded_predictions", schema,
        sa.Column("task_key", sa.String(length=400), nullable=False),
        sa.Column("version", sa.String(length=100), nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("arm", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("levels", sa.JSON(), nullable=False),
        sa.Column("expected", sa.JSON(), nullable=False),
        sa.Column("generic_levels", sa.JSON(), nullable=False),
        sa.Column("generic_expected", sa.JSON(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("own_ratings", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("task_key", "version")
    )
    sa.Index("ix_recorded_predictions_rater_id", schema.tables["recorded_predictions"].c["rater_id"])
    sa.Table("staff_log", schema,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=100), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id")
    )
    sa.Table("study_values", schema,
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("value", sa.String(length=300), nullable=False),
        sa.PrimaryKeyConstraint("name")
    )
    sa.Table("submissions", schema,
        sa.Column("key", sa.String(length=300), nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("answer", sa.JSON(), nullable=False),
        sa.Column("lead_time", sa.Float(), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("annotation_id", sa.Integer(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.String(length=300), nullable=True),
        sa.PrimaryKeyConstraint("key")
    )
    sa.Index("ix_submissions_rater_id", schema.tables["submissions"].c["rater_id"])
    sa.Index("ix_submissions_task_id", schema.tables["submissions"].c["task_id"])
    sa.Table("task_arms", schema,
        sa.Column("task_key", sa.String(length=400), nullable=False),
        sa.Column("conversation_id", sa.String(length=200), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=False),
        sa.Column("arm", sa.String(length=16), nullable=False),
        sa.Column("policy", sa.String(length=16), nullable=False),
        sa.Column("shown_share", sa.Float(), nullable=False),
        sa.Column("seed", sa.String(length=64), nullable=False),
        sa.Column("repeat_of", sa.String(length=400), nullable=True),
        sa.Column("drawn_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task_key")
    )
    sa.Index("ix_task_arms_rater_id", schema.tables["task_arms"].c["rater_id"])
    sa.Table("withdrawals", schema,
        sa.Column("receipt", sa.String(length=32), nullable=False),
        sa.Column("rater_id", sa.String(length=200), nullable=True),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("confirmed_by", sa.String(length=200), nullable=True),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("counts", sa.JSON(), nullable=True),
        sa.Column("model_versions", sa.JSON(), nullable=True),
        sa.Column("retrain", sa.String(length=300), nullable=True),
        sa.PrimaryKeyConstraint("receipt"),
        sa.UniqueConstraint("rater_id")
    )
    return schema


def upgrade() -> None:
    bind = op.get_bind()
    present = set(sa.inspect(bind).get_table_names())
    schema = baseline_schema()
    missing = [table for table in schema.sorted_tables if table.name not in present]
    schema.create_all(bind, tables=missing)  # their indexes too
    inspector = sa.inspect(bind)
    for table, name, sql_type in ADDED_BEFORE_MIGRATIONS:
        if table in present and name not in {c["name"] for c in inspector.get_columns(table)}:
            op.add_column(table, sa.Column(name, sql_type, nullable=True))


def downgrade() -> None:
    raise NotImplementedError("revision 0001 is the baseline: below it there is no store (restore a backup instead)")
